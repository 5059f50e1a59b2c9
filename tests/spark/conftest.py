"""One Spark standalone cluster and one SparkSession on it for every Spark test of the run.

The cluster (a master and two workers from pyspark's launch classes,
mqcore.spark.cluster) and the session (mqcore.spark.session: the quiet, fast
settings of shared/notes/pyspark.md, scratch folders under pytest's temp dir) cost
30-60 s to start on a loaded 2-core machine, so both are session-scoped and shared
by every Spark test module; tests that need a driver of their own (crash, flights
example) submit it to the same cluster.

Without pyspark, pyarrow or Java 17 a Spark test is skipped with the reason;
under ``CI=true`` (where the Spark suite must run) it fails instead, as the
``faults`` tests do.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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


#: Folder names Spark (and the flights example) would leave in /tmp if their scratch dirs were not redirected.
TMP_LEFTOVERS = re.compile(r"^(spark-|blockmgr-|artifacts-|mq-flights-)")


def tmp_leftovers() -> set[str]:
    """The entries of the system temp folder that look like Spark's or the flights example's scratch folders."""
    return {name for name in os.listdir(tempfile.gettempdir()) if TMP_LEFTOVERS.match(name)}


@pytest.fixture(scope="session")
def leftovers() -> Callable[[], set[str]]:
    """:func:`tmp_leftovers` (for tests)."""
    return tmp_leftovers


@pytest.fixture(scope="session")
def tmp_baseline() -> set[str]:
    """:func:`tmp_leftovers` before the run's first Spark process started (other runs' leftovers)."""
    return tmp_leftovers()


#: The nice value of the Spark drivers' own scheduling groups in a parallel run (root only: see below).
DRIVER_NICE = -10


def _parallel_run() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def _favour_spark_in_a_parallel_run() -> None:
    """In a parallel run (pytest-xdist), run this worker and the Spark processes it starts at nice -5.

    Spark waits a hard-coded 10 s for each Python worker it starts to connect back, and fails the
    query with "Python worker failed to connect back" if it does not; with the other workers' daemons
    saturating a 2-core machine, a Python start has taken longer. The JVMs, the Python workers they
    fork and the crash/example subprocesses inherit the niceness. Lowering it needs root
    (CAP_SYS_NICE, as in CI); without it, nothing changes.

    On Linux with autogroup scheduling a process's nice value counts only within its session, and
    this worker shares one with the whole suite (its other workers and every daemon they start): so
    the drivers also run in sessions of their own at :data:`DRIVER_NICE` (:func:`driver_nice`,
    :func:`favour_driver`; docs/performance.md, "Spark (issue 17, stop 14)").
    """
    if _parallel_run():
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, -5)


def driver_nice() -> int | None:
    """``spark_session(driver_nice=...)`` for the run's drivers: :data:`DRIVER_NICE` in a parallel run, else None."""
    return DRIVER_NICE if _parallel_run() else None


@pytest.fixture(scope="session")
def favour_driver() -> Callable[[int], None]:
    """Give the session of a driver subprocess started with ``start_new_session=True`` :func:`driver_nice`.

    For the crash test's driver and the flights example: their JVMs and the Python workers those
    start inherit the session, so Spark's 10 s for a driver-side Python worker to connect back
    is spent at that priority (mqcore.spark.session.set_session_nice; no-op without root).
    """
    from mqcore.spark.session import set_session_nice

    def favour(pid: int) -> None:
        nice = driver_nice()
        if nice is not None:
            set_session_nice(pid, nice)

    return favour


#: Where the class-data-sharing archives of Spark's classes are kept between runs (one per Java, pyspark and options).
CDS_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mq" / "spark-cds"

#: The run that makes the archive: a local session that loads what the tests' JVMs load (a shuffle, the mq
#: format's batch read and an availableNow stream), then exits, so the JVM writes every class it loaded.
_CDS_DUMP = """
import sys
from pathlib import Path
from mqcore.client import LocalClient
from mqcore.spark.session import spark_session

work, archive = Path(sys.argv[1]), sys.argv[2]
option = {"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={archive}"}
spark = spark_session("local[1]", work, app_name="mq-cds", extra=option, quick_jvm=True)
spark.range(100).selectExpr("id % 7 AS k").groupBy("k").count().collect()
root = work / "root"
root.mkdir()
with LocalClient(str(root)) as client:
    client.create_queue("q")
    client.send_batch("q", [f"m{i}" for i in range(20)])
assert len(spark.read.format("mq").options(root=str(root), queue="q").load().collect()) == 20
stream = spark.readStream.format("mq").options(root=str(root), queue="q").load()
query = stream.writeStream.format("memory").queryName("q").option("checkpointLocation", str(work / "checkpoint"))
query = query.trigger(availableNow=True).start()
query.awaitTermination(300)
spark.stop()
"""


#: Archives in :data:`CDS_CACHE` not used for this many days are deleted (~170 MB each; one per venv, Java and pyspark).
CDS_KEEP_DAYS = 7


def prune_archives(keep: Path, *, now: float | None = None) -> list[Path]:
    """Mark ``keep`` used now, and delete the other archives in its folder not used for :data:`CDS_KEEP_DAYS` days.

    "Used" is the file's modification time, set to now on every use (:func:`spark_java_options` calls this for
    the archive a run maps; a JVM does not check its archive's own times, only the jars'): so an archive of a venv
    that was deleted or of a pyspark or Java since upgraded ages out a week after its last run. Leftovers of an
    interrupted making run (``spark-*.jsa.<pid>.tmp``) go by the same rule. Errors (a file another user owns,
    one gone meanwhile) are ignored: pruning never fails a run.

    Args:
        keep: The archive in use (it may not exist yet); its folder is the one pruned.
        now: The current time (epoch seconds; tests); :func:`time.time` if None.
    Returns:
        The files deleted.
    """
    now = time.time() if now is None else now
    with contextlib.suppress(OSError):
        os.utime(keep, (now, now))
    removed = []
    for path in keep.parent.glob("spark-*.jsa*"):
        if path == keep or not (path.suffix == ".jsa" or path.name.endswith(".tmp")):
            continue
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > CDS_KEEP_DAYS * 86400:
                path.unlink()
                removed.append(path)
    return removed


def _cds_key(java_options: str) -> str:
    """What an archive depends on: the Java build, the installed pyspark's jars, and the JVM options."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or "java"
    version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(f"{p.name}:{p.stat().st_size}" for p in jars.iterdir())
    text = "\n".join([version, str(jars), java_options, *listing])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def spark_java_options(work: Path) -> str:
    """QUICK_JAVA_OPTIONS plus ``-XX:SharedArchiveFile`` of an archive of Spark's classes, made once and cached.

    Every Spark JVM of the run (master, workers, drivers, executors: ~14) loads and verifies the same ~10,000
    classes of Spark's jars at start; with the classes in a dynamic class-data-sharing archive (JDK 13+,
    ``-XX:ArchiveClassesAtExit``) they are mapped instead: a local session's JVM spent 9.6 CPU-s instead of 18.5-20.5
    on a start and two small jobs (docs/performance.md, "Spark's tests: Spark's classes from a shared archive").
    The archive is made by one local session (~45 CPU-s) the first time, in :data:`CDS_CACHE` (~170 MB; one per
    venv, as the jars' path is part of the classpath), and reused while the Java build,
    pyspark's jars and the options are the same. A JVM whose classpath or build does not match the archive ignores
    it (``-Xshare:auto``, the default); if the archive cannot be made, the JVMs run without one. Each call marks the
    archive used and deletes the folder's archives unused for :data:`CDS_KEEP_DAYS` days (:func:`prune_archives`).

    Args:
        work: A scratch folder for the archive-making session (created).
    """
    from mqcore.spark.session import QUICK_JAVA_OPTIONS

    archive = CDS_CACHE / f"spark-{_cds_key(QUICK_JAVA_OPTIONS)}.jsa"
    prune_archives(archive)
    if not archive.exists():
        CDS_CACHE.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
        work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(work), "PYSPARK_PYTHON": sys.executable}
        try:
            subprocess.run(
                [sys.executable, "-c", _CDS_DUMP, str(work), str(partial)],
                env=env,
                capture_output=True,
                timeout=600,
                check=True,
            )
            os.replace(partial, archive)
        except (OSError, subprocess.SubprocessError):
            with contextlib.suppress(OSError):
                partial.unlink()
            return QUICK_JAVA_OPTIONS
    return f"{QUICK_JAVA_OPTIONS} -XX:SharedArchiveFile={archive}"


def spark_jvm_options_here() -> str:
    """:func:`spark_java_options` where Spark can run (its archive made in a temporary folder if missing), else "".

    ``scripts/test.sh`` calls it beside mypy, so that the archive exists before the Spark tests' first set-up.
    """
    if _missing() is not None:
        return ""
    with tempfile.TemporaryDirectory(prefix="mq-cds-work-") as work:
        return spark_java_options(Path(work) / "session")


@pytest.fixture(scope="session")
def spark_jvm_options() -> str:
    """:func:`spark_jvm_options_here` for every Spark JVM of the run (cluster, sessions, crash job, flights example)."""
    return spark_jvm_options_here()


@pytest.fixture(scope="session")
def spark_cluster(
    tmp_baseline: set[str], tmp_path_factory: pytest.TempPathFactory, spark_jvm_options: str
) -> Iterator[Any]:
    """The run's Spark standalone cluster: a master and two workers on 127.0.0.1 (mqcore.spark.cluster).

    Each worker offers 2 cores and 2 GB; an app takes 2 cores (one executor per worker), so the
    run's shared session and one job it starts in a subprocess (crash test, flights example)
    fit at once. The JVMs run with :func:`spark_jvm_options` (C1 only, serial GC, Spark's classes from a shared
    archive: much less CPU spent starting and warming up on a 2-core machine). Every process is killed by process
    group and tree at the end.
    """
    reason = _missing()
    if reason is not None:
        spark_unavailable(reason)
    from mqcore.spark.cluster import StandaloneCluster

    _favour_spark_in_a_parallel_run()
    work = tmp_path_factory.mktemp("spark-cluster")
    with StandaloneCluster(work, workers=2, cores=2, memory="2g", java_options=spark_jvm_options) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark(spark_cluster: Any, tmp_path_factory: pytest.TempPathFactory, spark_jvm_options: str) -> Iterator[Any]:
    """The run's SparkSession on :func:`spark_cluster`, with the ``mq`` format registered.

    Its executors are separate JVMs with their own Python workers (they unpickle the source
    and reach the daemon or the root themselves). Tests must not stop it or change its
    confs; streaming queries they start must be stopped by them (or end, as ``availableNow``
    runs do).
    """
    from mqcore.spark.session import spark_session

    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        work = tmp_path_factory.mktemp("spark-driver")
        jvm = {f"spark.{side}.extraJavaOptions": spark_jvm_options for side in ("driver", "executor")}
        session = spark_session(spark_cluster.url, work, app_name="mq-tests", extra=jvm, driver_nice=driver_nice())
        yield session
        session.stop()
    finally:
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved
