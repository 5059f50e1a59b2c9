"""``mqctl send``: one message from an argument or stdin, or one per line of a file in batches."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO, BinaryIO

import click

from mqcore.attributes import MAX_DELAY_SECONDS
from mqcore.client.types import BatchEntry
from mqcore.ctl._group import (
    ClientOptions,
    cli,
    default_content_type,
    optional_count,
    parse_message_attributes,
    pass_options,
)
from mqcore.ctl._output import EXIT_IOERR, EXIT_OK, CtlError, exit_code_for, note, progress_bar, report, write_line
from mqcore.errors import MQError
from mqcore.limits import DEFAULT_BATCH_MESSAGES

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
@optional_count("--delay", "delay_seconds", 0, f"Delay in seconds (0-{MAX_DELAY_SECONDS}).")
@click.option("--attr", "attrs", multiple=True, metavar="NAME=VALUE", help="A message attribute (repeatable).")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr for --file [default: when stderr is a terminal].",
)
@click.option("--ids", is_flag=True, help="With --file: print each message id on stdout, in line order.")
@click.option("--group-id", default=None, help="FIFO queues (names ending .fifo): the message group (required there).")
@click.option(
    "--dedup-id", default=None, help="FIFO queues: the deduplication id of BODY [default: content-based, if enabled]."
)
@pass_options
def send(
    opts: ClientOptions,
    queue: str,
    body: str | None,
    path: str | None,
    content_type: str | None,
    delay_seconds: int | None,
    attrs: tuple[str, ...],
    progress: bool | None,
    ids: bool,
    group_id: str | None,
    dedup_id: str | None,
) -> int:
    """Send a message to QUEUE and print its message id.

    The body is BODY, or all of stdin when BODY is missing or '-'. With --file, each line (without its
    line ending) is one message; a summary goes to stderr.
    """
    attributes = parse_message_attributes(attrs)
    if path is not None:
        if body is not None:
            raise click.UsageError("give either BODY or --file, not both")
        if dedup_id is not None:
            raise click.UsageError("--dedup-id is for one message: --file lines are deduplicated by content")
        return send_lines(opts, queue, path, content_type, delay_seconds, attributes, progress, ids, group_id)
    if body is None or body == "-":
        data = read_stdin()
        payload: bytes | str = data
        content_type = content_type or default_content_type(data)
    else:
        payload = body
    if group_id is not None or dedup_id is not None:  # FIFO queues: the ids travel in a batch entry
        entry = BatchEntry(payload, content_type, attributes, delay_seconds, group_id, dedup_id)
        result = opts.client().send_batch(queue, [entry])[0]
        if isinstance(result, MQError):
            raise result
        message_id = result
    else:
        message_id = opts.client().send(
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
    opts: ClientOptions,
    queue: str,
    path: str,
    content_type: str | None,
    delay_seconds: int | None,
    attributes: dict[str, str] | None,
    progress: bool | None,
    print_ids: bool,
    group_id: str | None = None,
) -> int:
    """Send each line of ``path`` as one message, in batches of :data:`DEFAULT_BATCH_MESSAGES`, in line order.

    Stops after the first batch with a failed entry (the lines after that batch are not sent): each
    failed line is reported on stderr by number, and the exit code is the first failure's. The other
    entries of that batch may have been sent.

    Returns:
        0 when every line was sent, else the exit code of the first failed entry.
    Raises:
        CtlError: The file cannot be read (exit 74).
        MQError: A whole batch request failed (queue not found, server unreachable, ...).
    """
    client = opts.client()
    sent = 0
    lines_done = 0
    failed: list[tuple[int, MQError]] = []  # (line number from 1, error)
    where = "stdin" if path == "-" else path
    with open_lines(path) as (lines, total), progress_bar(progress, total=total, unit="msg", desc=queue) as bar:
        try:
            for chunk in chunks(lines, DEFAULT_BATCH_MESSAGES):
                entries = [
                    BatchEntry(
                        body=line,
                        content_type=content_type or default_content_type(line),
                        attributes=attributes,
                        delay_seconds=delay_seconds,
                        group_id=group_id,
                    )
                    for line in chunk
                ]
                results = client.send_batch(queue, entries, batch_size=DEFAULT_BATCH_MESSAGES)
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
