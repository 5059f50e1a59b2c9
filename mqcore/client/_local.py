"""Brokerless client: the client interface run directly on a queue root, with no daemon.

:class:`LocalClient` does what ``mq``, ``mq-mover`` and ``mq-reaper`` would do
for each call, in this process, through :class:`mqcore.protocol.Store`: the
same renames of the same file names (``docs/protocol.md``), so it is safe
alongside running daemons and other brokerless processes on the same root
(VSQS: "does not require active broker daemons"). What the daemons do in the
background happens here on the call that needs it, in the modules beside this one:

- ``_local_send``: the checks of a send and capacity admission (a send to a
  full queue waits up to ``capacity_wait_seconds``, woken by inotify, then
  raises :class:`QueueFull`, as the broker);
- ``_local_receive``: redelivery of due ``delay/`` files and dead-lettering
  (mq-mover's job), FIFO leasing, long polling, attempt records;
  reaping of removed files (mq-reaper's job);
- ``_local_waiters``: the inotify watches that wake long polls and capacity
  waits, and the operations (generators) the calls that wait are written as;
- ``_local_redrive``: redrive runs synchronously and returns its final status.

The rules of a request (argument ranges, receipt-handle checks, capacity
admission, attempt records and their lock, the dead-letter and retention
policy, redrive tasks, the ``GET /{queue}`` answer) are :mod:`mqcore.service`'s,
the same code the ``mq`` daemon drives; these modules drive them synchronously
and add the waiting. :class:`~mqcore.client._local_async.AsyncLocalClient` is
the asyncio twin.
Queue defaults are :class:`QueueAttributes()` (the daemon's defaults when it
runs without options). Errors are the :mod:`mqcore.errors` classes the HTTP
API would answer for the same mistake.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Unpack

from mqcore.attributes import QueueAttributes, effective
from mqcore.client._local_receive import (
    MAX_REMEMBERED_LEASES,
    Receiver,
    as_client,
    as_message,
    reap_message,
    reap_queue,
)
from mqcore.client._local_redrive import RedriveRunner
from mqcore.client._local_send import Sender
from mqcore.client._local_waiters import RESCAN_INTERVAL_SECONDS, Op, Watches, drive
from mqcore.client._methods import OPERATION, derive
from mqcore.client._renamed import renamed_keyword
from mqcore.client.api import QueueClient, documented_by
from mqcore.client.options import PEEK_DEFAULTS, RECEIVE_DEFAULTS, PeekOptions, ReceiveOptions, SendOptions, completed
from mqcore.client.types import BatchEntry, Message, PeekedMessage, PeekPage
from mqcore.errors import InvalidRequest, MQError, QueueNotFound
from mqcore.limits import DEFAULT_BATCH_MESSAGES
from mqcore.names import IdGenerator, QueueName, check_bulk_key, check_message_id, check_queue_name
from mqcore.protocol import Store, now_ms
from mqcore.service.bulk import check_bulk_lease
from mqcore.service.handles import LeaseMemory, check_handle
from mqcore.service.queues import queue_stats
from mqcore.service.requests import (
    PEEK_LIMIT,
    VISIBILITY_TIMEOUT_SECONDS,
    check_after,
    check_partition_args,
    check_prefix,
    check_receive,
)

__all__ = ["RESCAN_INTERVAL_SECONDS", "AsyncLocalClient", "LocalClient"]

if TYPE_CHECKING:
    from mqcore.client._local_async import AsyncLocalClient


def __getattr__(name: str) -> Any:
    """``AsyncLocalClient`` lives in ``_local_async`` (it imports this module); importable from here as before."""
    if name == "AsyncLocalClient":
        from mqcore.client._local_async import AsyncLocalClient

        return AsyncLocalClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
P = ParamSpec("P")

#: One id generator per process: ids of every LocalClient in it strictly increase (FIFO).
_IDS = IdGenerator()


def _queue_stats(store: Store, defaults: QueueAttributes, name: QueueName) -> dict[str, Any]:
    """``LocalClient.queue_stats`` of an existing queue, counted from its files (:func:`mqcore.service.queue_stats`)."""
    explicit, created_ms = store.queue_settings(name)
    names = store.scan_ready(name)
    in_flight, delayed = store.count_delay(name).get(name, (0, 0))
    return queue_stats(
        name,
        ready=len(names),
        oldest_ready=min(names) if names else None,
        in_flight=in_flight,
        delayed=delayed,
        created_ms=created_ms,
        attrs=effective(explicit, defaults),
        redrive=store.read_redrive_status(name),
        now=now_ms(),
    )


def _each(
    store: Store, queue: str, items: Iterable[ItemT], one: Callable[[QueueName, ItemT], ResultT]
) -> list[ResultT | MQError]:
    """``one(queue, item)`` per item; its result or the MQError it raised, in order (QueueNotFound: none ran)."""
    name = check_queue_name(queue)
    todo = list(items)
    if todo and not store.queue_exists(name):
        raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
    out: list[ResultT | MQError] = []
    for item in todo:
        try:
            out.append(one(name, item))
        except MQError as exc:
            out.append(exc)
    return out


def _waits(op: Callable[Concatenate[LocalClient, P], Op[ResultT]]) -> Callable[Concatenate[LocalClient, P], ResultT]:
    """Method decorator for a call that may wait, written as an operation: run it here (:func:`drive`).

    The method keeps the operation (``OPERATION``) for :class:`~mqcore.client.AsyncLocalClient`,
    which drives it on its event loop; its signature is the operation's, returning its result.
    """

    def method(self: LocalClient, /, *args: P.args, **kwargs: P.kwargs) -> ResultT:
        return drive(op(self, *args, **kwargs), self.receiver.expand)

    derive(method, op, add_self=False, operation=True)
    setattr(method, OPERATION, op)
    return method


@documented_by(QueueClient)
class LocalClient(QueueClient):
    """The client interface on a queue root, with no daemon (brokerless mode).

    Its methods are the blocking client interface, documented once in
    ``mqcore.client.api.QueueClient`` (arguments, results, errors, and what
    differs brokerless: a receive redelivers the queue's due files first, a
    delete unlinks the file at once, a redrive runs in its call and returns its
    final status, ``close`` ends waiting calls at once). ``send_batch`` takes
    up to 1,000 entries per ``batch_size`` chunk (one group commit each).

    Safe alongside running ``mq``/``mq-mover``/``mq-reaper`` daemons and other
    brokerless clients on the same root (one host, or hosts sharing the root
    as ``docs/protocol.md`` section 13 allows), and across threads of this
    process (one client can serve a multi-threaded worker).

    Args:
        root: The queue root (``new/``, ``queues/``, ``delay/``, ``remove/``,
            ``attempts/`` are created if missing).
        fsync: Make writes durable before a call returns (turn off only to
            measure throughput without a disk).
    Raises:
        OSError: The root cannot be created or fsynced.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.store = Store(root, ids=_IDS, fsync=fsync)
        #: The attributes of a queue that sets none (the daemon's defaults without options).
        self.defaults = QueueAttributes()
        self.root = self.store.layout.root
        self._watches = Watches(self.store)
        self._leases = LeaseMemory(MAX_REMEMBERED_LEASES)
        #: Sends (their operations are also run by the asyncio client).
        self.sender = Sender(self.store, self.defaults, self._watches)
        #: Receives (their operations are also run by the asyncio client).
        self.receiver = Receiver(self.store, self.defaults, self._watches, self._leases)
        self._redrive = RedriveRunner(self.store)

    def __repr__(self) -> str:
        return f"LocalClient({self.root!r})"

    def close(self) -> None:
        self._watches.close()
        self.store.close()

    # -- queues -----------------------------------------------------------------

    def list_queues(self, prefix: str = "") -> list[str]:
        return list(self.store.list_queues(check_prefix(prefix)))

    def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool:
        name = check_queue_name(queue)
        if attributes is not None and not isinstance(attributes, Mapping):
            raise InvalidRequest("queue attributes must be a mapping (a JSON object)")
        return self.store.create_queue(name, dict(attributes) if attributes else None, defaults=self.defaults)

    def delete_queue(self, queue: str) -> None:
        name = check_queue_name(queue)
        self.store.delete_queue(name)
        reap_queue(self.store, name)

    def queue_stats(self, queue: str) -> dict[str, Any]:
        name = check_queue_name(queue)
        return _queue_stats(self.store, self.defaults, name)

    def get_attributes(self, queue: str) -> dict[str, Any]:
        return self.sender.attributes(check_queue_name(queue)).to_json()

    def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        name = check_queue_name(queue)
        if not isinstance(changes, Mapping):
            raise InvalidRequest("attribute changes must be a mapping (a JSON object)")
        explicit = self.store.set_attributes(name, dict(changes))
        return effective(explicit, self.defaults).to_json()

    def purge(self, queue: str) -> int:
        name = check_queue_name(queue)
        removed = self.store.purge(name)
        reap_queue(self.store, name)
        return removed

    # -- the calls that may wait: operations (``_waits``), run here and by AsyncLocalClient on its loop --

    @_waits
    def send(self, queue: str, body: bytes | str, **options: Unpack[SendOptions]) -> Op[str]:
        return self.sender.send_op(queue, BatchEntry(body, **options))

    @_waits
    def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = DEFAULT_BATCH_MESSAGES
    ) -> Op[list[str | MQError]]:
        return self.sender.send_batch_op(queue, entries, batch_size)

    @_waits
    def receive(self, queue: str, **options: Unpack[ReceiveOptions]) -> Op[list[Message]]:
        name = check_queue_name(queue)
        args = check_receive(**completed(options, RECEIVE_DEFAULTS, "receive"))
        return self.receiver.receive_op(name, args)

    # -- delete and visibility ------------------------------------------------------------

    def delete(self, queue: str, receipt_handle: str) -> None:
        name = check_queue_name(queue)
        handle = check_handle(receipt_handle, name)
        self.store.delete_by_handle(name, handle, self._leases.current(handle))
        self._leases.released(handle)
        reap_message(self.store, name, handle.message_id)

    def delete_by_id(self, queue: str, message_id: str) -> None:
        name = check_queue_name(queue)
        mid = check_message_id(message_id)
        self.store.delete(name, mid)
        reap_message(self.store, name, mid)

    def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        return _each(self.store, queue, receipt_handles, self.delete)

    @renamed_keyword("timeout_seconds", "visibility_timeout_seconds", removed_in="0.2")
    def change_visibility(self, queue: str, receipt_handle: str, visibility_timeout_seconds: int) -> int:
        name = check_queue_name(queue)
        timeout = VISIBILITY_TIMEOUT_SECONDS.check(visibility_timeout_seconds, key="field")
        handle = check_handle(receipt_handle, name)
        now = now_ms()
        current = self.store.at(now).change_visibility(name, handle, timeout * 1000, hint=self._leases.current(handle))
        if timeout == 0:
            self._leases.released(handle)
            return now
        self._leases.moved(handle, current)
        return now + timeout * 1000

    def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]:
        return _each(self.store, queue, entries, lambda name, entry: self.change_visibility(name, *entry))

    # -- bulk leases (issue 17) -------------------------------------------------------------

    def lease_bulk(
        self, queue: str, key: str, *, max_messages: int = 10, visibility_timeout_seconds: int | None = None
    ) -> list[Message]:
        name = check_queue_name(queue)
        args = check_bulk_lease(key, max_messages, visibility_timeout_seconds)
        return [as_message(m) for m in self.receiver.lease_bulk(name, args)]

    def delete_bulk(self, queue: str, key: str) -> int:
        name = check_queue_name(queue)
        return self.receiver.delete_bulk(name, check_bulk_key(key))

    # -- peek -------------------------------------------------------------------------------

    def peek(self, queue: str, **options: Unpack[PeekOptions]) -> PeekPage:
        name = check_queue_name(queue)
        args = completed(options, PEEK_DEFAULTS, "peek")
        size = PEEK_LIMIT.check(args["limit"])
        split = check_partition_args(args["partition"], args["partitions"])
        after = check_after(args["after"])
        files, next_after = self.store.peek(name, after=after, limit=size, partition=split)
        return PeekPage([as_client(PeekedMessage, f) for f in files], next_after)

    def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]:
        name = check_queue_name(queue)
        ids = [check_message_id(i) for i in message_ids]
        return [as_client(PeekedMessage, f) for f in self.store.peek_ids(name, ids)] if ids else []

    def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        return _each(self.store, queue, message_ids, self.delete_by_id)

    # -- redrive ------------------------------------------------------------------------------

    def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]:
        return self._redrive.start(queue, destination, max_messages_per_second)

    def redrive_status(self, queue: str) -> dict[str, Any] | None:
        return self._redrive.status(queue)

    def cancel_redrive(self, queue: str) -> dict[str, Any]:
        return self._redrive.cancel(queue)
