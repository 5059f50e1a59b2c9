"""mq-mover and mq-reaper, in process: ``serve()`` on a real root under ``tmp_path``.

Each test runs the real daemon coroutine on the test's event loop with an
``asyncio.Event`` as shutdown trigger, prepares or changes files through the
real :class:`mqcore.protocol.Store`, and watches the directories. Nothing is
mocked. The command-line tests run ``python -m daemons.mover`` as a
subprocess (settings layers, SIGTERM, exit codes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from daemons import mover, reaper
from daemons.mover import MoverSettings
from daemons.reaper import ReaperSettings
from mqcore.errors import ConfigError
from mqcore.model import ReceivedMessage
from mqcore.names import QueueName
from mqcore.protocol import Store, now_ms

REPO = Path(__file__).resolve().parents[2]
Q = QueueName("jobs")
#: Seconds a daemon may take to get ready or to do something it was asked to (generous: not a speed test).
TIMEOUT = 10.0

# -- helpers ------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty root; MQ_NO_INOTIFY from the outer environment is dropped."""
    monkeypatch.delenv("MQ_NO_INOTIFY", raising=False)
    return tmp_path / "root"


@pytest.fixture
def store(root: Path) -> Iterator[Store]:
    """The protocol on ``root``, with queue ``jobs`` created."""
    s = Store(root)
    s.create_queue(Q)
    yield s
    s.close()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Captured log records of the daemons (DEBUG and up)."""
    caplog.set_level(logging.DEBUG, logger="mq")
    return caplog


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every captured log message, formatted."""
    return [r.getMessage() for r in caplog.records]


async def wait_for(predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
    return value


@contextlib.asynccontextmanager
async def running(
    serve: Callable[..., Awaitable[None]], settings: Any, caplog: pytest.LogCaptureFixture, ready: str
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``serve(settings, shutdown_trigger=stop)`` until the block ends; wait for its readiness line.

    On exit the trigger is set and the daemon must return within ``TIMEOUT`` seconds.
    """
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, shutdown_trigger=stop))

    def is_ready() -> bool:
        if task.done():
            task.result()  # raise what killed it
            raise AssertionError("serve() returned before it was ready")
        return any(m.startswith(ready) for m in messages(caplog))

    try:
        await wait_for(is_ready, ready)
        yield task
        assert not task.done(), "serve() ended before it was asked to"
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)


def lease_with_deadline(store: Store, deadline_ms: int, body: bytes = b"x") -> ReceivedMessage:
    """Send a message to ``jobs`` and receive it so that its in-flight deadline is ``deadline_ms``."""
    message_id = store.send(Q, body)
    received = store.lease(Q, f"{message_id}.0", visibility_timeout_ms=0, now=deadline_ms)
    assert received is not None and received.deadline_ms == deadline_ms
    return received


def ready_path(root: Path, msg: ReceivedMessage) -> Path:
    """Where ``msg`` appears once redelivered: ``queues/jobs/ID.RC``."""
    return root / "queues" / msg.queue / f"{msg.message_id}.{msg.receive_count}"


def in_flight_path(root: Path, msg: ReceivedMessage) -> Path:
    """Where ``msg`` sits while in flight: ``delay/DL.jobs.ID.RC``."""
    return root / "delay" / msg.in_flight_name


def mover_settings(root: Path, rescan_interval_seconds: float = 60.0) -> MoverSettings:
    return MoverSettings(root=str(root), rescan_interval_seconds=rescan_interval_seconds)


def reaper_settings(root: Path, *, new_grace_seconds: float = 300.0, rescan_interval_seconds: float = 60.0):
    return ReaperSettings(
        root=str(root), new_grace_seconds=new_grace_seconds, rescan_interval_seconds=rescan_interval_seconds
    )


def run_mover(root: Path, settings: MoverSettings, caplog: pytest.LogCaptureFixture):
    return running(mover.serve, settings, caplog, f"mq-mover ready root={root}")


def run_reaper(root: Path, settings: ReaperSettings, caplog: pytest.LogCaptureFixture):
    return running(reaper.serve, settings, caplog, f"mq-reaper ready root={root}")


# -- mq-mover -----------------------------------------------------------------


async def test_mover_redelivers_what_was_due_before_it_started(root: Path, store: Store, logs) -> None:
    overdue = lease_with_deadline(store, now_ms() - 5_000)
    later = lease_with_deadline(store, now_ms() + 60_000)
    assert in_flight_path(root, overdue).exists()

    async with run_mover(root, mover_settings(root), logs):
        await wait_for(ready_path(root, overdue).exists, "the overdue message back in its queue")
        assert not in_flight_path(root, overdue).exists()
        await asyncio.sleep(0.2)
        assert in_flight_path(root, later).exists(), "a message was redelivered before its deadline"
        assert not ready_path(root, later).exists()

    assert any(f"redelivered queue=jobs id={overdue.message_id} receive_count=1" in m for m in messages(logs))
    assert any("start-up scan in_flight=2 due=1 inotify=yes" in m for m in messages(logs))


async def test_mover_redelivers_new_lease_within_a_second_of_its_deadline(root: Path, store: Store, logs) -> None:
    # A far-off lease first: the mover then sleeps until the rescan (60 s), so the short
    # lease below must wake it early (via inotify), not be found by a timer.
    lease_with_deadline(store, now_ms() + 50_000)
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=60), logs):
        msg = lease_with_deadline(store, now_ms() + 700)
        target = ready_path(root, msg)
        await wait_for(target.exists, "the redelivery", interval=0.002)
        arrived_ms = now_ms()

    assert arrived_ms >= msg.deadline_ms, f"redelivered {msg.deadline_ms - arrived_ms} ms before the deadline"
    assert arrived_ms <= msg.deadline_ms + 1_000, f"redelivered {arrived_ms - msg.deadline_ms} ms late"
    line = next(m for m in messages(logs) if f"redelivered queue=jobs id={msg.message_id}" in m)
    late_ms = int(re.search(r"late_ms=(-?\d+)", line).group(1))
    assert 0 <= late_ms < 1_000


async def test_mover_sends_orphans_to_remove(root: Path, store: Store, logs) -> None:
    msg = lease_with_deadline(store, now_ms() - 1)
    # The queue is deleted while the message is in flight (a receive racing DELETE /jobs).
    os.rename(root / "queues" / "jobs", root / "remove" / "jobs.0123.queue")

    async with run_mover(root, mover_settings(root), logs):
        removed = root / "remove" / f"jobs.{msg.message_id}"
        await wait_for(removed.exists, "the orphan in remove/")
        assert not in_flight_path(root, msg).exists()
        assert not (root / "queues" / "jobs").exists(), "the mover must not recreate a deleted queue"

    assert any(f"orphaned queue=jobs id={msg.message_id}" in m for m in messages(logs))


async def test_mover_ignores_in_flight_message_deleted_before_its_deadline(root: Path, store: Store, logs) -> None:
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=0.1), logs) as task:
        msg = lease_with_deadline(store, now_ms() + 200)
        await asyncio.sleep(0.05)
        assert store.delete(Q, msg.message_id) == "in_flight"
        await asyncio.sleep(0.5)
        assert not ready_path(root, msg).exists(), "a deleted message came back"
        assert (root / "remove" / f"jobs.{msg.message_id}").exists()
        assert not task.done()


async def test_mover_heap_stays_bounded_when_leases_are_deleted(
    root: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Messages received with a long visibility timeout and deleted at once must not
    # pile up in the mover's memory until their deadlines (hours with SQS-like timeouts).
    monkeypatch.setattr(mover, "COMPACT_SLACK", 10)
    m = mover.Mover(store, rescan_interval_seconds=60, watcher=mover.open_watcher())
    try:
        await m.start()
        assert m.watching
        for _ in range(60):
            msg = lease_with_deadline(store, now_ms() + 3_600_000)
            await wait_for(lambda: len(m) == 1, "the lease to be seen")
            store.delete(Q, msg.message_id)
            await wait_for(lambda: len(m) == 0, "the delete to be seen")
        assert len(m._heap) <= 2 * len(m) + 10
    finally:
        m.close()


@pytest.mark.parametrize("in_flight", [False, True], ids=["empty", "far-deadline"])
async def test_mover_does_not_busy_poll(root: Path, store: Store, logs, in_flight: bool) -> None:
    if in_flight:
        lease_with_deadline(store, now_ms() + 120_000)
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=10), logs):
        await asyncio.sleep(0.2)
        cpu0 = time.process_time()
        await asyncio.sleep(2.0)
        cpu_seconds = time.process_time() - cpu0
    assert cpu_seconds < 0.2, f"the idle mover used {cpu_seconds:.3f} s of CPU in 2 s"


async def test_mover_without_inotify_relies_on_rescans(
    root: Path, store: Store, logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQ_NO_INOTIFY", "1")
    before = lease_with_deadline(store, now_ms() - 1_000)
    async with run_mover(root, mover_settings(root, rescan_interval_seconds=0.2), logs):
        assert any("inotify=no" in m for m in messages(logs))
        await wait_for(ready_path(root, before).exists, "redelivery of the message there at start-up")
        overdue = lease_with_deadline(store, now_ms() - 1_000)
        soon = lease_with_deadline(store, now_ms() + 400)
        await wait_for(ready_path(root, overdue).exists, "redelivery found by a rescan")
        await wait_for(ready_path(root, soon).exists, "redelivery after the deadline", interval=0.002)
        assert now_ms() >= soon.deadline_ms


# -- mq-reaper ----------------------------------------------------------------


def fill_remove(store: Store) -> tuple[list[str], str]:
    """Delete two of three messages of ``jobs`` and a whole queue ``gone`` with messages.

    Returns:
        The ids still ready in ``jobs``, and the name of the deleted queue's directory in ``remove/``.
    """
    ids = [store.send(Q, f"m{i}".encode()) for i in range(3)]
    store.delete(Q, ids[0])
    store.delete(Q, ids[1])
    gone = QueueName("gone")
    store.create_queue(gone)
    for i in range(5):
        store.send(gone, f"g{i}".encode())
    store.delete_queue(gone)
    dirs = [n for n in os.listdir(store.layout.remove) if n.endswith(".queue")]
    assert len(dirs) == 1 and len(os.listdir(os.path.join(store.layout.remove, dirs[0]))) == 5
    return ids[2:], dirs[0]


async def test_reaper_removes_what_was_there_at_start(root: Path, store: Store, logs) -> None:
    kept, queue_dir = fill_remove(store)
    assert len(os.listdir(root / "remove")) == 3

    async with run_reaper(root, reaper_settings(root), logs):
        await wait_for(lambda: not os.listdir(root / "remove"), "remove/ to be empty")

    assert os.listdir(root / "queues" / "jobs") == [f"{kept[0]}.0"]
    assert any(f"removed deleted queue directory name={queue_dir}" in m for m in messages(logs))


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "rescan-only"])
async def test_reaper_removes_arrivals(
    root: Path, store: Store, logs, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    if not inotify:
        monkeypatch.setenv("MQ_NO_INOTIFY", "1")
    # With inotify the rescan is far off, so removal must come from the watch.
    settings = reaper_settings(root, rescan_interval_seconds=60 if inotify else 0.2)
    async with run_reaper(root, settings, logs):
        assert any(f"inotify={'yes' if inotify else 'no'}" in m for m in messages(logs))
        kept, _ = fill_remove(store)
        await wait_for(lambda: not os.listdir(root / "remove"), "remove/ to be empty")
        assert os.listdir(root / "queues" / "jobs") == [f"{kept[0]}.0"]


async def test_reaper_sweeps_stale_new_files_only(root: Path, store: Store, logs) -> None:
    stale = store.write_new(Q, b"writer died before 201")
    old = time.time() - 600
    os.utime(stale.path, (old, old))
    fresh = store.write_new(Q, b"still being written")

    async with run_reaper(root, reaper_settings(root, new_grace_seconds=300, rescan_interval_seconds=0.2), logs):
        # The start-up sweep happens before the readiness line.
        assert not os.path.exists(stale.path)
        assert os.path.exists(fresh.path)
        later = store.write_new(Q, b"another writer died")
        os.utime(later.path, (old, old))
        await wait_for(lambda: not os.path.exists(later.path), "the periodic sweep")
        await asyncio.sleep(0.5)  # a few more sweeps
        assert os.path.exists(fresh.path), "a file younger than the grace period was swept"

    assert any(
        f"dropped unacknowledged file from new/ name={os.path.basename(stale.path)}" in m for m in messages(logs)
    )
    assert not any(os.path.basename(fresh.path) in m for m in messages(logs))


# -- settings and command line ------------------------------------------------


def test_settings_reject_bad_values(tmp_path: Path) -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError) as info:
            MoverSettings(root=str(tmp_path), rescan_interval_seconds=bad)
        assert info.value.details["key"] == "rescan-interval"
        with pytest.raises(ConfigError) as info:
            ReaperSettings(root=str(tmp_path), new_grace_seconds=bad)
        assert info.value.details["key"] == "new-grace"
    with pytest.raises(ConfigError):
        MoverSettings(root="")
    with pytest.raises(ConfigError):
        ReaperSettings(root=str(tmp_path), log_level="LOUD")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any MQ_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env.update(extra)
    return env


async def run_until_ready_then_sigterm(
    module: str, args: list[str], env: dict[str, str], ready: str
) -> tuple[int, list[str]]:
    """Start ``python -m module args``, wait for ``ready`` on stderr, SIGTERM it.

    Returns:
        The exit status and every stderr line. If it exits before it is ready, the
        status is whatever it exited with.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while line := (await proc.stderr.readline()).decode():
                lines.append(line.rstrip("\n"))
                if ready in line:
                    proc.send_signal(signal.SIGTERM)
                    break
        _, rest = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    lines += rest.decode().splitlines()
    return proc.returncode, lines


@pytest.mark.parametrize(
    ("cli", "env", "toml", "expect"),
    [
        (["--rescan-interval", "0.5"], {"MQ_MOVER_RESCAN_INTERVAL": "0.7"}, 0.9, "rescan_interval=0.5(cli)"),
        ([], {"MQ_MOVER_RESCAN_INTERVAL": "0.7"}, 0.9, "rescan_interval=0.7(env)"),
        ([], {}, 0.9, "rescan_interval=0.9(config)"),
        ([], {}, None, "rescan_interval=10.0(default)"),
    ],
    ids=["cli", "env", "toml", "default"],
)
async def test_mover_settings_precedence(
    tmp_path: Path, cli: list[str], env: dict[str, str], toml: float | None, expect: str
) -> None:
    root = tmp_path / "root"
    config = tmp_path / "mq.toml"
    text = f'root = "{root}"\n[mq-mover]\n'
    if toml is not None:
        text += f"rescan-interval = {toml}\n"
    config.write_text(text)

    code, lines = await run_until_ready_then_sigterm(
        "daemons.mover", ["--config", str(config), *cli], clean_env(**env), "mq-mover ready"
    )

    log = "\n".join(lines)
    assert code == 0, log
    settings_line = next(line for line in lines if " settings " in line)
    assert expect in settings_line, log
    assert f"root={root}(config)" in settings_line, log
    value = expect.split("=")[1].split("(")[0]
    assert f"rescan_interval_seconds={value}" in log, log
    assert f"mq-mover ready root={root}" in log, log
    assert "received SIGTERM" in log, log


async def test_reaper_exits_0_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "root"
    code, lines = await run_until_ready_then_sigterm(
        "daemons.reaper",
        ["--root", str(root), "--rescan-interval", "0.3"],
        clean_env(MQ_REAPER_NEW_GRACE="120"),
        "mq-reaper ready",
    )
    log = "\n".join(lines)
    assert code == 0, log
    assert "new_grace=120.0(env)" in log and "rescan_interval=0.3(cli)" in log, log


def test_unknown_toml_key_exits_78(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    for name in [k for k in os.environ if k.startswith("MQ_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "mq.toml"
    config.write_text("[mq-mover]\nrescan-intervall = 3\n")
    assert mover.main(["--config", str(config), "--root", str(tmp_path / "root")]) == 78
    assert "unknown key 'rescan-intervall' in [mq-mover]" in capsys.readouterr().err
    config.write_text("[mq-reaper]\nroot-dir = 3\n")
    assert reaper.main(["--config", str(config)]) == 78


def test_bad_values_exit_78_and_bad_command_lines_64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("MQ_")]:
        monkeypatch.delenv(name)
    root = str(tmp_path / "root")
    assert mover.main(["--root", root, "--no-such-option"]) == 64
    assert mover.main(["--root", root, "--rescan-interval", "soon"]) == 64
    monkeypatch.setenv("MQ_MOVER_RESCAN_INTERVAL", "soon")
    assert mover.main(["--root", root]) == 78
    config = tmp_path / "mq.toml"
    config.write_text('[mq-reaper]\nnew-grace = "long"\n')
    assert reaper.main(["--config", str(config), "--root", root]) == 78


async def test_out_of_range_value_exits_78_naming_the_layer(tmp_path: Path) -> None:
    code, lines = await run_until_ready_then_sigterm(
        "daemons.mover",
        ["--root", str(tmp_path / "root")],
        clean_env(MQ_MOVER_RESCAN_INTERVAL="0"),
        "mq-mover ready",
    )
    log = "\n".join(lines)
    assert code == 78, log
    assert "rescan-interval must be a finite number of seconds > 0, got 0.0 (from env MQ_MOVER_RESCAN_INTERVAL)" in log
