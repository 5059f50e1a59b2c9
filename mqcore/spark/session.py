"""A SparkSession with the ``mq`` format, quiet and fast on a small machine, its scratch files in one folder.

One place for the settings the tests, the flights example and bench/spark.py share
(measured in shared/notes/pyspark.md, "Fast, quiet start"): the driver bound to
127.0.0.1, no UI, no console progress, 2 shuffle partitions, log level ERROR, the
Python workers running this interpreter (``PYSPARK_PYTHON``) so they import
``mqcore``. Every scratch folder Spark makes (``spark-*``, ``blockmgr-*``,
``artifacts-*``, the JVMs' ``java.io.tmpdir`` and the Python workers' ``TMPDIR``) goes
under ``work_dir`` instead of ``/tmp``, so a run leaves nothing behind there.

``master`` is ``local[N]`` (one JVM) or ``spark://host:port`` (a standalone cluster,
e.g. :class:`mqcore.spark.cluster.StandaloneCluster`): then each app takes at most
``spark.cores.max`` cores (one per executor), so several apps (a test session and a
job it starts) share the cluster instead of the first one taking every core.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Environment of the driver process (set by :func:`spark_session` unless already set).
#: SPARK_LOCAL_IP: the JVM's host-name warning prints before any conf applies, only this silences it.
SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1"}

#: Confs of every session (shared/notes/pyspark.md, "Fast, quiet start").
BASE_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
}

#: JVM options for short runs on a small machine (tests, examples): the C1 compiler only and the
#: serial collector, which spend far less CPU warming up than C2 and G1 (steady-state speed is lower:
#: not for benchmarks).
QUICK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: Confs added on a standalone cluster: one core per executor, two executors per app, small heaps.
CLUSTER_CONF = {
    "spark.cores.max": "2",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
}


def scratch_conf(work_dir: Path) -> dict[str, str]:
    """Confs that put Spark's scratch folders under ``work_dir`` (created here).

    ``spark.local.dir`` (block manager, shuffle files, ``spark-*`` of the driver; on a
    cluster the driver's ``java.io.tmpdir`` serves instead, see :func:`session_conf`),
    ``java.io.tmpdir`` of the driver and of the executors (``artifacts-*``, jar caches)
    and ``TMPDIR`` of the executors' Python workers. A standalone cluster's executors use
    their worker's local dirs (:class:`mqcore.spark.cluster.StandaloneCluster` puts them in
    its own folder).

    Args:
        work_dir: An existing or new folder; ``local/`` and ``tmp/`` are made in it.
    """
    local, tmp = work_dir / "local", work_dir / "tmp"
    local.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        "spark.local.dir": str(local),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmp}",
        "spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={tmp}",
        "spark.executorEnv.TMPDIR": str(tmp),
    }


def session_conf(
    master: str, work_dir: Path, extra: Mapping[str, str] | None = None, *, quick_jvm: bool = False
) -> dict[str, str]:
    """Every conf :func:`spark_session` sets: base, scratch, cluster (for ``spark://``) and ``extra`` last.

    ``extra`` values for ``spark.driver.extraJavaOptions`` / ``spark.executor.extraJavaOptions``
    are appended to the scratch options rather than replacing them; so are
    :data:`QUICK_JAVA_OPTIONS` with ``quick_jvm``.
    """
    conf = {**BASE_CONF, **scratch_conf(work_dir)}
    if quick_jvm:
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            conf[key] = f"{conf[key]} {QUICK_JAVA_OPTIONS}"
    if master.startswith("spark://"):
        conf.update(CLUSTER_CONF)
        # On a cluster Spark warns that spark.local.dir is the cluster manager's business; the
        # driver's local dirs then default to its java.io.tmpdir, which is under work_dir already.
        del conf["spark.local.dir"]
    for key, value in (extra or {}).items():
        if key.endswith(".extraJavaOptions") and key in conf:
            conf[key] = f"{conf[key]} {value}"
        else:
            conf[key] = value
    return conf


def spark_session(
    master: str,
    work_dir: Path,
    *,
    app_name: str = "mq",
    extra: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
    quick_jvm: bool = False,
    driver_nice: int | None = None,
) -> Any:
    """Start (or get) a SparkSession on ``master`` with ``mq`` registered and scratch files in ``work_dir``.

    Sets ``SPARK_LOCAL_IP`` unless set, and ``PYSPARK_PYTHON`` to this interpreter unless set
    (Python workers must import ``mqcore``). pyspark's warning about pandas 3 is ignored
    (the data source does not use pandas).

    Args:
        master: ``local[N]`` or ``spark://host:port``.
        work_dir: Folder for Spark's scratch files (see :func:`scratch_conf`).
        app_name: The application's name (the cluster's master shows it).
        extra: More confs (e.g. ``spark.driver.memory``), applied last.
        log_level: The driver's log level after start.
        quick_jvm: Start the driver's and executors' JVMs with :data:`QUICK_JAVA_OPTIONS` (short runs).
        driver_nice: If given, start the driver's JVM in a session of its own (see
            :func:`start_driver_jvm`) whose scheduling group gets this nice value (-20 to 19; a
            negative one needs root or CAP_SYS_NICE, and is silently not applied without it).
            Only when this process has not started a JVM yet.
    Returns:
        The ``pyspark.sql.SparkSession``.
    Raises:
        pyspark.errors.PySparkRuntimeError: The JVM did not start (no Java 17, ...).
    """
    for key, value in SPARK_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
        from pyspark.sql import SparkSession

        import mqcore.spark

        conf = {"spark.master": master, "spark.app.name": app_name}
        conf.update(session_conf(master, work_dir, extra, quick_jvm=quick_jvm))
        if driver_nice is not None:
            start_driver_jvm(conf, driver_nice)
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    mqcore.spark.register(spark)
    return spark


def start_driver_jvm(conf: Mapping[str, str], nice: int) -> int | None:
    """Start the driver's JVM (pyspark's gateway) in a session of its own, its scheduling group at ``nice``.

    Why: Spark gives each Python worker the driver starts for planning (the Python data
    source's planner, the streaming source's runner, a streaming sink's commit) a hard-coded
    10 s to start and connect back (``PythonWorkerFactory.createSimpleWorker``), and fails the
    query with "Python worker failed to connect back" otherwise. On Linux with autogroup
    scheduling (``/proc/sys/kernel/sched_autogroup_enabled``), CPU is shared between sessions
    first and between processes within a session second, so a driver in the session of a busy
    parent (a test runner with its daemons) gets a slice of that session's share only,
    whatever its own nice value. In a session of its own the driver and every Python worker it
    starts get a share of their own, weighted by ``nice`` (``/proc/PID/autogroup``).

    The JVM still exits with this process (it watches its stdin, a pipe from here). Does nothing
    if this process already runs a JVM (pyspark keeps one per process).

    Args:
        conf: Every conf of the session (passed to ``spark-submit`` as pyspark does).
        nice: The session's nice value, -20 (most CPU) to 19; lowering it below 0 needs root or
            CAP_SYS_NICE. Without the permission, or without autogroup, the session stays at 0
            (no error).
    Returns:
        The JVM's pid, or None if a JVM was running already (or pyspark attached to an existing one).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return None
    spark_conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    # pyspark's launch_gateway is not annotated.
    gateway = launch_gateway(spark_conf, popen_kwargs={"start_new_session": True})  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway)
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return None
    set_session_nice(proc.pid, nice)
    return int(proc.pid)


def set_session_nice(pid: int, nice: int) -> bool:
    """Give the scheduling group (autogroup) of ``pid``'s session the nice value ``nice``, if allowed.

    Linux's autogroup (``/proc/PID/autogroup``, sched(7)): every session is one group, and groups
    share the CPU by their nice value before processes within a group share it by theirs.

    Args:
        pid: Any process of the session (e.g. one started with ``start_new_session=True``).
        nice: -20 (most CPU) to 19; below 0 needs root or CAP_SYS_NICE.
    Returns:
        True if set; False without autogroup, without the permission, or if ``pid`` is gone.
    """
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        return False
    return True
