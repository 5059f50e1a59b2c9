"""One local SparkSession for every Spark test of the run, with the ``mq`` data source registered.

The session is ``local[2]`` with the quiet, fast settings measured on this kind of
machine (shared/notes/pyspark.md): the driver bound to 127.0.0.1, no UI, no
console progress, 2 shuffle partitions, log level ERROR, and the workers running
this interpreter (``PYSPARK_PYTHON``) so they see the project's packages. Starting
it costs 6-11 s, so it is session-scoped and shared by every Spark test module.

Without pyspark, pyarrow or Java 17 a Spark test is skipped with the reason;
under ``CI=true`` (where the Spark suite must run) it fails instead, as the
``faults`` tests do.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

#: Environment the session needs: set for its lifetime, restored afterwards.
SPARK_ENV = {
    # The hostname lookup warning is printed before any conf applies: only the environment silences it.
    "SPARK_LOCAL_IP": "127.0.0.1",
    # Workers must run this interpreter (the venv with mqcore, pyarrow), not python3 from PATH.
    "PYSPARK_PYTHON": sys.executable,
}

#: Confs of the shared session (shared/notes/pyspark.md, "Fast, quiet start").
SPARK_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
}

#: Oldest Java Spark 4 runs on.
MIN_JAVA = 17


def spark_unavailable(reason: str) -> None:
    """Skip a Spark test locally; fail it under CI=true, where the Spark suite must run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"spark test cannot run under CI=true: {reason}")
    pytest.skip(reason)


def _java_version() -> int | None:
    """The major version of the ``java`` Spark would start (JAVA_HOME first), or None if there is none."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        return None
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def _missing() -> str | None:
    """Why Spark cannot run here, or None."""
    for module, extra in (("pyspark", "spark"), ("pyarrow", "spark")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[{extra}]')"
    version = _java_version()
    if version is None:
        return "java is not installed (Spark 4 needs Java 17 or later)"
    if version < MIN_JAVA:
        return f"java {version} is too old (Spark 4 needs Java {MIN_JAVA} or later)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's SparkSession (``local[2]``) with the ``mq`` format registered.

    Tests must not stop it or change its confs; streaming queries they start must be
    stopped by them (or end, as ``availableNow`` runs do).
    """
    reason = _missing()
    if reason is not None:
        spark_unavailable(reason)
    saved = {key: os.environ.get(key) for key in SPARK_ENV}
    os.environ.update(SPARK_ENV)
    try:
        with warnings.catch_warnings():
            # pyspark 4.3 warns once, on its first import of pyspark.testing (during session start),
            # that it does not fully support pandas >= 3 (installed here by the examples extra);
            # the data source does not use pandas. Only that warning is ignored, only here.
            warnings.filterwarnings(
                "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
            )
            from pyspark.sql import SparkSession

            import mqcore.spark

            builder = SparkSession.builder.master("local[2]").appName("mq-tests")
            for key, value in SPARK_CONF.items():
                builder = builder.config(key, value)
            session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        mqcore.spark.register(session)
        yield session
        session.stop()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
