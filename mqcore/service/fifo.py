"""FIFO queues: the send rules and the receive in message-group order (docs/protocol.md 19, docs/sqs.md).

A queue is FIFO if and only if its name ends with ``.fifo`` (SQS's rule;
:func:`mqcore.names.is_fifo_queue`, a string test): standard queues never reach
this module and pay nothing for it.

- **Send** (:func:`fifo_message`, then :func:`mqcore.protocol.fifo.send_fifo`): a
  MessageGroupId is required; the MessageDeduplicationId is the one given or, on a queue
  with ``content_based_deduplication``, the SHA-256 of the body (hex); a per-message delay
  is refused (SQS: FIFO queues delay per queue only). A duplicate within 5 minutes is
  accepted and answers the first message's id without storing anything; with
  ``deduplication_scope`` ``message_group``, only a duplicate in the same group.
- **Receive** (:class:`GroupOrder`, the rules :func:`mqcore.service.receive.lease_names`
  applies to the names of FIFO queues): a message is leased only if no
  message of its group is in flight (any ``delay/`` lease of the queue's messages with the
  same group, whatever its deadline: an expired one comes back first), messages of a group
  in id order; other groups flow. After leasing, a receive that finds a lease of the same
  group it did not see before yields its own (visibility 0), so two daemons or brokerless
  clients racing on one root never both hold a group. The queue's ``delay_seconds`` applies
  here, at receive: a message is not leased before its send time plus the delay (so a change
  of the delay holds for messages already sent, as SQS's FIFO queues do).
- **SequenceNumber** (:func:`sequence_number`): the message id read as a 128-bit integer, in
  decimal: it increases with the ids, which is the queue's delivery order.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import replace

from mqcore.errors import InvalidRequest, MQError, QueueNotFound
from mqcore.fsinfo import dir_stamp
from mqcore.model import ReceivedMessage
from mqcore.names import (
    MessageId,
    QueueName,
    ReceiptHandle,
    check_fifo_id,
    is_fifo_queue,
    parse_ready_name,
    sent_ms_of,
)
from mqcore.protocol import LeasePolicy, Store
from mqcore.protocol.fifo import FifoSend, read_fifo_header, send_fifo
from mqcore.protocol.send import SendEntry
from mqcore.service.receive import LeaseOutcome

logger = logging.getLogger("mq.service")

#: Names mq's fetcher pops per round of a FIFO receive, so that messages of blocked groups are passed in
#: few rounds (each round lists ``delay/``); the ones not tried go back to the index.
FIFO_ROUND_NAMES = 1000
#: Most message ids whose group this process remembers (a group never changes, so the cache is never stale).
GROUP_CACHE_SIZE = 100_000

_groups: dict[str, tuple[str, str]] = {}
_groups_lock = threading.Lock()


def fifo_message(
    queue: QueueName,
    body: bytes,
    group_id: str | None,
    dedup_id: str | None,
    *,
    content_based_deduplication: bool,
    per_group: bool = False,
    delay_ms: int = 0,
    queue_delay_ms: int = 0,
    content_type: str | None = None,
    attributes: dict[str, str] | None = None,
    attribute_types: dict[str, str] | None = None,
) -> FifoSend:
    """Check a send to a FIFO queue and give what :func:`mqcore.protocol.fifo.send_fifo` stores.

    Args:
        queue: The FIFO queue.
        body: The body bytes.
        group_id: MessageGroupId (required, SQS).
        dedup_id: MessageDeduplicationId, or None to derive it from the body.
        content_based_deduplication: The queue's ``content_based_deduplication`` attribute.
        per_group: The queue's ``deduplication_scope`` is ``message_group`` (SQS: DeduplicationScope
            messageGroup): a deduplication id counts within its group only.
        delay_ms: The message's delay: 0, or ``queue_delay_ms`` (the queue's default a send path filled in).
            SQS: no per-message DelaySeconds on FIFO queues; the queue's applies at receive (19.3).
        queue_delay_ms: The queue's ``delay_seconds`` in ms.
        content_type: Its Content-Type, or None.
        attributes: User message attributes (checked by the caller), or None.
        attribute_types: SQS DataTypes of the attributes that are not ``String``, or None.
    Raises:
        InvalidRequest: No or a malformed group id; a malformed deduplication id; none given on a queue
            without content-based deduplication; a delay (``details["parameter"]`` names it).
    """
    if group_id is None:
        raise InvalidRequest(f"a message sent to FIFO queue {queue!r} needs a MessageGroupId", parameter="group_id")
    check_fifo_id(group_id, "group_id")
    if dedup_id is not None:
        check_fifo_id(dedup_id, "deduplication_id")
    elif content_based_deduplication:
        dedup_id = hashlib.sha256(body).hexdigest()
    else:
        raise InvalidRequest(
            f"FIFO queue {queue!r} has no content-based deduplication: a message needs a MessageDeduplicationId",
            parameter="deduplication_id",
        )
    if delay_ms and delay_ms != queue_delay_ms:
        raise InvalidRequest(
            "a message to a FIFO queue cannot have its own delay (SQS: DelaySeconds per queue only: "
            "set the queue's delay_seconds)",
            parameter="delay_seconds",
        )
    return FifoSend(body, group_id, dedup_id, content_type, attributes, attribute_types, per_group)


def sequence_number(message_id: str) -> str:
    """SQS SequenceNumber of a FIFO message: its UUIDv7 id as a 128-bit unsigned integer, in decimal."""
    return str(int(message_id.replace("-", ""), 16))


def _fifo_ids(path: str, message_id: str) -> tuple[str, str] | None:
    """``(group, dedup id)`` of a message (cached by id: immutable), read from the file at ``path``."""
    known = _cached_ids(message_id)
    if known is not None:
        return known
    found = read_fifo_header(path)
    if found is not None:
        with _groups_lock:
            if len(_groups) >= GROUP_CACHE_SIZE:
                _groups.clear()
            _groups[message_id] = found
    return found


def _cached_ids(message_id: str) -> tuple[str, str] | None:
    """``(group, dedup id)`` of ``message_id`` if this process read its header before, else None (no file read)."""
    with _groups_lock:
        return _groups.get(message_id)


def _in_flight(store: Store, queue: QueueName) -> dict[str, set[MessageId]]:
    """Group -> ids of the queue's messages leased in ``delay/`` (receive count >= 1, any deadline)."""
    out: dict[str, set[MessageId]] = {}
    for lease in store.scan_in_flight():
        if lease.queue != queue or lease.receive_count < 1:
            continue
        found = _fifo_ids(store.layout.delay_path(lease.filename), lease.message_id)
        if found is not None:
            out.setdefault(found[0], set()).add(lease.message_id)
    return out


class GroupOrder:
    """The FIFO rules of one :func:`mqcore.service.receive.lease_names` call: one group in flight at a time, in order.

    ``lease_names`` builds one for a FIFO queue before its loop and asks it of each name
    (``names`` in id order). Names of a group with a message in flight are not tried: they come
    back in :attr:`LeaseOutcome.held` (still ready). Messages of one group are leased in the order
    given; once one of a group cannot be leased (taken by another consumer, dead-lettered,
    removed), the group's later ones wait for the next receive. With a queue delay
    (``policy.queue_delay_ms``; SQS: a FIFO queue's DelaySeconds, retroactive), a message sent
    less than that long ago is not tried, nor any after it (ids grow with send time): they come
    back in ``held`` too, and :attr:`LeaseOutcome.next_due_ms` says when the first is due.

    Args:
        store: The store (blocking: the constructor lists ``delay/`` and reads group headers).
        queue: The FIFO queue.
        policy: The queue's :func:`mqcore.service.receive.lease_policy`.
        out: The outcome being built (its ``delay_stamp``, ``group_blocked`` and ``next_due_ms`` are set here).
        held: Ready names an earlier round of the same receive set aside: their groups are blocked too.
    """

    __slots__ = ("_blocked", "_due_before", "_found", "_out", "_qdir", "_queue", "_queue_delay_ms", "_store", "_taken")

    def __init__(
        self, store: Store, queue: QueueName, policy: LeasePolicy, out: LeaseOutcome, held: Iterable[str] = ()
    ) -> None:
        with contextlib.suppress(OSError):
            out.delay_stamp = dir_stamp(store.layout.delay)  # before the listing: a later change is seen
        self._store, self._queue, self._out = store, queue, out
        self._blocked = set(_in_flight(store, queue))
        self._taken: dict[str, list[ReceivedMessage]] = {}
        self._qdir = store.layout.queue_dir(queue)
        for name in held:  # set aside by an earlier round: still ready, so their groups wait (cached headers)
            found = _fifo_ids(os.path.join(self._qdir, name), name[:36])
            if found is not None:
                self._blocked.add(found[0])
        self._queue_delay_ms = policy.queue_delay_ms
        self._due_before = store.clock() - policy.queue_delay_ms if policy.queue_delay_ms else None
        #: (group, deduplication id) of the name :meth:`wait` let through last, or None.
        self._found: tuple[str, str] | None = None

    def wait(self, name: str) -> str | None:
        """Why the ready ``name`` is not to be tried now: None (try it), "group" (its group is in flight:
        hold it) or "delay" (the queue's delay: hold it and every later name)."""
        parsed = parse_ready_name(name)
        if self._due_before is not None and parsed is not None and sent_ms_of(parsed[0]) > self._due_before:
            self._out.next_due_ms = sent_ms_of(parsed[0]) + self._queue_delay_ms
            return "delay"
        found = _fifo_ids(os.path.join(self._qdir, name), parsed[0]) if parsed is not None else None
        if found is not None and found[0] in self._blocked:
            self._out.group_blocked = True
            return "group"
        self._found = found
        return None

    def leased(self, message: ReceivedMessage | None) -> ReceivedMessage | None:
        """The lease of the name :meth:`wait` let through last (None: not leased), with its FIFO ids filled in."""
        found = self._found
        if found is None:  # gone before its header was read, or not a FIFO message file
            return message
        group = found[0]
        if message is None:  # its group's later messages wait for the next receive
            self._blocked.add(group)
            return None
        message = replace(message, group_id=group, dedup_id=found[1])
        self._taken.setdefault(group, []).append(message)
        return message

    def finish(self, *, relist: bool = True) -> None:
        """After the loop: steps 3 and 4 of docs/protocol.md 19.3 (blocking).

        Step 3 gives back the groups another consumer leased at the same time (:func:`_yield_raced`).
        Step 4 gives back a kept group with an earlier message ready now (:func:`yield_overtaken`): with
        ``relist`` from one more listing of the queue (a brokerless client, a shared filesystem); without
        it the caller does step 4 itself after this call (mq with inotify: from its index).
        """
        if not self._taken:
            return
        _yield_raced(self._store, self._queue, self._taken, self._out)
        if relist and self._out.messages:
            top = max(m.message_id for m in self._out.messages)
            try:
                names = self._store.scan_ready(self._queue)
            except MQError:  # the queue went: nothing is ready before the kept leases
                return
            # ids of one form (36 lowercase characters) sort as their values.
            earlier: list[tuple[str, str | None]] = [(n[:36], n) for n in names if n[:36] < top]
            if earlier:
                yield_overtaken(self._store, self._queue, self._out, earlier)


def _yield_raced(store: Store, queue: QueueName, taken: dict[str, list[ReceivedMessage]], out: LeaseOutcome) -> None:
    """Give back the leases of groups another consumer leased at the same time (docs/protocol.md 19.3, step 3).

    The groups of ``taken`` had nothing in flight before this receive. A lease of such a group that
    this receive did not make was made by a concurrent one: this receive ends its own leases of that
    group at once (visibility 0, the message is ready again), so at most one consumer keeps the group.
    """
    now_in_flight = _in_flight(store, queue)
    for group, messages in taken.items():
        ours = {m.message_id for m in messages}
        if now_in_flight.get(group, set()) - ours:
            logger.info("FIFO group raced by another consumer; giving it back queue=%s", queue)
            _give_back(store, queue, messages, out)


def yield_overtaken(
    store: Store, queue: QueueName, out: LeaseOutcome, earlier: list[tuple[str, str | None]] | None
) -> None:
    """Give back the leases of ``out`` whose group has an earlier message ready (docs/protocol.md 19.3, step 4).

    Blocking: a header read for an earlier message whose group is not cached, one rename per
    lease given back (visibility 0). A lease ``out`` keeps after step 3 may still overtake an
    earlier message of its group that became ready while the receive ran (another consumer
    gave it back, or mq-mover returned it at its deadline) and that the receive's names did not
    hold: its group goes back, and the earlier message is delivered first.

    Args:
        store: The store.
        queue: The FIFO queue.
        out: The receive's outcome; the leases given back leave ``out.messages``.
        earlier: ``(message id, ready name or None)`` of the messages ready (or ready for a
            moment) since the receive's names were taken, with ids below a lease it keeps; a name
            None (or a header that cannot be read) stands for a message of any group. None: the
            caller cannot tell (an inotify overflow, a rebuilt index): every kept lease goes back.
    """
    first: dict[str, str] = {}  # kept group -> its first kept id (ids of one form sort as their values)
    for message in out.messages:
        group = message.group_id
        if group is not None and (group not in first or message.message_id < first[group]):
            first[group] = message.message_id
    behind: set[str] = set(first) if earlier is None else set()
    qdir = store.layout.queue_dir(queue)
    for message_id, name in earlier or ():
        found = _fifo_ids(os.path.join(qdir, name), message_id) if name is not None else _cached_ids(message_id)
        groups = first if found is None else ([found[0]] if found[0] in first else [])
        behind.update(g for g in groups if message_id < first[g])
    if behind:
        logger.info("FIFO group has an earlier message ready again; giving it back queue=%s", queue)
        _give_back(store, queue, [m for m in out.messages if m.group_id in behind], out)


def _give_back(store: Store, queue: QueueName, messages: list[ReceivedMessage], out: LeaseOutcome) -> None:
    """End ``messages``' leases at once (visibility 0: ready again, receive count kept) and drop them from ``out``."""
    for message in messages:
        try:
            store.change_visibility(queue, ReceiptHandle.parse(message.receipt_handle, queue), 0)
        except MQError as exc:  # expired and moved already, or a storage error: it comes back by itself
            logger.warning("could not give back a FIFO lease queue=%s error=%s", queue, exc)
        out.messages.remove(message)


def send_entries(store: Store, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
    """Send entries to a FIFO queue one by one, in order (docs/protocol.md 19.2); an id or error per entry.

    The hook of every send path (the daemon's single and batch sends, the brokerless client) for a
    queue whose name ends ``.fifo``. Each entry is checked (:func:`fifo_message`) and stored with
    :func:`mqcore.protocol.fifo.send_fifo`: a duplicate answers the id of the message it duplicates.
    Entries are stored in order, each fsynced before the next, so a group keeps the batch's order.

    Raises:
        QueueNotFound: No such queue (nothing is written).
    """
    store._require_queue(queue)
    explicit = store.get_attributes(queue)
    content_based = explicit.get("content_based_deduplication") is True
    per_group = explicit.get("deduplication_scope") == "message_group"
    queue_delay = explicit.get("delay_seconds")
    queue_delay_ms = queue_delay * 1000 if isinstance(queue_delay, int) else 0
    results: list[MessageId | MQError] = []
    for entry in entries:
        try:
            message = fifo_message(
                queue,
                entry.body,
                entry.group_id,
                entry.dedup_id,
                content_based_deduplication=content_based,
                per_group=per_group,
                delay_ms=entry.delay_ms,
                queue_delay_ms=queue_delay_ms,
                content_type=entry.content_type,
                attributes=entry.attributes,
                attribute_types=entry.attribute_types,
            )
            results.append(send_fifo(store, queue, message)[0])
        except QueueNotFound:
            raise
        except MQError as exc:
            results.append(exc)
    return results


def send_entry(store: Store, queue: QueueName, entry: SendEntry) -> MessageId:
    """Send one entry to a FIFO queue (:func:`send_entries`); its id, or the id of the message it duplicates.

    Raises:
        QueueNotFound: No such queue.
        InvalidRequest: The FIFO rules (:func:`fifo_message`).
        StorageUnavailable: It could not be guaranteed stored.
    """
    result = send_entries(store, queue, [entry])[0]
    if isinstance(result, MQError):
        raise result
    return result


def with_fifo_ids(store: Store, messages: list[ReceivedMessage]) -> list[ReceivedMessage]:
    """``messages`` with ``group_id`` and ``dedup_id`` filled in where missing (a re-let answer), from their files.

    Blocking: reads the header of each such message's ``delay/`` file (cached by id).
    """
    out = []
    for message in messages:
        if message.group_id is None:
            found = _fifo_ids(store.layout.delay_path(message.in_flight_name), message.message_id)
            if found is not None:
                message = replace(message, group_id=found[0], dedup_id=found[1] or None)
        out.append(message)
    return out


def fifo_fields(queue: QueueName, group_id: object, dedup_id: object, where: str = "") -> tuple[str | None, str | None]:
    """The group and deduplication ids a native or brokerless send gave, checked against the queue's type.

    Args:
        queue: The queue.
        group_id: ``X-Message-Group-Id`` / a batch entry's ``group_id``, or None.
        dedup_id: ``X-Message-Deduplication-Id`` / ``deduplication_id``, or None.
        where: Prefix of names in errors (``entries[2].``).
    Raises:
        InvalidRequest: Either given for a standard queue (SQS refuses them there too), or malformed.
    """
    if group_id is None and dedup_id is None:
        return None, None
    if not is_fifo_queue(queue):
        raise InvalidRequest(
            f"{where}group_id and {where}deduplication_id are for FIFO queues only (names ending .fifo)",
            parameter=f"{where}group_id" if group_id is not None else f"{where}deduplication_id",
        )
    group = None if group_id is None else check_fifo_id(group_id, f"{where}group_id")
    dedup = None if dedup_id is None else check_fifo_id(dedup_id, f"{where}deduplication_id")
    return group, dedup


def message_fields(message: ReceivedMessage, group: str, sequence: str, dedup: str) -> dict[str, str]:
    """A received FIFO message's group id, sequence number and deduplication id, under the keys given.

    Args:
        message: The received message.
        group, sequence, dedup: The keys (native ``group_id`` ... or SQS ``MessageGroupId`` ...).
    Returns:
        {} for a message of a standard queue; the deduplication id only when the send had one.
    """
    if message.group_id is None:
        return {}
    out = {group: message.group_id, sequence: sequence_number(message.message_id)}
    if message.dedup_id:
        out[dedup] = message.dedup_id
    return out


def native_fields(message: ReceivedMessage) -> dict[str, str]:
    """``group_id``, ``deduplication_id`` and ``sequence_number`` of a received FIFO message ({} for others)."""
    return message_fields(message, "group_id", "sequence_number", "deduplication_id")


#: Raw receive headers of :func:`native_fields` (docs/api.md).
NATIVE_HEADERS = {
    "group_id": "X-Message-Group-Id",
    "deduplication_id": "X-Message-Deduplication-Id",
    "sequence_number": "X-Sequence-Number",
}
