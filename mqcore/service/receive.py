"""Receiving: leasing ready messages and the dead-letter and retention policy applied at receive.

The policy of a queue (``max_receive_count`` and ``dead_letter_queue``,
``message_retention_seconds``, the purge marker) is a
:class:`mqcore.protocol.LeasePolicy` made by :func:`lease_policy`; every lease
and redelivery applies it (a message past its receive count goes to the
dead-letter queue, one past retention or purged is removed, instead of being
delivered). Which ready names to try is the driver's (the daemon pops its
in-memory index; the brokerless client lists the directory); leasing them and
the error rule are here. Blocking functions over the Store, no threads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from mqcore.attributes import QueueAttributes
from mqcore.errors import MQError
from mqcore.model import ReceivedMessage
from mqcore.names import MessageId, QueueName, is_fifo_queue, parse_in_flight_name, partition_of
from mqcore.protocol import LeasePolicy, Store

logger = logging.getLogger("mq.service")

__all__ = ["LeaseOutcome", "Redelivery", "in_partition", "lease_names", "lease_policy", "redeliver_due"]


def lease_policy(attrs: QueueAttributes, purged_before: MessageId | None) -> LeasePolicy:
    """The dead-letter, retention and purge policy of a queue (SQS RedrivePolicy, MessageRetentionPeriod).

    Args:
        attrs: The queue's effective attributes.
        purged_before: The queue's purge marker (messages with ids up to it were purged), or None.
    """
    return LeasePolicy.for_queue(attrs, purged_before)


def in_partition(name: str, partition: tuple[int, int] | None) -> bool:
    """True if the ready (or any ``ID...``) name's message is in ``partition`` = ``(i, M)`` (None: every message)."""
    return partition is None or partition_of(name.partition(".")[0], partition[1]) == partition[0]


@dataclass(slots=True)
class LeaseOutcome:
    """What :func:`lease_names` did.

    Attributes:
        messages: The messages leased, in the order tried.
        error: The storage error that stopped it, or None.
        untried: The names not tried (after the error, or beyond ``wanted``): still ready.
        held: Names of a FIFO queue not tried because their message group is in flight, or because
            the queue's delay has not passed since their send (:mod:`mqcore.service.fifo`): still
            ready, but not for this receive.
        group_blocked: A FIFO name was held because its group is in flight (a delete frees it);
            then ``delay_stamp`` is ``delay/``'s :func:`mqcore.fsinfo.dir_stamp` from before the
            in-flight groups were listed (None if the stat failed): a change of it may free the group.
        next_due_ms: A FIFO name was held for the queue's delay: when the first of them is due (epoch ms).
    """

    messages: list[ReceivedMessage] = field(default_factory=list)
    error: MQError | None = None
    untried: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    group_blocked: bool = False
    delay_stamp: tuple[int, int, int] | None = None
    next_due_ms: int | None = None

    def check(self, queue: QueueName, leased_before: int = 0) -> None:
        """The receive's error rule: an error with nothing leased is raised; after some leases it is logged.

        Args:
            queue: The queue (for the log).
            leased_before: Messages this receive leased in earlier rounds.
        Raises:
            MQError: :attr:`error`, when neither this nor an earlier round leased anything.
        """
        if self.error is None:
            return
        if not self.messages and not leased_before:
            raise self.error
        logger.error("receive stopped early queue=%s error=%s", queue, self.error)


def lease_names(
    store: Store,
    queue: QueueName,
    names: Iterable[str],
    visibility_timeout_ms: int,
    policy: LeasePolicy,
    wanted: int | None = None,
    relist: bool = True,
    held: Iterable[str] = (),
) -> LeaseOutcome:
    """Lease the ready ``names`` in order until ``wanted`` are leased; stop at the first storage error.

    Blocking (one rename and read per name). A name already gone (another
    consumer got it) or removed or dead-lettered by ``policy`` is skipped.
    The names of a FIFO queue pass :class:`mqcore.service.fifo.GroupOrder`'s
    rules (one group in flight, in order; the queue's delay; docs/protocol.md 19.3).

    Args:
        store: The store.
        queue: The queue.
        names: Ready names ``ID.RC`` to try, in order.
        visibility_timeout_ms: The leases' length, ms.
        policy: The queue's :func:`lease_policy`.
        wanted: Stop once this many are leased (None = try every name).
        relist: A FIFO queue's step 4 (docs/protocol.md 19.3) by one more listing of the queue; False:
            the caller does it from an index that inotify keeps (mq, :mod:`daemons._fifo_order`).
        held: Ready names an earlier round of the same receive set aside (FIFO: their group was in
            flight); their groups stay blocked here (19.3 step 2), so no later message overtakes them.
    """
    out = LeaseOutcome()
    pending = list(names)
    order = None
    if is_fifo_queue(queue):  # message groups (docs/protocol.md 19.3); a string test for other queues
        from mqcore.service.fifo import GroupOrder

        order = GroupOrder(store, queue, policy, out, held)
    for i, name in enumerate(pending):
        if wanted is not None and len(out.messages) >= wanted:
            out.untried = pending[i:]
            break
        if order is not None and (wait := order.wait(name)) is not None:
            if wait == "delay":  # the queue's delay: this and every later message wait (19.3)
                out.held.extend(pending[i:])
                break
            out.held.append(name)
            continue
        try:
            message = store.lease(queue, name, visibility_timeout_ms, policy=policy)
        except MQError as exc:
            out.error, out.untried = exc, pending[i:]
            break
        if order is not None:
            message = order.leased(message)
        if message is not None:
            out.messages.append(message)
    if order is not None:
        order.finish(relist=relist)
    return out


@dataclass(slots=True)
class Redelivery:
    """What :func:`redeliver_due` did.

    Attributes:
        next_due_ms: The earliest deadline (epoch ms) of the queue's ``delay/`` files not yet due, or None.
        removed: Ids of messages it moved to ``remove/`` (purged, expired, orphaned): the caller may reap them.
    """

    next_due_ms: int | None = None
    removed: list[MessageId] = field(default_factory=list)


def redeliver_due(store: Store, queue: QueueName, now: int, policy: LeasePolicy) -> Redelivery:
    """Move on the queue's due ``delay/`` files as mq-mover does (``Store.move_due``), applying ``policy``.

    The brokerless client's redelivery before it receives (no mq-mover needed).
    Each file is redelivered, dead-lettered (past ``max_receive_count``) or
    removed (purged, past retention); a failed move is logged and skipped.

    Args:
        store: The store.
        queue: The queue.
        now: Epoch ms of the decision (deadlines and retention count to it).
        policy: The queue's :func:`lease_policy`.
    """
    out = Redelivery()
    infix = f".{queue}."
    try:
        names = os.listdir(store.layout.delay)
    except FileNotFoundError:
        return out
    for name in names:
        if infix not in name:
            continue
        item = parse_in_flight_name(name)
        if item is None or item.queue != queue:
            continue
        if item.deadline_ms > now:
            if out.next_due_ms is None or item.deadline_ms < out.next_due_ms:
                out.next_due_ms = item.deadline_ms
            continue
        try:
            result = store.at(now).move_due(item, policy)
        except MQError as exc:
            logger.error("redelivery failed queue=%s id=%s error=%s", queue, item.message_id, exc)
            continue
        if result in ("purged", "expired", "orphaned"):
            out.removed.append(item.message_id)
        elif result == "kept":
            logger.warning(
                "dead-letter queue missing queue=%s dead_letter_queue=%s (redelivered to its queue)",
                queue,
                policy.dead_letter_queue,
            )
        logger.debug("%s queue=%s id=%s receive_count=%d", result, queue, item.message_id, item.receive_count)
    return out
