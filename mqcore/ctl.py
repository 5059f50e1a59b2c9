"""mqctl: the command line of mq, over HTTP (``--url``) or brokerless on a root folder (``--root``).

One click group with the commands of ``docs/mqctl.md``: ``queues``
(list, create, delete, attributes, stats), ``send`` (one message, or one per
line of a file or stdin, in batches with a progress bar), ``receive``,
``tail`` (follow a queue without consuming: peek polling), ``purge``,
``redrive`` and ``dead-letters``. Every command goes through one client with
the interface of ``mqcore.client`` (``mqcore.client.connect``: a
:class:`~mqcore.client.Client` for a URL, a :class:`~mqcore.client.LocalClient`
for a root), so both modes behave the same.

Output is for scripts: stdout carries only data (bodies, message ids, JSON
objects or JSON lines); stderr carries progress bars, short notes and errors.
Every error is one line ``mqctl: <code>: <message>`` on stderr and a
sysexits.h exit code (:data:`EXIT_USAGE` ...), so a shell script can tell a
typo from a missing queue from a server that is down.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any, BinaryIO

import click
from click.core import ParameterSource

from mqcore.client import BatchEntry, Message, PeekedMessage, connect
from mqcore.client._types import TEXT_CONTENT_TYPE
from mqcore.errors import (
    ConnectionFailed,
    InvalidRequest,
    MessageNotFound,
    MQError,
    QueueFull,
    QueueNotFound,
    StorageUnavailable,
)

__all__ = [
    "EXIT_DATAERR",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_IOERR",
    "EXIT_NOINPUT",
    "EXIT_OK",
    "EXIT_TEMPFAIL",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "cli",
    "exit_code_for",
    "main",
]

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

#: Default server URL (env MQ_URL).
DEFAULT_URL = "http://127.0.0.1:8080"
#: Messages per batch request of a bulk send (SQS's SendMessageBatch limit, and mq's default).
SEND_BATCH_SIZE = 10
#: Messages per receive request (SQS: MaxNumberOfMessages 1-10).
RECEIVE_BATCH_SIZE = 10
#: Longest wait of one receive request, in seconds (SQS: WaitTimeSeconds 0-20); longer ``--wait`` loops.
MAX_WAIT_SECONDS_PER_RECEIVE = 20
#: Messages per peek page read by ``tail`` and ``dead-letters`` (the server's maximum, docs/api.md).
PEEK_PAGE_SIZE = 1000
#: Scans of the queue a message id may be missing from before ``tail`` forgets it: a message that is
#: being moved (redelivered, dead-lettered) during one scan is left out of that scan only, and must not be
#: printed a second time when it shows up again.
TAIL_FORGET_AFTER_SCANS = 10
#: Seconds between two status reads of ``redrive --wait``.
REDRIVE_POLL_SECONDS = 0.5


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


def message_json(message: Message) -> dict[str, Any]:
    """The ``receive --json`` object of a received message."""
    return {
        "message_id": message.message_id,
        "receipt_handle": message.receipt_handle,
        "receive_count": message.receive_count,
        "sent_ms": message.sent_ms,
        "content_type": message.content_type,
        "attributes": dict(message.attributes),
        **body_fields(message.body),
    }


def peeked_json(message: PeekedMessage) -> dict[str, Any]:
    """The ``tail --json`` / ``dead-letters --json`` object of a peeked message."""
    return {
        "message_id": message.message_id,
        "queue": message.queue,
        "state": message.state,
        "receive_count": message.receive_count,
        "sent_ms": message.sent_ms,
        "visible_at_ms": message.visible_at_ms,
        "source_queue": message.source_queue,
        "content_type": message.content_type,
        "attributes": dict(message.attributes),
        **body_fields(message.body),
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


# -- parameters -------------------------------------------------------------------------------------------


def split_pair(text: str, what: str, option: str) -> tuple[str, str]:
    """Split ``key=value`` at the first ``=``.

    Raises:
        click.BadParameter: No ``=`` or an empty key (exit 64).
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected {what}=VALUE, got {text!r}", param_hint=option)
    return key, value


def parse_queue_attributes(pairs: Sequence[str], option: str) -> dict[str, Any]:
    """Queue attributes from ``key=value`` pairs: a value is read as JSON (``60``, ``null``), else taken as a string.

    Raises:
        click.BadParameter: A pair has no ``=`` (exit 64).
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, raw = split_pair(pair, "KEY", option)
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def parse_message_attributes(pairs: Sequence[str]) -> dict[str, str] | None:
    """Message attributes (name -> string) from ``name=value`` pairs; None when there are none.

    Raises:
        click.BadParameter: A pair has no ``=`` (exit 64).
    """
    out = dict(split_pair(pair, "NAME", "--attr") for pair in pairs)
    return out or None


def default_content_type(body: bytes) -> str | None:
    """``text/plain; charset=utf-8`` for a UTF-8 body, None (the server's application/octet-stream) otherwise."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return TEXT_CONTENT_TYPE


# -- the client -------------------------------------------------------------------------------------------


@dataclass
class Settings:
    """Where mqctl sends its requests, from the group's options.

    Attributes:
        url: Base URL of mq (used when ``root`` is None).
        root: Root folder for brokerless mode, or None.
        retries: Extra attempts of an HTTP request after a connection failure, 503 or 429.
        timeout_seconds: HTTP timeout of a request, in seconds (a long poll adds its wait).
    """

    url: str
    root: str | None
    retries: int
    timeout_seconds: float
    _client: Any = field(default=None, repr=False)

    def client(self) -> Any:
        """The client, opened on first use (``--help`` and usage errors never connect)."""
        if self._client is None:
            if self.root is not None:
                self._client = connect(self.root)
            else:
                self._client = connect(self.url, timeout_seconds=self.timeout_seconds, max_retries=self.retries)
        return self._client

    def close(self) -> None:
        """Close the client if one was opened."""
        if self._client is not None:
            client, self._client = self._client, None
            client.close()


#: Passes the group's :class:`Settings` to a command as its first argument.
pass_settings = click.make_pass_decorator(Settings)


# -- the group --------------------------------------------------------------------------------------------


@click.group(name="mqctl", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--url",
    default=DEFAULT_URL,
    envvar="MQ_URL",
    show_envvar=True,
    show_default=True,
    help="Base URL of the mq server.",
)
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, dir_okay=True),
    default=None,
    envvar="MQ_ROOT",
    show_envvar=True,
    help="Work brokerless on this root folder (the one the daemons use) instead of a server.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=3,
    envvar="MQ_RETRIES",
    show_envvar=True,
    show_default=True,
    help="HTTP only: extra attempts after a connection failure, 503 or 429 (0 = fail at once).",
)
@click.option(
    "--timeout",
    "timeout_seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    envvar="MQ_TIMEOUT",
    show_envvar=True,
    show_default=True,
    help="HTTP only: seconds to wait for an answer (a long poll adds its wait).",
)
@click.option("-v", "--verbose", count=True, help="Log more on stderr: -v info, -vv debug (every HTTP request).")
@click.version_option(package_name="mq", prog_name="mqctl")
@click.pass_context
def cli(ctx: click.Context, url: str, root: str | None, retries: int, timeout_seconds: float, verbose: int) -> None:
    """mqctl: manage mq queues and send, receive and inspect messages.

    Talks to the server at --url (env MQ_URL), or, with --root DIR (env MQ_ROOT), works on the
    folder tree directly with no server (brokerless; safe alongside running daemons).
    stdout carries only data; progress and errors go to stderr.
    """
    if root is not None:
        url_source = ctx.get_parameter_source("url")
        root_source = ctx.get_parameter_source("root")
        if url_source == root_source and url_source in (
            ParameterSource.COMMANDLINE,
            ParameterSource.ENVIRONMENT,
        ):
            which = "--url and --root" if url_source == ParameterSource.COMMANDLINE else "MQ_URL and MQ_ROOT"
            raise click.UsageError(f"give only one of {which}", ctx)
        if url_source == ParameterSource.COMMANDLINE:
            root = None  # --url on the command line beats MQ_ROOT in the environment
    if root is None and not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"expected an http:// or https:// URL, got {url!r}", ctx, param_hint="--url")
    setup_logging(verbose)
    global _server_url
    _server_url = url if root is None else None
    settings = Settings(url=url, root=root, retries=retries, timeout_seconds=timeout_seconds)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


# -- queues -----------------------------------------------------------------------------------------------


@cli.group()
def queues() -> None:
    """List, create, delete and inspect queues."""


@queues.command("list")
@click.option("--prefix", default="", help="Only queues whose name starts with this.")
@pass_settings
def queues_list(settings: Settings, prefix: str) -> None:
    """Print the queue names, one per line, sorted."""
    for name in settings.client().list_queues(prefix):
        write_line(name)


@queues.command("create")
@click.argument("queue")
@click.option(
    "--attr",
    "attrs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A queue attribute (repeatable); the value is read as JSON, else as a string: "
    "--attr visibility_timeout_seconds=60 --attr dead_letter_queue=jobs-dlq.",
)
@pass_settings
def queues_create(settings: Settings, queue: str, attrs: tuple[str, ...]) -> None:
    """Create QUEUE (nothing changes if it exists with the same attributes)."""
    attributes = parse_queue_attributes(attrs, "--attr")
    created = settings.client().create_queue(queue, attributes or None)
    note(f"created queue {queue}" if created else f"queue {queue} already exists")


@queues.command("delete")
@click.argument("queue")
@pass_settings
def queues_delete(settings: Settings, queue: str) -> None:
    """Delete QUEUE and every message in it."""
    settings.client().delete_queue(queue)
    note(f"deleted queue {queue}")


@queues.command("attributes")
@click.argument("queue")
@click.option(
    "--set",
    "changes",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change an attribute (repeatable); the value is read as JSON (null = back to the default).",
)
@pass_settings
def queues_attributes(settings: Settings, queue: str, changes: tuple[str, ...]) -> None:
    """Print QUEUE's effective attributes as JSON (after the --set changes, if any)."""
    client = settings.client()
    updates = parse_queue_attributes(changes, "--set")
    attributes = client.set_attributes(queue, updates) if updates else client.get_attributes(queue)
    write_json(attributes, indent=2)


@queues.command("stats")
@click.argument("queue")
@pass_settings
def queues_stats(settings: Settings, queue: str) -> None:
    """Print QUEUE's statistics as JSON: ready, in_flight, delayed, oldest_ready_age_seconds, ..."""
    write_json(settings.client().queue_stats(queue), indent=2)


# -- send -------------------------------------------------------------------------------------------------


@cli.command()
@click.argument("queue")
@click.argument("body", required=False)
@click.option(
    "--file",
    "path",
    metavar="FILE",
    help="Send one message per line of FILE ('-' = lines of stdin), in batches of 10.",
)
@click.option("--content-type", default=None, help="Content type of the message(s) [default: text/plain if UTF-8].")
@click.option("--delay", "delay_seconds", type=click.IntRange(min=0), default=None, help="Delay in seconds (0-900).")
@click.option("--attr", "attrs", multiple=True, metavar="NAME=VALUE", help="A message attribute (repeatable).")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr for --file [default: when stderr is a terminal].",
)
@click.option("--ids", is_flag=True, help="With --file: print each message id on stdout, in line order.")
@pass_settings
def send(
    settings: Settings,
    queue: str,
    body: str | None,
    path: str | None,
    content_type: str | None,
    delay_seconds: int | None,
    attrs: tuple[str, ...],
    progress: bool | None,
    ids: bool,
) -> int:
    """Send a message to QUEUE and print its message id.

    The body is BODY, or all of stdin when BODY is missing or '-'. With --file, each line (without its
    line ending) is one message; a summary goes to stderr.
    """
    attributes = parse_message_attributes(attrs)
    if path is not None:
        if body is not None:
            raise click.UsageError("give either BODY or --file, not both")
        return send_lines(settings, queue, path, content_type, delay_seconds, attributes, progress, ids)
    if body is None or body == "-":
        data = read_stdin()
        payload: bytes | str = data
        content_type = content_type or default_content_type(data)
    else:
        payload = body
    message_id = settings.client().send(
        queue, payload, content_type=content_type, attributes=attributes, delay_seconds=delay_seconds
    )
    write_line(message_id)
    return EXIT_OK


def read_stdin() -> bytes:
    """All of stdin as bytes.

    Raises:
        CtlError: stdin cannot be read (exit 74).
    """
    try:
        return sys.stdin.buffer.read()
    except OSError as exc:
        raise CtlError("io_error", f"cannot read stdin: {exc.strerror or exc}", EXIT_IOERR) from exc


@contextlib.contextmanager
def open_lines(path: str) -> Iterator[tuple[Iterator[bytes], int | None]]:
    """Open ``path`` ('-' = stdin) for reading lines; yield (lines without their line endings, line count or None).

    The line count (for the progress bar) is known for a regular file only.

    Raises:
        CtlError: The file cannot be opened or read (exit 74), also while iterating.
    """
    if path == "-":
        yield read_lines(sys.stdin.buffer, "stdin"), None
        return
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, after the caller is done
    except OSError as exc:
        raise CtlError("io_error", f"cannot read {path}: {exc.strerror or exc}", EXIT_IOERR) from exc
    with fh:
        total = count_lines(fh, path)
        yield read_lines(fh, path), total


def count_lines(fh: BinaryIO, path: str) -> int | None:
    """Lines in a regular file (a last line without a newline counts), read in 1 MiB blocks; None for pipes.

    Raises:
        CtlError: A read failed (exit 74).
    """
    try:
        if not os.path.isfile(path):
            return None
        count = 0
        last = b"\n"
        while block := fh.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
        fh.seek(0)
    except OSError as exc:
        raise CtlError("io_error", f"cannot read {path}: {exc.strerror or exc}", EXIT_IOERR) from exc
    return count + (last != b"\n")


def read_lines(fh: IO[bytes], name: str) -> Iterator[bytes]:
    """The lines of ``fh`` without ``\\n`` or ``\\r\\n``.

    Raises:
        CtlError: A read failed (exit 74).
    """
    try:
        for line in fh:
            if line.endswith(b"\n"):
                line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
            yield line
    except OSError as exc:
        raise CtlError("io_error", f"cannot read {name}: {exc.strerror or exc}", EXIT_IOERR) from exc


def plural(count: int, noun: str = "message") -> str:
    """``1 message``, ``2 messages``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def chunks(items: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    chunk: list[bytes] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def send_lines(
    settings: Settings,
    queue: str,
    path: str,
    content_type: str | None,
    delay_seconds: int | None,
    attributes: dict[str, str] | None,
    progress: bool | None,
    print_ids: bool,
) -> int:
    """Send each line of ``path`` as one message, in batches of :data:`SEND_BATCH_SIZE`, in line order.

    Stops after the first batch with a failed entry (the lines after that batch are not sent): each
    failed line is reported on stderr by number, and the exit code is the first failure's. The other
    entries of that batch may have been sent.

    Returns:
        0 when every line was sent, else the exit code of the first failed entry.
    Raises:
        CtlError: The file cannot be read (exit 74).
        MQError: A whole batch request failed (queue not found, server unreachable, ...).
    """
    client = settings.client()
    sent = 0
    lines_done = 0
    failed: list[tuple[int, MQError]] = []  # (line number from 1, error)
    where = "stdin" if path == "-" else path
    with open_lines(path) as (lines, total), progress_bar(progress, total=total, unit="msg", desc=queue) as bar:
        try:
            for chunk in chunks(lines, SEND_BATCH_SIZE):
                entries = [
                    BatchEntry(
                        body=line,
                        content_type=content_type or default_content_type(line),
                        attributes=attributes,
                        delay_seconds=delay_seconds,
                    )
                    for line in chunk
                ]
                results = client.send_batch(queue, entries, batch_size=SEND_BATCH_SIZE)
                for index, result in enumerate(results):
                    if isinstance(result, MQError):
                        failed.append((lines_done + index + 1, result))
                    elif print_ids:
                        write_line(result)
                sent += sum(1 for r in results if not isinstance(r, MQError))
                lines_done += len(chunk)
                bar.update(len(chunk))
                if failed:
                    break
        except MQError:
            bar.close()
            note(f"sent {plural(sent)} to {queue} from {where} before the error")
            raise
    for line_number, error in failed:
        report(error.code, f"line {line_number}: {error.message}")
    if failed:
        note(f"sent {plural(sent)} of the first {lines_done} lines to {queue} from {where}; stopped there")
        return exit_code_for(failed[0][1])
    note(f"sent {plural(sent)} to {queue} from {where}")
    return EXIT_OK


# -- receive ----------------------------------------------------------------------------------------------


@cli.command()
@click.argument("queue")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="Receive up to N messages.")
@click.option(
    "--wait",
    "wait_seconds",
    type=click.IntRange(min=0),
    default=None,
    help="Wait up to SECONDS for messages (long polling) [default: the queue's receive_wait_seconds].",
)
@click.option(
    "--visibility-timeout",
    "visibility_timeout_seconds",
    type=click.IntRange(min=0),
    default=None,
    help="Seconds the messages stay in flight (0-43200) [default: the queue's].",
)
@click.option("--delete", "delete_after", is_flag=True, help="Delete each message once it is printed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, with the receipt handle.")
@pass_settings
def receive(
    settings: Settings,
    queue: str,
    count: int,
    wait_seconds: int | None,
    visibility_timeout_seconds: int | None,
    delete_after: bool,
    as_json: bool,
) -> int:
    """Receive up to --count messages from QUEUE and print them: the body per line, or JSON lines.

    Without --delete the messages stay in flight until their visibility timeout ends (then they are
    delivered again); delete them with the receipt handle that --json prints. Prints nothing (exit 0)
    when no message came within the wait.
    """
    client = settings.client()
    deadline = time.monotonic() + (wait_seconds or 0)
    got = 0
    exit_code = EXIT_OK
    while got < count:
        if got:
            wait: int | None = 0  # once something came, take only what is ready now (SQS returns early too)
        elif wait_seconds is None:
            wait = None  # the queue's receive_wait_seconds
        else:
            wait = min(MAX_WAIT_SECONDS_PER_RECEIVE, max(0, round(deadline - time.monotonic())))
        messages = client.receive(
            queue,
            max_messages=min(RECEIVE_BATCH_SIZE, count - got),
            wait_time_seconds=wait,
            visibility_timeout_seconds=visibility_timeout_seconds,
            attempt_id=f"mqctl-{uuid.uuid4().hex}",  # an automatic retry returns the same messages
        )
        if not messages:
            if not got and wait_seconds is not None and deadline - time.monotonic() >= 1:
                continue  # a --wait longer than one long poll: poll again
            break
        got += len(messages)
        written: list[str] = []
        try:
            for message in messages:
                write_message(message.body, message_json(message) if as_json else None)
                written.append(message.receipt_handle)
        finally:
            if delete_after and written:
                exit_code = exit_code or delete_handles(client, queue, written)
    return exit_code


def delete_handles(client: Any, queue: str, handles: list[str]) -> int:
    """Delete received messages by receipt handle; report each failure on stderr.

    Returns:
        0, or the exit code of the first failed delete.
    """
    results = client.delete_batch(queue, handles)
    code = EXIT_OK
    for result in results:
        if isinstance(result, MQError):
            report(result.code, f"delete failed: {result.message}")
            code = code or exit_code_for(result)
    return code


# -- tail -------------------------------------------------------------------------------------------------


class StopSignal:
    """SIGINT and SIGTERM set an event instead of killing the process; the old handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()

    def __enter__(self) -> threading.Event:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self.event

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def scan_queue(client: Any, queue: str) -> list[PeekedMessage]:
    """Every message of ``queue`` now (ready, in flight, delayed), oldest first, read with peek."""
    return list(client.iter_peek(queue, page_size=PEEK_PAGE_SIZE))


@cli.command()
@click.argument("queue")
@click.option("--from-start", is_flag=True, help="First print the messages already in the queue.")
@click.option(
    "--interval",
    "interval_seconds",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between two looks at the queue.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (id, state, receive count, body, ...).")
@pass_settings
def tail(settings: Settings, queue: str, from_start: bool, interval_seconds: float, as_json: bool) -> int:
    """Follow QUEUE without consuming: print each message not printed before, oldest first.

    Reads the queue with peek every --interval seconds (no receive: nothing goes in flight, receive
    counts do not change). Messages that arrive with an older id (dead-lettered into QUEUE) are shown
    too. Stops with exit 0 on Ctrl-C or SIGTERM.
    """
    client = settings.client()
    seen: dict[str, int] = {}  # message id -> number of the last scan that saw it
    scans = 0
    with StopSignal() as stop:
        while True:
            current = scan_queue(client, queue)
            scans += 1
            for message in current:
                if message.message_id not in seen and (from_start or scans > 1):
                    write_message(message.body, peeked_json(message) if as_json else None)
                seen[message.message_id] = scans
            if scans == 1:
                note(f"following queue {queue} (Ctrl-C to stop)")
            if scans % TAIL_FORGET_AFTER_SCANS == 0:
                seen = {k: v for k, v in seen.items() if scans - v < TAIL_FORGET_AFTER_SCANS}
            if stop.wait(interval_seconds):
                return EXIT_OK


# -- purge, redrive, dead letters -------------------------------------------------------------------------


@cli.command()
@click.argument("queue")
@pass_settings
def purge(settings: Settings, queue: str) -> None:
    """Delete every message sent to QUEUE before now (ready, in flight, delayed); print how many were removed."""
    write_line(str(settings.client().purge(queue)))


@cli.command()
@click.argument("dead_letter_queue", metavar="DLQ")
@click.option(
    "--to", "destination", default=None, help="Move every message to this queue [default: each one's source]."
)
@click.option("--rate", type=click.IntRange(min=1), default=None, help="At most N messages per second [server: 500].")
@click.option("--wait", "wait", is_flag=True, help="Wait until the redrive ends (progress bar on stderr).")
@click.option("--status", "status", is_flag=True, help="Print the status of the last redrive instead.")
@click.option("--cancel", "cancel", is_flag=True, help="Cancel the running redrive instead.")
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar for --wait [default: if stderr is a terminal]."
)
@pass_settings
def redrive(
    settings: Settings,
    dead_letter_queue: str,
    destination: str | None,
    rate: int | None,
    wait: bool,
    status: bool,
    cancel: bool,
    progress: bool | None,
) -> int:
    """Move the messages of the dead-letter queue DLQ back to their source queues (or --to a queue).

    Prints the redrive task status as JSON. With --wait, waits until it ends and prints the final
    status; a redrive that ends failed or cancelled exits 1.
    """
    client = settings.client()
    if status or cancel:
        if status and cancel:
            raise click.UsageError("give only one of --status and --cancel")
        if destination is not None or rate is not None or wait:
            raise click.UsageError("--to, --rate and --wait start a redrive; they do not go with --status or --cancel")
        task = client.redrive_status(dead_letter_queue) if status else client.cancel_redrive(dead_letter_queue)
        write_json(task, indent=2)
        return EXIT_OK
    task = client.start_redrive(dead_letter_queue, destination=destination, max_messages_per_second=rate)
    if wait:
        task = wait_for_redrive(client, dead_letter_queue, task, progress)
    write_json(task, indent=2)
    if wait and task.get("state") == "running":  # SIGINT/SIGTERM stopped the waiting
        note(f"stopped waiting; the redrive of {dead_letter_queue} goes on (see --status)")
    elif wait and task.get("state") != "completed":
        reason = f": {task['error']}" if task.get("error") else ""
        report("redrive_" + str(task.get("state")), f"redrive of {dead_letter_queue} ended {task.get('state')}{reason}")
        return EXIT_ERROR
    return EXIT_OK


def wait_for_redrive(client: Any, queue: str, task: Mapping[str, Any], progress: bool | None) -> dict[str, Any]:
    """Poll the redrive status every :data:`REDRIVE_POLL_SECONDS` until it is not ``running``; return the last status.

    Stops early (with the last status read) on SIGINT/SIGTERM; the redrive itself goes on.
    """
    current = dict(task)
    with (
        StopSignal() as stop,
        progress_bar(progress, total=current.get("to_move") or None, unit="msg", desc=f"redrive {queue}") as bar,
    ):
        while current.get("state") == "running":
            bar.total = current.get("to_move") or bar.total
            bar.n = int(current.get("moved") or 0)
            bar.refresh()
            if stop.wait(REDRIVE_POLL_SECONDS):
                break
            current = dict(client.redrive_status(queue) or current)
        bar.n = int(current.get("moved") or 0)
        bar.refresh()
    return current


@cli.command("dead-letters")
@click.argument("queue")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="Print at most N messages.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per line (id, receive count, source queue, ...)."
)
@click.option("--self", "self_", is_flag=True, help="QUEUE is the dead-letter queue itself: list all its messages.")
@pass_settings
def dead_letters(settings: Settings, queue: str, limit: int, as_json: bool, self_: bool) -> int:
    """Print the messages dead-lettered out of QUEUE (oldest first), without receiving them.

    Reads QUEUE's dead_letter_queue attribute and lists the messages there whose source queue is
    QUEUE (a dead-letter queue may serve several queues). With --self, QUEUE is read directly.
    """
    client = settings.client()
    if self_:
        source, wanted = queue, None
    else:
        dlq = client.get_attributes(queue).get("dead_letter_queue")
        if not dlq:
            raise CtlError("no_dead_letter_queue", f"queue {queue} has no dead_letter_queue attribute", EXIT_NOINPUT)
        source, wanted = dlq, queue
    printed = 0
    for message in client.iter_peek(source, page_size=min(PEEK_PAGE_SIZE, max(limit, 100))):
        if wanted is not None and message.source_queue != wanted:
            continue
        write_message(message.body, peeked_json(message) if as_json else None)
        printed += 1
        if printed >= limit:
            break
    return EXIT_OK


# -- entry point ------------------------------------------------------------------------------------------


#: The server URL of this run (None when brokerless), for the one-line "not answering" error.
_server_url: str | None = None


def _usage_error(exc: click.UsageError) -> int:
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        click.echo(exc.format_message(), err=True)
        return EXIT_USAGE
    report("usage", exc.format_message())
    if exc.ctx is not None:
        note(f"Try '{exc.ctx.command_path} --help' for help.")
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mqctl`` console script; returns the exit code (see the ``EXIT_*`` constants)."""
    try:
        rv = cli.main(args=argv, prog_name="mqctl", standalone_mode=False)
    except click.UsageError as exc:
        return _usage_error(exc)
    except ConnectionFailed as exc:
        if _server_url is None:
            return _fail(exc.code, exc.message, exit_code_for(exc))
        reason = exc.details.get("reason", "no answer")
        return _fail(
            exc.code, f"the server at {_server_url} is not answering ({reason}); is mq running?", EXIT_UNAVAILABLE
        )
    except MQError as exc:
        return _fail(exc.code, exc.message, exit_code_for(exc))
    except CtlError as exc:
        return _fail(exc.code, exc.message, exc.exit_code)
    except StdoutClosed:
        return EXIT_ERROR
    except click.ClickException as exc:
        return _fail("error", exc.format_message(), EXIT_ERROR)
    except click.Abort:
        return EXIT_INTERRUPTED
    except OSError as exc:  # the brokerless root: permissions, a vanished folder
        return _fail("io_error", str(exc), EXIT_IOERR)
    return int(rv or 0)


def _fail(code: str, message: str, exit_code: int) -> int:
    report(code, message)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
