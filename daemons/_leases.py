"""What the ``mq`` daemon does with a message after a receive: delete it or change its visibility.

:class:`Leases` holds this daemon's memory of its leases
(:class:`mqcore.service.handles.LeaseMemory`: where each lease's ``delay/``
file is now, so the usual delete or change of visibility is one rename) and
the operations that end or move a lease: DeleteMessage (by receipt handle),
DeleteMessageBatch, the native delete by id, ChangeMessageVisibility. The
deletes' renames run on one remover thread (:class:`daemons._handoff.Handoff`)
whose batches are made durable by one fsync of ``remove/`` (group commit),
or, for a lone delete (:mod:`daemons._inline`), on the loop thread, its rename
then that fsync; a change of visibility runs on a saver thread. After each, the queue's index
and wake-ups (:class:`daemons._queues.QueueStates`) are brought up to date on
the loop.

The receives (:class:`daemons._broker.Broker`) tell it what they leased
(:meth:`LeaseMemory.received` on :attr:`Leases.memory`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

from daemons._handoff import Handoff
from daemons._inline import LoneOps
from daemons._metrics import BrokerCounts
from daemons._queues import QueueStates
from daemons._savers import Savers
from mqcore.errors import MQError
from mqcore.names import MessageId, QueueName, ReceiptHandle, is_fifo_queue, ready_name
from mqcore.protocol import Store, now_ms
from mqcore.service.handles import LeaseMemory

__all__ = ["Leases"]


def _ready_after(in_flight: str, message_id: MessageId) -> str:
    """The ready name ``ID.RC`` a lease ``DL.Q.ID.RC[.LT]`` of ``message_id`` (made by this daemon) ends as.

    No parse: RC is the field after the id's last occurrence (a token and a count hold no "-", so
    the id can only recur in the queue's name, before it). Only a hint (a wrong one costs a miss).
    """
    rest = in_flight[in_flight.rfind(message_id) + len(message_id) + 1 :]
    return f"{message_id}.{rest.partition('.')[0]}"


class Leases:
    """The daemon's leases after a receive: their memory, deletes and changes of visibility (event loop only).

    Args:
        store: The store.
        queues: The daemon's queue states (indexes, fetchers, wake-ups).
        savers: The saver threads (a change of visibility's rename).
        counts: The per-queue counters (``deleted``).
    """

    def __init__(self, store: Store, queues: QueueStates, savers: Savers, counts: BrokerCounts, lone: LoneOps) -> None:
        self.store = store
        self.queues = queues
        self.savers = savers
        self.counts = counts
        self.lone = lone
        #: Where this daemon's leases are now (hints that make deletes and changes of visibility one rename).
        self.memory = LeaseMemory()
        #: The deletes' thread: their renames into ``remove/`` in batches, one fsync of ``remove/`` per batch.
        self.remover = Handoff("mq-remover", after_batch=self._sync_removed)

    def close(self) -> None:
        """Stop the remover thread once its queued deletes are done."""
        self.remover.shutdown(wait=True)

    def _sync_removed(self) -> None:
        """After a batch of deletes (remover thread): make their renames into ``remove/`` durable (group commit).

        Raises:
            StorageUnavailable: The fsync failed; every delete of the batch answers 503.
        """
        self.store.disk.sync_dir(self.store.layout.remove, "fsync of remove/")

    async def delete(self, queue: QueueName, message_id: MessageId) -> str:
        """Delete a message by id wherever it is (SoftLayer); return where it was.

        Hints from this process's leases and from the index make the usual
        case a single rename; when they miss (another process moved the
        message, or a redelivery's inotify event is still queued), the store
        lists ``delay/`` and the queue directory before answering 404. The
        rename runs on the remover thread, beside the fetchers' leases, and the
        deletes of its batch are made durable by one fsync of ``remove/``
        before any of them is answered.
        """
        in_flight = self.memory.pop_message(queue, message_id)
        state = indexed = None
        if in_flight:  # its lease may have ended: mq-mover made it ready again, as ID.RC (no index lookup)
            ready_hints = [_ready_after(in_flight, message_id), ready_name(message_id, 0)]
        else:
            if self.queues.watcher is not None:
                # Not leased here: the index is the hint, made current first (a queued inotify event
                # may name a redelivery). A leased message needs no index: it is not ready, or if mq-mover
                # just made it ready, the name above is its name and the queued events cancel out.
                self.queues.on_watch_events()
            state = self.queues.fetcher_for(queue).queues.get(queue)
            indexed = state.index.name_for(message_id) if state is not None else None
            ready_hints = [indexed, ready_name(message_id, 0)] if indexed else [ready_name(message_id, 0)]
        in_flight_hint = [in_flight] if in_flight else []
        where = await self._remove(
            lambda: self.store.delete(
                queue, message_id, ready_hint=ready_hints, in_flight_hint=in_flight_hint, sync=False
            )
        )
        if in_flight and where == "ready":  # its lease had ended: its ready name may be indexed
            state = self.queues.fetcher_for(queue).queues.get(queue)
            indexed = ready_hints[0]
        if indexed and state is not None:
            state.index.discard(indexed)
        if where == "ready":
            self.queues.fire(self.queues.room, queue)
        self.counts.add("deleted", queue)
        return where

    async def delete_by_handle(self, queue: QueueName, handle: ReceiptHandle) -> tuple[str, str]:
        """Delete the message a receive got, only if no later receive took it (SQS DeleteMessage).

        The rename runs on the remover thread, whose batch's deletes are
        made durable by one fsync of ``remove/`` before any of them is answered.

        Args:
            queue: The queue.
            handle: The receipt handle, parsed where it entered
                (:func:`mqcore.service.handles.check_handle`: of ``queue``).
        Returns:
            (message id, where it was: "in_flight" or "ready").
        Raises:
            StaleReceiptHandle: Received again since; the newer lease is untouched (410).
            MessageNotFound: Already gone (404).
        """
        hint = self.memory.current(handle)
        where = await self._remove(lambda: self.store.delete_by_handle(queue, handle, hint, sync=False))
        self._deleted_by_handles(queue, [(handle, where)])
        return handle.message_id, where

    async def _remove(self, rename: Callable[[], str]) -> str:
        """One delete's ``rename`` into ``remove/`` made durable by an fsync of ``remove/``; where it was.

        Alone (daemons/_inline.py), both on the loop thread: the rename, then the fsync (if the
        rename raised, no fsync, as the remover skips its step for a batch without a success).
        Else on the remover thread, the fsync shared by its batch.

        Raises:
            MQError: What ``rename`` raised, or StorageUnavailable: the fsync of ``remove/`` failed.
        """
        here = self.lone.enter_now()  # LoneOps.enter without its coroutine, unless a yield must decide
        if here is None:
            here = await self.lone.settle()  # cancelled, it uncounts itself
        try:
            if not here:
                return await self.remover.run(rename)
            where = rename()
            self._sync_removed()
            return where
        finally:
            self.lone.leave()

    def _deleted_by_handles(self, queue: QueueName, deleted: list[tuple[ReceiptHandle, str]]) -> None:
        """After deletes by handle (loop thread): forget the leases, wake who may be waiting, count them.

        Args:
            queue: The queue.
            deleted: (handle, where its message was) of each delete done.
        """
        if not deleted:
            return
        self.memory.released(*(handle for handle, _ in deleted))
        if is_fifo_queue(queue):  # the delete may free a message group: long polls look again (protocol.md 19.3)
            self.queues.fire(self.queues.arrivals, queue)
        for handle, where in deleted:
            if where == "ready":
                state = self.queues.fetcher_for(queue).queues.get(queue)
                if state is not None:
                    state.index.discard(ready_name(handle.message_id, handle.lease.receive_count))
                self.queues.fire(self.queues.room, queue)
        self.counts.add("deleted", queue, len(deleted))

    async def delete_by_handles(
        self, queue: QueueName, handles: list[ReceiptHandle]
    ) -> list[tuple[str, str] | MQError]:
        """:meth:`delete_by_handle` for several handles of one queue in one job of the remover thread.

        The same renames and the same one fsync of ``remove/`` as that many concurrent
        :meth:`delete_by_handle` calls (their jobs share a batch), without a task, a future and a
        hand-off per handle (SQS DeleteMessageBatch, docs/performance.md "SQS protocol, pinned").

        Returns:
            Per handle, in order: (message id, where it was), or the error that handle met
            (StaleReceiptHandle, MessageNotFound, StorageUnavailable...).
        """
        if not handles:
            return []
        hints = self.memory.currents(handles)
        out: list[str | MQError] = []

        def delete_all() -> list[str | MQError]:
            for handle, hint in zip(handles, hints, strict=True):
                try:
                    out.append(self.store.delete_by_handle(queue, handle, hint, sync=False))
                except MQError as exc:
                    out.append(exc)
            return out

        self.lone.hold()  # always the remover (one job for the batch); counted, so no lone delete runs beside it
        try:
            wheres = await self.remover.run(delete_all)
        except MQError as exc:  # the batch's fsync of remove/ failed: none of its renames is durable
            if len(out) != len(handles):  # the job itself failed
                return [copy.copy(exc) for _ in handles]
            return [where if isinstance(where, MQError) else copy.copy(exc) for where in out]
        finally:
            self.lone.leave()
        results: list[tuple[str, str] | MQError] = []
        deleted: list[tuple[ReceiptHandle, str]] = []
        for handle, where in zip(handles, wheres, strict=True):
            if isinstance(where, MQError):
                results.append(where)
            else:
                deleted.append((handle, where))
                results.append((handle.message_id, where))
        self._deleted_by_handles(queue, deleted)
        return results

    async def delete_many(
        self, queue: QueueName, targets: list[ReceiptHandle | MessageId]
    ) -> list[tuple[str, str] | MQError]:
        """The deletes of one batch (``POST /<queue>/messages/delete``): by receipt handle or by message id.

        The handles' deletes are one job of the remover thread (:meth:`delete_by_handles`: one
        future, not a task and a future per entry); the rarer deletes by id (:meth:`delete`) run
        beside it, and all of them are made durable by the fsync of ``remove/`` of their batch.

        Returns:
            Per target, in order: (message id, where it was), or the error that target met.
        """
        handles = [t for t in targets if isinstance(t, ReceiptHandle)]
        by_handle = self.delete_by_handles(queue, handles)
        if len(handles) == len(targets):
            return await by_handle
        ids = [t for t in targets if not isinstance(t, ReceiptHandle)]
        by_id = asyncio.gather(*(self._delete_caught(queue, m) for m in ids))
        handled, id_done = await asyncio.gather(by_handle, by_id)
        handle_results, id_results = iter(handled), iter(id_done)
        return [next(handle_results) if isinstance(t, ReceiptHandle) else next(id_results) for t in targets]

    async def _delete_caught(self, queue: QueueName, message_id: MessageId) -> tuple[str, str] | MQError:
        """:meth:`delete` with its MQError returned, not raised (one entry of a batch)."""
        try:
            return message_id, await self.delete(queue, message_id)
        except MQError as exc:
            return exc

    async def change_visibility(
        self, queue: QueueName, handle: ReceiptHandle, visibility_timeout_seconds: int
    ) -> tuple[str, str, int]:
        """Set the visibility timeout of an in-flight message to now + the given seconds (SQS ChangeMessageVisibility).

        0 makes it ready at once (its long-polling consumers are woken).

        Args:
            queue: The queue.
            handle: The receipt handle, parsed where it entered (of ``queue``).
            visibility_timeout_seconds: 0-43,200 (checked by the caller).
        Returns:
            (message id, the lease's current receipt handle, new visibility deadline in epoch ms).
        Raises:
            MessageNotInFlight: Its visibility timeout had already ended (400).
            StaleReceiptHandle: Received again since (410).
            MessageNotFound: Gone (404).
        """
        hint = self.memory.current(handle)
        vt_ms = visibility_timeout_seconds * 1000
        now = now_ms()
        new = await self.savers.run(lambda: self.store.at(now).change_visibility(queue, handle, vt_ms, hint=hint))
        if vt_ms == 0:
            self.memory.released(handle)
            self.queues.note_ready(queue, ready_name(handle.message_id, handle.lease.receive_count))
            return handle.message_id, handle.text, now
        self.memory.moved(handle, new)
        return handle.message_id, new, now + vt_ms
