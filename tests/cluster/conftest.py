"""A real shared filesystem for the cluster tests: one GlusterFS volume, mounted once per "host".

The session-scoped :func:`gluster` fixture runs ``scripts/gluster.sh up`` (glusterd on 127.0.0.2
with its own state directory, a replica-3 volume on three brick directories, three FUSE mounts)
once per test session and ``scripts/gluster.sh down`` at the end (docs/cluster.md). Each host
runs its own full stack (mq on 127.0.0.3, .4, .5, mq-mover, mq-reaper) on a root inside its own
mount (bound at a mount point of its own: ``Gluster.roots``), as three machines sharing one volume would.

Without root, /dev/fuse or the GlusterFS binaries a cluster test is skipped with the reason;
under ``CI=true`` (where the cluster suite must run) it fails instead, as the ``faults`` and
``spark`` tests do. ``scripts/test.sh`` installs the packages when it runs as root.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from mqcore.names import Layout
from tests.conftest import PLAIN_HTTP, REPO, Daemons, Stack

#: The script that builds and removes the volume.
GLUSTER_SH = REPO / "scripts" / "gluster.sh"
#: How many hosts (FUSE mounts) the session volume has.
HOSTS = 3
#: The volume's name.
VOLUME = "mqvol"
#: Its bricks (replica 3: scripts/gluster.sh).
BRICKS = 3
#: Where the GlusterFS binaries live on Debian (root's PATH has it; a user's may not).
SBIN = ("/usr/sbin", "/sbin", "/usr/bin")
#: Where ``glfsheal`` (what ``gluster volume heal VOL info`` runs) lives: RPM's path, else Debian's multiarch one.
GLFSHEAL = ("/usr/libexec/glusterfs/glfsheal",)
GLFSHEAL_GLOB = "/usr/lib/*/glusterfs/glfsheal"


def _glob_one(pattern: str) -> str:
    found = glob.glob(pattern)
    assert found, f"nothing matches {pattern}"
    return found[0]


def cluster_unavailable(reason: str) -> None:
    """Skip a cluster test locally; fail it under CI=true, where the cluster suite must run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"cluster test cannot run under CI=true: {reason}")
    pytest.skip(reason)


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (os.path.join(d, name) for d in SBIN if os.access(os.path.join(d, name), os.X_OK)), None
    )


def _missing() -> str | None:
    """Why the volume cannot be built here, or None."""
    if os.geteuid() != 0:
        return "GlusterFS needs root (glusterd, FUSE mounts)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    for binary, package in (
        ("glusterd", "glusterfs-server"),
        ("gluster", "glusterfs-server"),
        ("glusterfs", "glusterfs-client"),
    ):
        if _which(binary) is None:
            return f"{binary} not found (apt-get install {package})"
    return None


@dataclass
class Gluster:
    """The session's volume.

    Attributes:
        state: The state directory of ``scripts/gluster.sh`` (glusterd's files, bricks, mounts).
        mounts: One FUSE mount point per host.
        binds: ``(host, name)`` -> the bind mount that is root ``name`` of the volume on that host (:meth:`roots`).
    """

    state: Path
    mounts: list[Path]
    binds: dict[tuple[int, str], Path] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """Environment for ``scripts/gluster.sh`` and ``gluster`` commands of this volume."""
        return {
            **os.environ,
            "MQ_GLUSTER_STATE": str(self.state),
            "MQ_GLUSTER_HOSTS": str(HOSTS),
            "PATH": os.environ.get("PATH", "") + ":" + ":".join(SBIN),
        }

    def script(self, command: str) -> str:
        """Run ``scripts/gluster.sh COMMAND``; return its stdout.

        Raises:
            subprocess.CalledProcessError: It failed (stderr is in the exception).
        """
        return subprocess.run(
            ["bash", str(GLUSTER_SH), command], env=self.env, capture_output=True, text=True, timeout=120, check=True
        ).stdout

    def cli(self, *args: str) -> str:
        """Run the ``gluster`` CLI against this volume's glusterd; return its stdout."""
        return subprocess.run(
            [
                "gluster",
                "--mode=script",
                f"--glusterd-sock={self.state}/run/glusterd.socket",
                f"--log-file={self.state}/log/cli.log",
                *args,
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout

    def brick_pid(self, brick: int) -> int:
        """Pid of brick process number ``brick`` (1-3)."""
        for path in (self.state / "run" / "vols" / VOLUME).glob(f"*bricks-b{brick}.pid"):
            return int(path.read_text().strip())
        raise FileNotFoundError(f"no pid file for brick {brick}")

    def fuse_pid(self, host: int) -> int:
        """Pid of the FUSE client process of host ``host`` (0-based)."""
        mount = str(self.mounts[host])
        out = subprocess.run(["pgrep", "-f", f"glusterfs .*{mount}$"], capture_output=True, text=True).stdout
        pids = [int(p) for p in out.split()]
        assert len(pids) == 1, f"FUSE client of {mount}: {pids}"
        return pids[0]

    def mount(self, host: int) -> None:
        """Mount the volume again at host ``host``'s mount point (after a lost FUSE client), as ``gluster.sh up``,
        and bind that host's roots (:meth:`roots`) to the new mount at the same places."""
        self.script("up")
        assert os.path.ismount(self.mounts[host]), f"{self.mounts[host]} not mounted again"
        for (h, name), path in self.binds.items():
            if h == host:
                subprocess.run(["umount", "-l", str(path)], check=True, timeout=60)
                subprocess.run(["mount", "--bind", str(self.mounts[h] / name), str(path)], check=True, timeout=60)

    def roots(self, name: str, hosts: int = HOSTS) -> list[Path]:
        """Root ``name`` of the volume as hosts 0 to ``hosts - 1`` see it, each at the top of a mount of its own.

        Each is a bind mount of ``mounts[host] / name`` at ``state/roots/NAME-hN`` (made once per session, kept
        until ``gluster.sh down``), so no path an mq daemon opens has a component between the mount and the root:
        with ``entry-timeout=0`` every such component is one more LOOKUP on each brick for every file operation
        (+14 % of the volume's CPU per component: docs/performance.md, "The cluster tests' GlusterFS CPU (issue
        12, stop 29)"). The directory is made once, through host 0's mount: three hosts making it at once
        through three mounts race on GlusterFS (``EEXIST``, then ``EIO`` on the loser's ``stat``), and so do the
        root's top-level folders, which every daemon makes at start: they are made here too, before any daemon
        starts (a mkdir of one new name through three mounts at once gave ``EIO`` and bricks that disagree on the
        directory's gfid in 2 of 40 tries: docs/performance.md, "The cluster tests' roots at their mount points").

        Args:
            name: Directory of the root on the volume (unique per test module).
            hosts: How many hosts (1-3).
        Raises:
            subprocess.CalledProcessError: A bind mount failed.
        """
        (self.mounts[0] / name).mkdir(exist_ok=True)
        Layout(self.mounts[0] / name).create()
        for host in range(hosts):
            if (host, name) not in self.binds:
                path = self.state / "roots" / f"{name}-h{host + 1}"
                path.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", "--bind", str(self.mounts[host] / name), str(path)], check=True, timeout=60)
                self.binds[host, name] = path
        return [self.binds[host, name] for host in range(hosts)]

    def start_force(self) -> None:
        """``gluster volume start VOL force`` until every brick is online again.

        (glusterd notices a killed brick only when its connection drops; a ``start force`` before
        that succeeds and restarts nothing, so it is repeated.)

        Raises:
            AssertionError: A brick is still offline after 60 s.
        """
        deadline = time.monotonic() + 60
        while True:
            self.cli("volume", "start", VOLUME, "force")
            status = self.cli("volume", "status", VOLUME, "--xml")
            online = re.findall(r"<path>[^<]*/bricks/b\d</path>.*?<status>(\d)</status>", status, re.DOTALL)
            if online == ["1", "1", "1"]:
                return
            assert time.monotonic() < deadline, f"bricks not back after 60 s:\n{status}"
            time.sleep(1)

    def heal_info(self) -> str:
        """What ``gluster volume heal VOL info`` says: per brick, its status and how many entries await healing.

        The CLI runs ``glfsheal``, which asks glusterd's default socket (/var/run/glusterd.socket) for the
        volume and so fails with "Not able to fetch volfile" for this state directory's glusterd: it is run
        here directly, given that glusterd's socket. (It logs to /var/log/glusterfs/glfsheal-VOL.log.)
        """
        glfsheal = next((p for p in GLFSHEAL if os.access(p, os.X_OK)), None) or _glob_one(GLFSHEAL_GLOB)
        out = subprocess.run(
            [glfsheal, VOLUME, "glusterd-sock", f"{self.state}/run/glusterd.socket"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return out.stdout + out.stderr

    def wait_healed(self, timeout: float = 120) -> str:
        """Start an index self-heal and wait until ``gluster volume heal VOL info`` lists 0 entries on every brick.

        Returns:
            The last ``heal info`` output.
        Raises:
            AssertionError: Entries still listed (or a brick not connected) after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        started = False
        while True:
            if not started:  # refused until the self-heal daemon is back with the brick; it heals on its own then
                try:
                    self.cli("volume", "heal", VOLUME)
                    started = True
                except subprocess.CalledProcessError:
                    pass
            info = self.heal_info()
            if re.findall(r"^Number of entries: (\S+)$", info, re.MULTILINE) == ["0"] * BRICKS:
                return info
            assert time.monotonic() < deadline, f"self-heal not done after {timeout} s:\n{info}"
            time.sleep(0.5)

    def brick_path(self, brick: int, *parts: str) -> Path:
        """Path of ``parts`` (a path on the volume) inside brick number ``brick`` (1-3): the brick's own copy."""
        return self.state.joinpath("bricks", f"b{brick}", *parts)


#: Most lines of GlusterFS's own logs attached to a failed cluster test's report.
LOG_LINES_ON_FAILURE = 200


def gluster_log_lines(state: Path, limit: int = LOG_LINES_ON_FAILURE) -> str:
    """The warnings and errors of the volume's logs (FUSE clients ``h*.log``, glusterd), newest last.

    A cluster failure is often GlusterFS's doing (e.g. the client's ``src resolution failed`` behind
    docs/protocol.md 13.5), and ``scripts/gluster.sh down`` removes these logs when the session ends,
    so CI's output of a failed test must carry them.
    """
    lines: list[str] = []
    for log in sorted(state.joinpath("log").glob("*.log")):
        with open(log, errors="replace") as f:
            lines += [f"{log.name}: {line.rstrip()}" for line in f if re.search(r"\] [EWC] \[", line)]
    return "\n".join(lines[-limit:]) or "(no warning or error lines)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the volume's warning and error log lines to the report of a failed cluster test."""
    report = yield
    volume = getattr(item, "funcargs", {}).get("gluster")
    if report.failed and isinstance(volume, Gluster):
        report.sections.append((f"GlusterFS logs ({report.when})", gluster_log_lines(volume.state)))
    return report


@pytest.fixture(scope="session")
def gluster() -> Iterator[Gluster]:
    """The session's GlusterFS volume, mounted once per host (built once, removed at the end)."""
    reason = _missing()
    if reason:
        cluster_unavailable(reason)
    state = Path(tempfile.mkdtemp(prefix="mq-gluster-", dir="/tmp"))
    volume = Gluster(state=state, mounts=[])
    try:
        try:
            out = volume.script("up")
        except subprocess.CalledProcessError as exc:
            cluster_unavailable(f"scripts/gluster.sh up failed: {exc.stderr.strip()[-2000:]}")
        volume.mounts = [Path(line) for line in out.split()]
        assert len(volume.mounts) == HOSTS, out
        yield volume
    finally:
        volume.script("down")


@dataclass
class Host:
    """One "host": a FUSE mount of the volume and the full stack running on it.

    Attributes:
        index: 0-based host number.
        address: The loopback address its mq listens on (127.0.0.3 + index).
        root: The mq root, a bind mount of a directory of this host's own mount (:meth:`Gluster.roots`).
        stack: mq + mq-mover + mq-reaper on ``root``.
    """

    index: int
    address: str
    root: Path
    stack: Stack


#: Daemon options on the shared filesystem (docs/cluster.md). mq's full rescans are rare: its directory change
#: checks find other hosts' changes (a test relies on it); the movers rescan delay/ every second (another host's
#: leases: the host-kill and clock-skew tests rely on it). The reapers keep their default (60 s), as docs/cluster.md
#: says: each host's deletes reach its own reaper by inotify, and no test waits for another host's to be unlinked;
#: at one second the three reapers' rescans of remove/ and new/ cost an idle cluster ~4 % of a core
#: (docs/performance.md, "The cluster tests' roots at their mount points (issue 12, stop 30)").
CLUSTER_MQ_ARGS = ("--rescan-interval", "30")
CLUSTER_MOVER_ARGS = ("--rescan-interval", "1")
CLUSTER_REAPER_ARGS: tuple[str, ...] = ()
#: Seconds each daemon of a host may take to be ready. Nine daemons start at once next to the bricks and FUSE
#: clients; on the shared 2-core machine at load average 19, nine concurrent imports of mq alone took 35 s.
CLUSTER_READY_TIMEOUT = 90.0


def start_hosts(
    daemons: Daemons,
    gluster: Gluster,
    name: str,
    *,
    hosts: int = HOSTS,
    visibility_timeout: int = 30,
    peers: int = 0,
    env: dict[str, str] | None = None,
    envs: Sequence[dict[str, str] | None] = (),
    **options: Any,
) -> list[Host]:
    """Start a full stack per host on root ``name`` of the volume (each through its own mount: :meth:`Gluster.roots`).

    Args:
        daemons: Owner of the processes (stopped at teardown).
        gluster: The volume.
        name: Directory of the root on the volume (unique per test module).
        hosts: How many hosts (1-3).
        visibility_timeout: Default visibility timeout in seconds.
        peers: ``--peers`` of every mq.
        env: Extra environment for every daemon; ``envs[i]`` for host i's only (e.g. libfaketime).
        options: More :meth:`Daemons.stack` options.
    """

    roots = gluster.roots(name, hosts)

    def start(i: int) -> Host:
        root = roots[i]
        address = f"127.0.0.{3 + i}"
        host_env = {**(env or {}), **((envs[i] if i < len(envs) else None) or {})}
        stack = daemons.stack(
            root,
            visibility_timeout=visibility_timeout,
            peers=peers,
            mq_args=["--address", address, *CLUSTER_MQ_ARGS],
            mover_args=list(CLUSTER_MOVER_ARGS),
            reaper_args=list(CLUSTER_REAPER_ARGS),
            env=host_env or None,
            ready_timeout=CLUSTER_READY_TIMEOUT,
            **options,
        )
        return Host(index=i, address=address, root=root, stack=stack)

    # The hosts start at once (each host's three daemons already do): their start-ups overlap.
    with concurrent.futures.ThreadPoolExecutor(hosts) as pool:
        return list(pool.map(start, range(hosts)))


def with_session(hosts: list[Host], session: Any) -> list[Host]:
    """The hosts with their stacks' HTTP helpers bound to ``session``."""
    return [dataclasses.replace(h, stack=dataclasses.replace(h.stack, session=session)) for h in hosts]


def queue_names(hosts: Sequence[Host]) -> set[str]:
    """The queues on the hosts' shared root (read through host 0's mount; empty if it cannot be read)."""
    try:
        return {n for n in os.listdir(hosts[0].root / "queues") if not n.startswith(".")}
    except OSError:
        return set()


def delete_queues(hosts: Sequence[Host], names: set[str]) -> None:
    """``DELETE /{queue}`` each of ``names`` through the first host whose mq answers (best effort: a queue
    left behind costs CPU, not correctness)."""
    for name in sorted(names):
        for host in hosts:
            if not host.stack.mq.running or not host.stack.mq.url:
                continue
            try:
                if httpx.delete(f"{host.stack.url}/{name}", timeout=30, verify=PLAIN_HTTP).status_code in (200, 404):
                    break
            except httpx.HTTPError:
                continue


@pytest.fixture(autouse=True)
def _delete_the_tests_queues(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test on a module's shared ``hosts``, delete the queues it created.

    Every queue a host has indexed costs one ``stat`` of its directory every 50 ms on every host (their change
    checks: docs/cluster.md), and with ``entry-timeout=0`` each is a lookup of every path component on each
    brick: six idle empty queues kept GlusterFS at 84 % of a core against 5 % without them (docs/performance.md,
    "The test suite's wall time (stop 26)"). Left indexed, a module's earlier queues slowed its later tests
    (the race test ran beside five). The test's own assertions are done by then; nothing here asserts.
    """
    if "hosts" not in request.fixturenames:
        yield
        return
    hosts = request.getfixturevalue("hosts")
    before = queue_names(hosts)
    yield
    delete_queues(hosts, queue_names(hosts) - before)
