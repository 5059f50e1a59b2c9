"""mqctl's output and errors: exit codes, the one-line error reports, stdout data writers, logging, signals.

stdout carries only data (bodies, message ids, JSON objects or JSON lines);
stderr carries progress bars, short notes and errors. Every error is one line
``mqctl: <code>: <message>`` on stderr and a sysexits.h exit code
(:data:`EXIT_USAGE` ...), so a shell script can tell a typo from a missing
queue from a server that is down.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from mqcore.errors import (
    ConnectionFailed,
    InvalidRequest,
    MessageNotFound,
    MQError,
    QueueFull,
    QueueNotFound,
    StorageUnavailable,
)

if TYPE_CHECKING:
    from mqcore.client.types import Message, PeekedMessage

#: Exit codes (sysexits.h, as the daemons' ``daemons._runtime``).
EXIT_OK = 0
#: Any other mq error: a conflict (409 queue_name_exists, redrive_in_progress), a stale receipt handle,
#: a redrive that ended failed or cancelled, an internal error.
EXIT_ERROR = 1
#: A bad command line: unknown option, missing argument, malformed ``key=value`` (also click's usage errors).
EXIT_USAGE = os.EX_USAGE  # 64
#: The server refused the request as invalid: 400 (bad queue name, bad attribute, ...) or 413 message_too_large.
EXIT_DATAERR = os.EX_DATAERR  # 65
#: The queue or message does not exist (404 queue_not_found, message_not_found), or a queue has no dead-letter queue.
EXIT_NOINPUT = os.EX_NOINPUT  # 66
#: The server cannot be reached (connection refused, timeout) or storage is unavailable (503).
EXIT_UNAVAILABLE = os.EX_UNAVAILABLE  # 69
#: A local file (``--file``, stdin) could not be read, or the brokerless root failed with an OS error.
EXIT_IOERR = os.EX_IOERR  # 74
#: The queue is full (429 queue_full): try again later.
EXIT_TEMPFAIL = os.EX_TEMPFAIL  # 75
#: Interrupted by Ctrl-C outside ``tail`` (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


class CtlError(Exception):
    """An error of mqctl itself (not of the server): bad input, a file, a redrive that failed.

    Args:
        code: Short snake_case id printed as ``mqctl: <code>: ...``.
        message: What went wrong, for people.
        exit_code: The process exit code.
    """

    def __init__(self, code: str, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code


def exit_code_for(exc: MQError) -> int:
    """The exit code of mqctl for an mq error (the table in docs/mqctl.md).

    Returns:
        75 for queue_full, 69 for connection failures and storage_unavailable, 66 for
        queue_not_found and message_not_found, 65 for every 400/413 (``InvalidRequest``), 1 otherwise.
    """
    if isinstance(exc, QueueFull):
        return EXIT_TEMPFAIL
    if isinstance(exc, ConnectionFailed | StorageUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, QueueNotFound | MessageNotFound):
        return EXIT_NOINPUT
    if isinstance(exc, InvalidRequest):
        return EXIT_DATAERR
    return EXIT_ERROR


def report(code: str, message: str) -> None:
    """Print one error line ``mqctl: <code>: <message>`` on stderr."""
    click.echo(f"mqctl: {code}: {message}", err=True)


def note(message: str) -> None:
    """Print a short note for people on stderr (never on stdout, which carries only data)."""
    click.echo(message, err=True)


# -- output -----------------------------------------------------------------------------------------------


class StdoutClosed(Exception):
    """The reader of stdout went away (``mqctl receive | head -1``): stop quietly."""


def write_out(data: bytes) -> None:
    """Write ``data`` to stdout and flush it at once (each message reaches a pipe as soon as it is read).

    Raises:
        StdoutClosed: The pipe is closed; stdout is pointed at /dev/null so the interpreter's final
            flush does not fail again.
    """
    try:
        out = sys.stdout.buffer
        out.write(data)
        out.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise StdoutClosed from None


def write_line(text: str) -> None:
    """Write one line of text (UTF-8) to stdout."""
    write_out(text.encode("utf-8") + b"\n")


def write_json(value: Any, *, indent: int | None = None) -> None:
    """Write ``value`` as JSON on stdout: one line (JSON lines), or indented for single objects."""
    write_line(json.dumps(value, ensure_ascii=False, indent=indent))


def body_fields(body: bytes) -> dict[str, str]:
    """``{"body": text}`` if the body is UTF-8, else ``{"body_base64": ...}`` (RFC 4648, with padding)."""
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode("ascii")}


def _content_json(message: Message | PeekedMessage) -> dict[str, Any]:
    """The last keys of each message object: ``content_type``, ``attributes`` and the body (:func:`body_fields`)."""
    return {"content_type": message.content_type, "attributes": dict(message.attributes), **body_fields(message.body)}


def _count_json(message: Message | PeekedMessage) -> dict[str, Any]:
    """``receive_count`` and ``sent_ms``, in every message object."""
    return {"receive_count": message.receive_count, "sent_ms": message.sent_ms}


def message_json(message: Message) -> dict[str, Any]:
    """The ``receive --json`` object of a received message."""
    return {
        "message_id": message.message_id,
        "receipt_handle": message.receipt_handle,
        **_count_json(message),
        **_content_json(message),
    }


def peeked_json(message: PeekedMessage) -> dict[str, Any]:
    """The ``tail --json`` / ``dead-letters --json`` object of a peeked message (``group_id``: FIFO queues only)."""
    return {
        "message_id": message.message_id,
        "queue": message.queue,
        "state": message.state,
        **_count_json(message),
        "visibility_deadline_ms": message.visibility_deadline_ms,
        "visible_at_ms": message.visibility_deadline_ms,  # deprecated name of visibility_deadline_ms (docs/mqctl.md)
        "source_queue": message.source_queue,
        **({"group_id": message.group_id} if message.group_id is not None else {}),
        **_content_json(message),
    }


def write_message(body: bytes, obj: dict[str, Any] | None) -> None:
    """Write one message: its JSON object as a line when ``obj`` is given, else the body and a newline."""
    if obj is not None:
        write_json(obj)
    else:
        write_out(body + b"\n")


def progress_bar(show: bool | None, **options: Any) -> Any:
    """A tqdm progress bar on stderr; shown when ``show`` is True, or None and stderr is a terminal."""
    from tqdm import tqdm  # imported when needed: most commands draw no bar, and every run pays the import

    if show is None:
        show = sys.stderr.isatty()
    return tqdm(file=sys.stderr, disable=not show, dynamic_ncols=True, mininterval=0.2, **options)


def setup_logging(verbose: int) -> None:
    """Send log records to stderr as ``mqctl: warning: ...`` (the clients log each retry at WARNING).

    Args:
        verbose: 0 = warnings and errors, 1 = also INFO, 2 or more = DEBUG (every request).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LevelFormatter("mqctl: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    # The HTTP client's retry warnings only with -v: without it, a server that does not answer is one error line.
    logging.getLogger("mqcore.client._http").setLevel(logging.ERROR if verbose == 0 else logging.NOTSET)
    if verbose < 2:
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("httpcore").setLevel(logging.WARNING)


class _LevelFormatter(logging.Formatter):
    """Lower-case level names (``mqctl: warning: ...``), matching the ``mqctl: <code>: ...`` error lines."""

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        return super().format(record)


class StopSignal:
    """SIGINT and SIGTERM set an event instead of killing the process; the old handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Set from another thread: a handler runs in the main thread between two bytecodes, possibly while that
        # thread holds the event's own lock (inside Event.wait or is_set), and Event.set() there would wait for
        # that lock forever: `mqctl tail` once ignored a SIGTERM for 60 s in CI (cpython gh-126434 is the same
        # deadlock in multiprocessing.Event).
        threading.Thread(target=self.event.set, name="mqctl-stop", daemon=True).start()

    def __enter__(self) -> threading.Event:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self.event

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
