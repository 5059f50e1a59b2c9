"""Sends of the ``mq`` daemon (SQS SendMessage, SendMessageBatch): capacity admission, group commit, indexing.

:class:`Sender` admits sends under a queue's capacity
(:func:`mqcore.service.capacity.admit`; a full queue waits on its ``room``
signal up to ``capacity_wait_seconds``), stores them with the daemon's savers
(:class:`daemons._savers.Savers`: one hand-off to a thread per request,
one loop wake-up per group commit; a FIFO queue's sends are one call on a
saver, in order with deduplication), then indexes the new ready names and
wakes the queue's long polls. A lone single send (:mod:`daemons._inline`)
is written on the loop thread instead, with the same steps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from daemons import _idorder
from daemons._queues import QueueState
from mqcore.errors import MQError, QueueNotFound
from mqcore.names import MessageId, QueueName, is_fifo_queue, ready_name
from mqcore.protocol import SendEntry
from mqcore.service import fifo
from mqcore.service.capacity import admit, queue_full

if TYPE_CHECKING:
    from daemons._broker import Broker

logger = logging.getLogger("mq.front")  # the mq daemon's logger, as daemons._broker


class Sender:
    """The send operations of a :class:`daemons._broker.Broker` (event loop only).

    Args:
        broker: The broker: store, saver threads, queue states, health, counts.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.queues = broker.queues
        self.savers = broker.savers
        self.savers.ready_names = broker.queues  # each name indexed once, no inotify read per send (daemons/_own.py)
        mount = broker.mount
        syncfs = self.savers.use_file_sync(broker.settings.file_sync, mount)
        logger.info(
            "file sync %s (--file-sync %s, root on %s)",
            ("syncfs" if self.savers.syncfs_always else "syncfs under load") if syncfs else "fsync",
            broker.settings.file_sync,
            mount.fstype if mount is not None else "an unknown filesystem",
        )

    async def _reserve(self, queue: QueueName, state: QueueState, wanted: int) -> tuple[QueueState, int]:
        """Admit up to ``wanted`` sends under the queue's capacity; wait for room up to capacity_wait_seconds.

        Returns:
            (the state the reservation is counted on, how many were admitted: 0 = the queue stayed full).
        """
        taken = admit(state.attrs.capacity, len(state.index), state.sending, wanted)
        if taken:  # the usual case, without a look at the loop's clock
            state.sending += taken
            return state, taken
        loop = asyncio.get_running_loop()
        deadline = loop.time() + state.attrs.capacity_wait_seconds
        while True:
            taken = admit(state.attrs.capacity, len(state.index), state.sending, wanted)
            if taken:
                state.sending += taken
                return state, taken
            remaining = deadline - loop.time()
            if remaining <= 0 or self.broker.stopping:
                return state, 0
            with self.queues.holding(self.queues.room, queue) as room_made:
                await room_made.wait_for(remaining)  # a Signal's Wake: its timeout cancels no task
            state = await self.queues.queue_state(queue)

    async def send(
        self, queue: QueueName, entry: SendEntry, answered: list[Callable[[], None]] | None = None
    ) -> MessageId:
        """Store a message durably (fsynced) and index it; return its id (SQS SendMessage).

        Args:
            queue: The queue.
            entry: The message, checked by the caller (size, attributes; ``delay_ms`` 0-900,000:
                held in ``delay/`` meanwhile).
            answered: None: the message is indexed (its ready name, the long polls woken, the capacity
                reservation released, the counts) before this returns. A list (``daemons._wire``): that
                bookkeeping is appended to it as one callable instead, which the caller must call right
                after it has written the ``201``, in the same loop step (no ``await`` in between, so a
                request read after the ``201`` still finds the message indexed), whatever became of
                the write. Only on success: an error is raised with the bookkeeping done.

        Raises:
            QueueNotFound: No such queue.
            QueueFull: The queue stayed at capacity for capacity_wait_seconds (429; never for a delayed send).
            StorageUnavailable: It could not be guaranteed stored (503).
            InsufficientStorage: Free space is below ``--min-free-bytes`` (507).
        """
        broker = self.broker
        broker.health.check_send()
        state = await self.queues.queue_state(queue)
        admitted = 0
        delay_ms = entry.delay_ms
        if delay_ms == 0:  # a delayed message is not ready: capacity never holds or refuses it
            state, admitted = await self._reserve(queue, state, 1)
            if not admitted:
                broker.counts.add("capacity_rejected", queue)
                raise queue_full(queue, state.attrs)
        lone = broker.lone
        try:
            if _idorder.ACKED is not None:  # mq --processes N: sequential sends keep their order
                await _idorder.before_ids()
            if is_fifo_queue(queue):  # in order, with deduplication (docs/protocol.md 19)
                with lone.held():
                    message_id = await self.savers.run(fifo.send_entry, broker.store, queue, entry)
            else:
                here = lone.enter_now()  # LoneOps.enter without its coroutine (the usual answer needs no yield)
                if here is None:
                    here = await lone.settle()
                try:  # alone: written on the loop thread (daemons/_inline.py), else by a saver
                    result = (await (self.savers.send_here if here else self.savers.send)(queue, [entry]))[0]
                finally:
                    lone.leave()
                if isinstance(result, MQError):
                    raise result
                message_id = result
        except BaseException:
            state.sending -= admitted
            raise
        if _idorder.ACKED is not None:  # before the 201 is written: another worker's next send must see it
            _idorder.acknowledged([message_id])
        if answered is None:
            self._sent(queue, state, admitted, message_id, delay_ms)
        else:  # right after the 201 (daemons/_wire.py): the answer does not wait for the index
            answered.append(lambda: self._sent(queue, state, admitted, message_id, delay_ms))
        return message_id

    def _sent(self, queue: QueueName, state: QueueState, admitted: int, message_id: MessageId, delay_ms: int) -> None:
        """A send is stored: index its ready name (unless delayed), release its reservation, count it."""
        try:
            if delay_ms == 0:
                self.queues.note_ready(queue, ready_name(message_id, 0))
        finally:
            state.sending -= admitted
        self.broker.counts.add("sent", queue)

    async def send_batch(self, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
        """Send several messages with one group commit (SQS SendMessageBatch); a result per entry, in order.

        Of the entries without a delay, those that do not fit under the
        queue's capacity (after waiting up to capacity_wait_seconds for any
        room) get QueueFull, the first ones in entry order being sent. Delayed
        entries are never held or refused: capacity counts ready messages only.

        Raises:
            QueueNotFound: No such queue.
            InsufficientStorage: Free space is below ``--min-free-bytes`` (507; nothing sent).
        """
        self.broker.health.check_send()
        state = await self.queues.queue_state(queue)
        immediate = [i for i, entry in enumerate(entries) if entry.delay_ms == 0]
        admitted = 0
        if immediate:
            state, admitted = await self._reserve(queue, state, len(immediate))
        refused = set(immediate[admitted:])
        # Usually every entry is admitted: the entries as they are, not a copy (a list per batch).
        chosen = [i for i in range(len(entries)) if i not in refused] if refused else range(len(entries))
        stored: list[MessageId | MQError] = []
        try:
            if chosen:
                await _idorder.before_ids()  # mq --processes N: sequential sends keep their order
                with self.broker.lone.held():  # always the savers (a file each, fsyncs in parallel); counted: see send
                    stored = await self._store_batch(queue, [entries[i] for i in chosen] if refused else entries)
                ready = [
                    ready_name(result, 0)
                    for i, result in zip(chosen, stored, strict=True)
                    if isinstance(result, str) and entries[i].delay_ms == 0
                ]
                self.queues.note_ready(queue, *ready)
        finally:
            state.sending -= admitted
        self.broker.counts.add("sent", queue, sum(isinstance(result, str) for result in stored))
        _idorder.acknowledged([result for result in stored if isinstance(result, str)])
        if not refused:
            return stored
        self.broker.counts.add("capacity_rejected", queue, len(refused))
        by_entry = dict(zip(chosen, stored, strict=True))
        full = queue_full(queue, state.attrs)
        return [by_entry.get(i, full) for i in range(len(entries))]

    async def _store_batch(self, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
        """Write a batch's files on several saver threads at once, then publish them with one directory fsync.

        The ids are taken first, in entry order, so the batch keeps its order
        (FIFO) whichever write finishes first; each write fsyncs its own file
        and the writes' fsyncs overlap. The last write renames them all, in
        entry order, and each target directory is fsynced once (group commit:
        :class:`daemons._savers.Savers`).

        Raises:
            QueueNotFound: No such queue (nothing is written).
        """
        if is_fifo_queue(queue):  # in order, with deduplication (docs/protocol.md 19)
            return await self.savers.run(fifo.send_entries, self.broker.store, queue, entries)
        results = await self.savers.send(queue, entries)
        if all(isinstance(result, QueueNotFound) for result in results):
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        return results
