"""mqctl's commands: ``queues``, ``receive``, ``tail``, ``purge``, ``redrive``, ``dead-letters``.

Each goes through the group's one client (:meth:`ClientOptions.client`), a
:class:`~mqcore.client.api.QueueClient`, so HTTP and brokerless modes behave
the same (docs/mqctl.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mqcore.attributes import MAX_RECEIVE_MESSAGES, MAX_VISIBILITY_TIMEOUT_SECONDS, MAX_WAIT_SECONDS
from mqcore.ctl._group import ClientOptions, cli, optional_count, parse_queue_attributes, pass_options
from mqcore.ctl._output import (
    EXIT_ERROR,
    EXIT_NOINPUT,
    EXIT_OK,
    CtlError,
    StopSignal,
    exit_code_for,
    message_json,
    note,
    peeked_json,
    progress_bar,
    report,
    write_json,
    write_line,
    write_message,
)
from mqcore.errors import MQError
from mqcore.redrive import DEFAULT_REDRIVE_RATE

if TYPE_CHECKING:
    from mqcore.client.api import QueueClient
    from mqcore.client.types import PeekedMessage

_F = TypeVar("_F", bound=Callable[..., Any])

#: Scans of the queue a message id may be missing from before ``tail`` forgets it: a message that is
#: being moved (redelivered, dead-lettered) during one scan is left out of that scan only, and must not be
#: printed a second time when it shows up again.
TAIL_FORGET_AFTER_SCANS = 10
#: Seconds between two status reads of ``redrive --wait``.
REDRIVE_POLL_SECONDS = 0.5


# -- queues -----------------------------------------------------------------------------------------------


@cli.group()
def queues() -> None:
    """List, create, delete and inspect queues."""


@queues.command("list")
@click.option("--prefix", default="", help="Only queues whose name starts with this.")
@pass_options
def queues_list(opts: ClientOptions, prefix: str) -> None:
    """Print the queue names, one per line, sorted."""
    for name in opts.client().list_queues(prefix):
        write_line(name)


def attribute_pairs(flag: str, name: str, help_text: str) -> Callable[[_F], _F]:
    """A repeatable ``KEY=VALUE`` option of queue attributes, read with :func:`parse_queue_attributes`."""
    return click.option(flag, name, multiple=True, metavar="KEY=VALUE", help=help_text)


@queues.command("create")
@click.argument("queue")
@attribute_pairs(
    "--attr",
    "attrs",
    "A queue attribute (repeatable); the value is read as JSON, else as a string: "
    "--attr visibility_timeout_seconds=60 --attr dead_letter_queue=jobs-dlq.",
)
@pass_options
def queues_create(opts: ClientOptions, queue: str, attrs: tuple[str, ...]) -> None:
    """Create QUEUE (nothing changes if it exists with the same attributes)."""
    attributes = parse_queue_attributes(attrs, "--attr")
    created = opts.client().create_queue(queue, attributes or None)
    note(f"created queue {queue}" if created else f"queue {queue} already exists")


@queues.command("delete")
@click.argument("queue")
@pass_options
def queues_delete(opts: ClientOptions, queue: str) -> None:
    """Delete QUEUE and every message in it."""
    opts.client().delete_queue(queue)
    note(f"deleted queue {queue}")


@queues.command("attributes")
@click.argument("queue")
@attribute_pairs(
    "--set", "changes", "Change an attribute (repeatable); the value is read as JSON (null = back to the default)."
)
@pass_options
def queues_attributes(opts: ClientOptions, queue: str, changes: tuple[str, ...]) -> None:
    """Print QUEUE's effective attributes as JSON (after the --set changes, if any)."""
    client = opts.client()
    updates = parse_queue_attributes(changes, "--set")
    attributes = client.set_attributes(queue, updates) if updates else client.get_attributes(queue)
    write_json(attributes, indent=2)


@queues.command("stats")
@click.argument("queue")
@pass_options
def queues_stats(opts: ClientOptions, queue: str) -> None:
    """Print QUEUE's statistics as JSON: ready, in_flight, delayed, oldest_ready_age_seconds, ..."""
    write_json(opts.client().queue_stats(queue), indent=2)


# -- receive ----------------------------------------------------------------------------------------------


@cli.command()
@click.argument("queue")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="Receive up to N messages.")
@optional_count(
    "--wait",
    "wait_time_seconds",
    0,
    "Wait up to SECONDS for messages (long polling) [default: the queue's receive_wait_seconds].",
)
@optional_count(
    "--visibility-timeout",
    "visibility_timeout_seconds",
    0,
    f"Seconds the messages stay in flight (0-{MAX_VISIBILITY_TIMEOUT_SECONDS}) [default: the queue's].",
)
@click.option("--delete", "delete_after", is_flag=True, help="Delete each message once it is printed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, with the receipt handle.")
@pass_options
def receive(
    opts: ClientOptions,
    queue: str,
    count: int,
    wait_time_seconds: int | None,
    visibility_timeout_seconds: int | None,
    delete_after: bool,
    as_json: bool,
) -> int:
    """Receive up to --count messages from QUEUE and print them: the body per line, or JSON lines.

    Without --delete the messages stay in flight until their visibility timeout ends (then they are
    delivered again); delete them with the receipt handle that --json prints. Prints nothing (exit 0)
    when no message came within the wait.
    """
    client = opts.client()
    deadline = time.monotonic() + (wait_time_seconds or 0)
    got = 0
    exit_code = EXIT_OK
    while got < count:
        if got:
            wait: int | None = 0  # once something came, take only what is ready now (SQS returns early too)
        elif wait_time_seconds is None:
            wait = None  # the queue's receive_wait_seconds
        else:
            wait = min(MAX_WAIT_SECONDS, max(0, round(deadline - time.monotonic())))
        messages = client.receive(
            queue,
            max_messages=min(MAX_RECEIVE_MESSAGES, count - got),
            wait_time_seconds=wait,
            visibility_timeout_seconds=visibility_timeout_seconds,
            attempt_id=f"mqctl-{uuid.uuid4().hex}",  # an automatic retry returns the same messages
        )
        if not messages:
            if not got and wait_time_seconds is not None and deadline - time.monotonic() >= 1:
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


def delete_handles(client: QueueClient, queue: str, handles: list[str]) -> int:
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


def scan_queue(client: QueueClient, queue: str) -> list[PeekedMessage]:
    """Every message of ``queue`` now (ready, in flight, delayed), oldest first, read with peek."""
    from mqcore.limits import MAX_PEEK_LIMIT

    return list(client.iter_peek(queue, page_size=MAX_PEEK_LIMIT))


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
@pass_options
def tail(opts: ClientOptions, queue: str, from_start: bool, interval_seconds: float, as_json: bool) -> int:
    """Follow QUEUE without consuming: print each message not printed before, oldest first.

    Reads the queue with peek every --interval seconds (no receive: nothing goes in flight, receive
    counts do not change). Messages that arrive with an older id (dead-lettered into QUEUE) are shown
    too. Stops with exit 0 on Ctrl-C or SIGTERM.
    """
    client = opts.client()
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
@pass_options
def purge(opts: ClientOptions, queue: str) -> None:
    """Delete every message sent to QUEUE before now (ready, in flight, delayed); print how many were removed."""
    write_line(str(opts.client().purge(queue)))


@cli.command()
@click.argument("dead_letter_queue", metavar="DLQ")
@click.option(
    "--to", "destination", default=None, help="Move every message to this queue [default: each one's source]."
)
@optional_count("--rate", "rate", 1, f"At most N messages per second [server: {DEFAULT_REDRIVE_RATE}].")
@click.option("--wait", "wait", is_flag=True, help="Wait until the redrive ends (progress bar on stderr).")
@click.option("--status", "status", is_flag=True, help="Print the status of the last redrive instead.")
@click.option("--cancel", "cancel", is_flag=True, help="Cancel the running redrive instead.")
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar for --wait [default: if stderr is a terminal]."
)
@pass_options
def redrive(
    opts: ClientOptions,
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
    client = opts.client()
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


def wait_for_redrive(client: QueueClient, queue: str, task: Mapping[str, Any], progress: bool | None) -> dict[str, Any]:
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
@pass_options
def dead_letters(opts: ClientOptions, queue: str, limit: int, as_json: bool, self_: bool) -> int:
    """Print the messages dead-lettered out of QUEUE (oldest first), without receiving them.

    Reads QUEUE's dead_letter_queue attribute and lists the messages there whose source queue is
    QUEUE (a dead-letter queue may serve several queues). With --self, QUEUE is read directly.
    """
    client = opts.client()
    if self_:
        source, wanted = queue, None
    else:
        dlq = client.get_attributes(queue).get("dead_letter_queue")
        if not dlq:
            raise CtlError("no_dead_letter_queue", f"queue {queue} has no dead_letter_queue attribute", EXIT_NOINPUT)
        source, wanted = dlq, queue
    printed = 0
    from mqcore.limits import MAX_PEEK_LIMIT

    for message in client.iter_peek(source, page_size=min(MAX_PEEK_LIMIT, max(limit, 100))):
        if wanted is not None and message.source_queue != wanted:
            continue
        write_message(message.body, peeked_json(message) if as_json else None)
        printed += 1
        if printed >= limit:
            break
    return EXIT_OK
