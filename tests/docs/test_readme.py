"""README.md's examples run top to bottom, in order, against one fresh stack started the README's way.

The convention (README.md, "Development", says the same):

- Every fenced block of README.md whose info string is ``sh`` or ``python`` is run, in the order of
  the file, each exactly once, all in one temporary working directory, against one stack started
  with ``bash scripts/run.sh --root ROOT --port 0`` on a fresh root (as the quick start does).
- A block is not run when the line right before its opening fence is an HTML comment
  ``<!-- readme-test: skip (why) -->`` (long-running commands, root, systemd, Spark): the reason
  is part of the comment. Other info strings (``text``, ``toml``...) are never run.
- In a block, ``127.0.0.1:8080`` becomes the test stack's address and ``/tmp/mq`` its root; mqctl
  finds the stack through ``MQ_URL``, as a reader's mqctl finds the quick start's default address.
- ``sh`` blocks run with ``bash -euo pipefail`` and ``curl`` failing on an HTTP error
  (``--fail-with-body``); ``python`` blocks with this interpreter. Each must exit 0.

The stack's own behaviour on the way is checked too: ``scripts/run.sh`` prints one line when it
installs and none when the venv is current (``scripts/venv.sh`` stamps), and one Ctrl-C (SIGINT to
the process group, as a terminal sends it) stops everything with exit 0 and one "received" line per
daemon, each line prefixed by its daemon's name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: The skip marker: an HTML comment on the line right before a block's opening fence.
SKIP_RE = re.compile(r"^<!--\s*readme-test:\s*skip\b.*-->\s*$")
#: Seconds a README block may take (a block long-polls at most 20 s).
BLOCK_TIMEOUT_SECONDS = 120
#: Seconds scripts/run.sh may take to print its URL (it may have to install first).
START_TIMEOUT_SECONDS = 240


@dataclass(frozen=True)
class Block:
    """One fenced block of README.md: its language, first line number (1-based) and code."""

    language: str
    line: int
    code: str
    skipped: bool


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block of ``text`` (any info string), with whether a skip comment precedes it."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = re.match(r"^```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        start = i
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        skipped = start > 0 and SKIP_RE.match(lines[start - 1].strip()) is not None
        blocks.append(Block(match.group(1), start + 1, "\n".join(lines[start + 1 : end]) + "\n", skipped))
        i = end + 1
    return blocks


RUNNABLE = [b for b in readme_blocks(README.read_text()) if b.language in ("sh", "python") and not b.skipped]


def test_readme_has_runnable_blocks_and_skips_say_why() -> None:
    """The runner finds the examples, and every skip comment gives its reason."""
    blocks = readme_blocks(README.read_text())
    assert {b.language for b in RUNNABLE} == {"sh", "python"}
    assert len(RUNNABLE) >= 4
    for line in README.read_text().splitlines():
        if line.lstrip().startswith("<!--") and "readme-test" in line:
            assert SKIP_RE.match(line.strip()) and "(" in line, f"malformed readme-test comment: {line}"
    assert all(b.language in ("sh", "python", "text") for b in blocks)


def test_curl_is_installed() -> None:
    """The README's quick start uses curl (scripts/test.sh installs it on a fresh Debian machine)."""
    assert shutil.which("curl"), "curl is missing: bash scripts/test.sh installs it (apt-get) when run as root"


def _venv() -> Path:
    """The venv running the tests (scripts/run.sh uses it through MQ_VENV)."""
    if sys.prefix == sys.base_prefix:
        pytest.fail("run the tests from the project's venv (bash scripts/test.sh)")
    return Path(sys.prefix)


def _venv_is_current(venv: Path, extras: str = "") -> bool:
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "venv.sh"), "--check", extras],
        env={**os.environ, "MQ_VENV": str(venv)},
        capture_output=True,
        timeout=30,
    )
    assert run.returncode in (0, 1), run
    return run.returncode == 0


@dataclass
class RunningStack:
    """scripts/run.sh running in its own process group."""

    proc: subprocess.Popen[bytes]
    url: str
    root: Path
    work: Path
    stderr_path: Path
    was_current: bool

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def _first_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The first stdout line of ``proc`` ("" if it exits or stays silent for ``timeout`` s)."""
    assert proc.stdout is not None
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return out[0].decode(errors="replace") if out else ""


@pytest.fixture(scope="module")
def readme_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    base = tmp_path_factory.mktemp("readme")
    root, work = base / "mq", base / "work"
    work.mkdir()
    venv = _venv()
    was_current = _venv_is_current(venv)
    stderr_path = base / "run.stderr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env["MQ_VENV"] = str(venv)
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "run.sh"), "--root", str(root), "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
    try:
        line = _first_line(proc, START_TIMEOUT_SECONDS)
        match = re.match(r"mq is running at (http://\S+) \(root (.+)\); press Ctrl-C to stop", line)
        assert match, f"run.sh printed {line!r}\n{stderr_path.read_text(errors='replace')}"
        assert match.group(2) == str(root)
        yield RunningStack(proc, match.group(1), root, work, stderr_path, was_current)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()


def _run_block(block: Block, stack: RunningStack) -> subprocess.CompletedProcess[bytes]:
    address = stack.url.removeprefix("http://")
    code = block.code.replace("127.0.0.1:8080", address).replace("/tmp/mq", str(stack.root))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env["MQ_URL"] = stack.url
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if block.language == "sh":
        script = 'curl() { command curl --silent --show-error --fail-with-body "$@"; }\n' + code
        argv = ["bash", "-euo", "pipefail", "-c", script]
    else:
        argv = [sys.executable, "-c", code]
    return subprocess.run(
        argv, cwd=stack.work, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=BLOCK_TIMEOUT_SECONDS
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.language}-line-{b.line}" for b in RUNNABLE])
def test_readme_block_runs(block: Block, readme_stack: RunningStack) -> None:
    """Each block exits 0 on the stack the blocks before it left (they run in README order)."""
    assert readme_stack.proc.poll() is None, f"the stack exited\n{readme_stack.stderr[-4000:]}"
    run = _run_block(block, readme_stack)
    assert run.returncode == 0, (
        f"README.md line {block.line} ({block.language}) exited {run.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{run.stdout.decode(errors='replace')[-3000:]}\n--- stderr\n"
        f"{run.stderr.decode(errors='replace')[-3000:]}\n--- stack\n{readme_stack.stderr[-3000:]}"
    )
    assert b"Traceback" not in run.stderr, run.stderr.decode(errors="replace")


def test_readme_stack_ctrl_c(readme_stack: RunningStack) -> None:
    """One Ctrl-C: exit 0, one "received" line per daemon, every line prefixed, no per-file reaper INFO."""
    proc = readme_stack.proc
    assert proc.poll() is None, readme_stack.stderr[-4000:]
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(60) == 0, readme_stack.stderr[-4000:]
    log = readme_stack.stderr
    lines = [line for line in log.splitlines() if line.strip()]
    installing = [line for line in lines if line.startswith("installing mq")]
    assert len(installing) == (0 if readme_stack.was_current else 1), log[-4000:]
    daemon_lines = [line for line in lines if not line.startswith("installing mq")]
    prefixes = ("[mq] ", "[mq-mover] ", "[mq-reaper] ", "[mq-stack] ")
    assert all(line.startswith(prefixes) for line in daemon_lines), log[-4000:]
    for prefix in prefixes:
        received = [line for line in daemon_lines if line.startswith(prefix) and " received SIG" in line]
        assert len(received) == 1, f"{prefix}: {received}\n{log[-4000:]}"
    assert not [line for line in daemon_lines if "INFO mq.reaper reaped name=" in line], log[-4000:]
    assert "exit_codes={'mq': 0, 'mq-mover': 0, 'mq-reaper': 0}" in log


# -- scripts/venv.sh: install only when the venv is missing or pyproject.toml changed ----------------------


def test_venv_stamp_decides_when_run_sh_installs(tmp_path: Path) -> None:
    """``venv.sh --check`` (what run.sh and test.sh decide on): no venv, no stamp, another
    pyproject.toml or other extras -> install; the stamp of this pyproject.toml -> start at once."""
    venv = tmp_path / "venv"
    assert not _venv_is_current(venv)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert not _venv_is_current(venv)
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    (venv / ".mq-installed").write_text(digest + "\n")
    assert _venv_is_current(venv)
    assert not _venv_is_current(venv, "[dev,spark,examples]")
    (venv / ".mq-installed-dev_spark_examples").write_text(digest + "\n")
    assert _venv_is_current(venv, "[dev,spark,examples]")
    (venv / ".mq-installed").write_text(hashlib.sha256(b"an older pyproject.toml").hexdigest() + "\n")
    assert not _venv_is_current(venv)
