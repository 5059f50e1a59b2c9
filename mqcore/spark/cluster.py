"""A Spark standalone cluster on this machine: a master and workers from pyspark's own launch classes.

For the tests, the flights example and bench/spark.py: ``spark-class
org.apache.spark.deploy.master.Master`` and ``...deploy.worker.Worker`` from the
installed pyspark, bound to 127.0.0.1 on free ports, every folder (work dirs,
local dirs, ``java.io.tmpdir``, logs) under one ``work_dir``. Jobs submitted to
:attr:`StandaloneCluster.url` (``spark://127.0.0.1:PORT``) run in executor JVMs
started by the workers, with Python workers of their own: they unpickle the data
source and reach the daemon (or the brokerless root) by themselves.

Each daemon runs in its own process group; an executor JVM is its worker's child
and its Python workers are the executor's descendants (pyspark's daemon makes its
own process group), so :meth:`StandaloneCluster.kill_worker` walks ``/proc`` for the
whole tree. :meth:`StandaloneCluster.stop` kills every process group and tree it
started: no JVM outlives the cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

#: Seconds the master or a worker may take to come up (a loaded 2-core machine: JVM start-up).
START_TIMEOUT_SECONDS = 90.0

_MASTER_READY = "I have been elected leader"
_WORKER_READY = "Successfully registered with master"


class ClusterError(RuntimeError):
    """The master or a worker did not start (the message holds its log's end)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark_class() -> Path:
    """The installed pyspark's ``bin/spark-class``.

    Raises:
        ClusterError: pyspark is not installed.
    """
    try:
        import pyspark
    except ImportError as exc:
        raise ClusterError("pyspark is not installed (pip install 'mq[spark]')") from exc
    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), read from ``/proc``; [] off Linux."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class _Daemon:
    """One master or worker process, its log in a file."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while text not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise ClusterError(f"spark {self.name} exited with {self.proc.returncode}\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"spark {self.name} not ready after {START_TIMEOUT_SECONDS} s\n{self.tail()}")
            time.sleep(0.1)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def kill(self) -> list[int]:
        """SIGKILL the process, its process group and every descendant (executors, Python workers); reap it."""
        victims = descendants(self.proc.pid) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        return victims


class StandaloneCluster:
    """A master and ``workers`` workers on 127.0.0.1; use it as a context manager (stopped on exit).

    Args:
        work_dir: Folder for everything the cluster writes (created).
        workers: Number of workers.
        cores: Cores each worker offers (apps take :data:`mqcore.spark.session.CLUSTER_CONF`'s
            ``spark.cores.max``, so two apps fit on two workers of 2 cores).
        memory: Memory each worker offers executors (``1g``, ``512m``).
        java_options: More JVM options of the master and workers (e.g.
            :data:`mqcore.spark.session.QUICK_JAVA_OPTIONS`).
    """

    def __init__(
        self, work_dir: Path, *, workers: int = 2, cores: int = 2, memory: str = "2g", java_options: str = ""
    ) -> None:
        self.work_dir = work_dir
        self.java_options = java_options
        self.workers_wanted = workers
        self.cores = cores
        self.memory = memory
        self.url = ""
        self._master: _Daemon | None = None
        self._workers: list[_Daemon | None] = []
        self._generation = 0

    def _env(self) -> dict[str, str]:
        tmp = self.work_dir / "tmp"
        local = self.work_dir / "local"
        tmp.mkdir(parents=True, exist_ok=True)
        local.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            {
                "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOCAL_DIRS": str(local),
                "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={tmp} {self.java_options}".strip(),
                "SPARK_DAEMON_MEMORY": "256m",
                "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
                "TMPDIR": str(tmp),
            }
        )
        return env

    def start(self) -> Self:
        """Start the master, then the workers, and wait until every worker has registered.

        Raises:
            ClusterError: A daemon exited or was not ready in ``START_TIMEOUT_SECONDS`` (its log in the message).
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.url = f"spark://127.0.0.1:{port}"
        command = [str(spark_class()), "org.apache.spark.deploy.master.Master"]
        command += ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())]
        try:
            self._master = _Daemon("master", command, self._env(), self.work_dir / "master.log")
            self._master.wait_for(_MASTER_READY)
            self._workers = [self._spawn_worker(i) for i in range(self.workers_wanted)]
            for worker in self._workers:
                assert worker is not None
                worker.wait_for(_WORKER_READY)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_worker(self, index: int) -> _Daemon:
        self._generation += 1
        work = self.work_dir / f"worker-{index}"
        work.mkdir(parents=True, exist_ok=True)
        command = [str(spark_class()), "org.apache.spark.deploy.worker.Worker"]
        command += ["--host", "127.0.0.1", "--port", str(_free_port()), "--webui-port", str(_free_port())]
        command += ["--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work), self.url]
        return _Daemon(f"worker {index}", command, self._env(), self.work_dir / f"worker-{index}.log")

    def worker_pid(self, index: int) -> int:
        """The pid of worker ``index``'s JVM."""
        worker = self._workers[index]
        assert worker is not None, f"worker {index} is not running"
        return worker.proc.pid

    def descendants(self, index: int) -> list[int]:
        """The processes below worker ``index`` now (its executor JVMs and their Python workers)."""
        return descendants(self.worker_pid(index))

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker ``index`` with its executor JVMs and their Python workers (a machine lost).

        Returns:
            The pids killed below the worker (executors, Python workers).
        """
        worker = self._workers[index]
        assert worker is not None, f"worker {index} is not running"
        self._workers[index] = None
        return worker.kill()

    def restart_worker(self, index: int) -> None:
        """Start worker ``index`` again (after :meth:`kill_worker`) and wait until it has registered.

        Raises:
            ClusterError: It did not register in ``START_TIMEOUT_SECONDS``.
        """
        assert self._workers[index] is None, f"worker {index} is running"
        log = self.work_dir / f"worker-{index}.log"
        mark = log.stat().st_size if log.exists() else 0
        worker = self._spawn_worker(index)
        self._workers[index] = worker
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while _WORKER_READY not in log.read_bytes()[mark:].decode(errors="replace"):
            if worker.proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"spark worker {index} did not come back\n{worker.tail()}")
            time.sleep(0.1)

    def pids(self) -> list[int]:
        """The pids of the master's and the running workers' JVMs (executors are below the workers)."""
        return [d.proc.pid for d in [self._master, *self._workers] if d is not None]

    def logs(self) -> str:
        """The ends of the master's and workers' logs (for a failure message)."""
        parts = [d for d in [self._master, *self._workers] if d is not None]
        return "\n".join(f"--- {d.name}\n{d.tail(2000)}" for d in parts)

    def stop(self) -> None:
        """SIGKILL the workers (with their executors and Python workers) and the master. Idempotent."""
        for index, worker in enumerate(self._workers):
            if worker is not None:
                worker.kill()
                self._workers[index] = None
        if self._master is not None:
            self._master.kill()
            self._master = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
