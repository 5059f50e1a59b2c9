"""Start an mq stack (``mq-stack``: mq, mq-mover and mq-reaper) on a root folder, for the example's run.

The stack listens on 127.0.0.1 on a free port (``--port 0``); its URL is read
from the line ``mq is running at http://...`` that ``mq-stack`` prints on stdout.
Its log (stderr) goes to a file, shown when something fails.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

#: Seconds ``mq-stack`` may take to print its URL.
START_TIMEOUT_SECONDS = 60.0
#: Seconds it may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT_SECONDS = 30.0

_URL_RE = re.compile(r"mq is running at (http://\S+)")


class StackError(RuntimeError):
    """The stack did not start, or exited while in use."""


class Stack:
    """An ``mq-stack`` subprocess on ``root`` (created if missing); use it as a context manager.

    Args:
        root: Root folder of the queues.
        log_path: File that receives the stack's log.
        max_batch_messages: mq's ``--max-batch-messages`` (entries per batch send, 1-1000).
    """

    def __init__(self, root: Path, log_path: Path, *, max_batch_messages: int = 10) -> None:
        self.root = root
        self.log_path = log_path
        self.max_batch_messages = max_batch_messages
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> Self:
        """Start the stack and wait until mq answers on its URL.

        Raises:
            StackError: It exited or printed no URL within ``START_TIMEOUT_SECONDS`` (the log is in the message).
        """
        command = [
            sys.executable,
            "-m",
            "daemons.stack",
            "--root",
            str(self.root),
            "--address",
            "127.0.0.1",
            "--port",
            "0",
            f"--mq-arg=--max-batch-messages={self.max_batch_messages}",
        ]
        with self.log_path.open("w") as log:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True
            )
        found = threading.Event()

        def read_url() -> None:
            assert self._proc is not None and self._proc.stdout is not None
            for line in self._proc.stdout:
                match = _URL_RE.search(line)
                if match and not found.is_set():
                    self.url = match.group(1)
                    found.set()

        threading.Thread(target=read_url, name="mq-stack-stdout", daemon=True).start()
        if not found.wait(START_TIMEOUT_SECONDS) or self._proc.poll() is not None:
            self.stop()
            raise StackError(f"mq-stack did not start: {' '.join(command)}\n{self.log_tail()}")
        return self

    def check(self) -> None:
        """Raise :class:`StackError` if the stack has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            raise StackError(f"mq-stack exited with {self._proc.returncode}\n{self.log_tail()}")

    def stop(self) -> int | None:
        """SIGTERM the stack (it stops its three daemons) and wait; kill it after ``STOP_TIMEOUT_SECONDS``.

        Returns:
            Its exit status (0 after a clean stop), or None if it was not started.
        """
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the stack's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
