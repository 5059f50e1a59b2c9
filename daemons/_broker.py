"""The state of the ``mq`` daemon and its operations: a method per queue operation and the receive here,
the sends in ``broker.sender``, deletes and changes of visibility in ``broker.leases``, redrives in
``broker.redrives`` (one method per operation of ``docs/api.md`` in all).

:class:`Broker` is what the HTTP handlers (``daemons/_http.py``) and the SQS
layer (``daemons/_sqs.py``) call, each method on the event loop, its blocking
file calls on a saver thread or on the queue's fetcher thread. The rules of
each operation are :mod:`mqcore.service`'s (ranges, attempts, capacity,
receipt handles, leasing policy, redrive); the broker adds the daemon's
concurrency: the per-queue indexes, watches and wake-ups
(:class:`daemons._queues.QueueStates`), the saver threads (:class:`daemons._savers.Savers`,
one pool for every route), the sends (:class:`daemons._send.Sender`),
the redrive tasks (:class:`daemons._redrive.RedriveRunner`) and what follows a
receive: deletes and changes of visibility, with the memory of its leases
(:class:`daemons._leases.Leases`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from daemons._fifo_order import keep_group_order
from daemons._fifo_wakes import FifoWakes
from daemons._handoff import Handoff
from daemons._health import Health
from daemons._inline import LoneOps, inline_allowed
from daemons._leases import Leases
from daemons._metrics import BrokerMetrics
from daemons._queue_list import QueueNames
from daemons._queues import Meta, QueueState, QueueStates, recheck
from daemons._redrive import RedriveRunner
from daemons._savers import Savers
from daemons._send import Sender
from daemons._settings import Settings
from mqcore.attributes import QueueAttributes, effective
from mqcore.errors import MQError, QueueNotFound, ServerBusy
from mqcore.model import ReceivedMessage
from mqcore.names import MessageId, QueueName, is_fifo_queue, ready_name
from mqcore.protocol import PeekedFile, Store, now_ms
from mqcore.service.attempts import KeyedLocks, ReceiveNew, Relet, attempted_receive, relet
from mqcore.service.fifo import FIFO_ROUND_NAMES
from mqcore.service.plans import run_async
from mqcore.service.queues import queue_stats
from mqcore.service.receive import LeaseOutcome, lease_names
from mqcore.service.requests import ReceiveArgs, ReceiveRequest

logger = logging.getLogger("mq.front")  # the mq daemon's logger, whatever module logs

T = TypeVar("T")


class Broker:
    """The daemon's state: the store, the worker pairs, the queue states, the leases, the redrive tasks.

    Every method runs on the event loop; blocking file calls go to the saver
    threads or to the queue's fetcher thread.

    Args:
        settings: Daemon settings.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.defaults = settings.queue_defaults
        self.store = Store(settings.root)
        #: The saver threads (at most ``--workers``): sends with group commit, and every other route's file calls.
        self.savers = Savers(self.store, settings.workers)
        self.queues = QueueStates(settings, self.store, self.savers)
        self.queue_names = QueueNames(self.store)
        #: The wake-up maps of :attr:`queues` (long polls; senders waiting for room), by queue.
        self._arrivals = self.queues.arrivals
        self._room = self.queues.room
        #: The filesystem of the root (None if /proc/mounts cannot tell).
        self.mount = self.queues.mount
        #: Lone sends, receives and deletes do their file work on the loop thread (local filesystems only).
        self.lone = LoneOps(inline_allowed(settings.inline_io, self.mount))
        logger.info(
            "inline io %s (--inline-io %s, root on %s)",
            "on" if self.lone.enabled else "off",
            settings.inline_io,
            self.mount.fstype if self.mount is not None else "an unknown filesystem",
        )
        self._attempt_locks: KeyedLocks[asyncio.Lock] = KeyedLocks(asyncio.Lock)
        self.stopping = False
        #: Requests and connections refused to protect mq, by reason (connections, body_timeout,
        #: waiters, unauthorized, forbidden): what /metrics can export (docs/security.md).
        self.refusals: Counter[str] = Counter()
        self.metrics = BrokerMetrics(self)
        self.counts = self.metrics.counts
        #: Deletes and changes of visibility, the remover thread, the memory of this daemon's leases.
        self.leases = Leases(self.store, self.queues, self.savers, self.counts, self.lone)
        self.health = Health(settings.root, settings.min_free_bytes)
        self.sender = Sender(self)
        self.redrives = RedriveRunner(self)
        #: Wakes FIFO long polls when the queue's delay ends or another process may have freed a group.
        self.fifo_wakes = FifoWakes(
            self.store.layout.delay, lambda q: self.queues.fire(self._arrivals, q), lambda q: q in self._arrivals
        )

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Attach inotify to the loop and start the periodic rescan."""
        self.queues.start()

    async def begin_stop(self) -> None:
        """First step of a clean stop: waiting receives and sends return at once, redrive tasks end.

        A running redrive records state "failed" (error "mq stopped") so a
        client can start it again on another daemon at once.
        """
        self.stopping = True
        self.queues.wake_all()
        await self.redrives.stop_all()

    async def close(self) -> None:
        """Stop background work and the worker threads (after in-flight requests finished)."""
        if not self.stopping:
            await self.begin_stop()
        await self.fifo_wakes.close()
        await self.queues.close()
        self.leases.close()
        self.savers.shutdown(wait=True)
        logger.info(
            "inline io: %d of %d single sends, receives' lease rounds and single deletes done on the loop thread",
            self.lone.inline,
            self.lone.entered,
        )
        self.store.close()
        self.health.close()

    async def run_in(self, pool: Savers | Handoff, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a thread of ``pool`` (the savers, or a queue's fetcher thread): one hand-off each way."""
        return await pool.run(fn, *args)

    async def in_saver(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a saver thread (how the daemon runs a plan's blocking work)."""
        return await self.savers.run(fn)

    async def queue_state(self, queue: QueueName) -> QueueState:
        """The daemon's index and metadata of ``queue`` (:meth:`daemons._queues.QueueStates.queue_state`).

        Raises:
            QueueNotFound: No such queue.
        """
        return await self.queues.queue_state(queue)

    # -- queues --------------------------------------------------------------

    async def queue_exists(self, queue: QueueName) -> bool:
        """True if the queue exists."""
        return await self.run_in(self.savers, self.store.queue_exists, queue)

    async def create_queue(
        self, queue: QueueName, attributes: dict[str, Any] | None = None
    ) -> tuple[bool, QueueAttributes]:
        """Create a queue with optional explicit attributes (SQS CreateQueue).

        Args:
            queue: The name.
            attributes: ``{key: value}`` of ``mqcore.attributes.KEYS``, or None.
        Returns:
            (created, effective attributes); created is False if it existed.
        Raises:
            InvalidAttribute: A bad key or value, or a dead-letter queue that does not exist.
            QueueNameExists: It exists and a given key differs from its effective value (409).
        """

        def create() -> tuple[bool, dict[str, Any]]:
            created = self.store.create_queue(queue, attributes or None, defaults=self.defaults)
            return created, self.store.get_attributes(queue)

        created, explicit = await self.run_in(self.savers, create)
        if created:
            logger.info("created queue=%s attributes=%s", queue, json.dumps(explicit, sort_keys=True))
        return created, effective(explicit, self.defaults)

    async def delete_queue(self, queue: QueueName) -> None:
        """Delete a queue and all its messages (QueueNotFound if missing)."""
        fetcher = self.queues.fetcher_for(queue)
        async with fetcher.lock:
            await fetcher.thread.run(self.store.delete_queue, queue)
            self.queues.forget_queue(queue)
        self.redrives.stop(queue)
        logger.info("deleted queue=%s", queue)

    async def list_queues(self, prefix: str = "") -> list[QueueName]:
        """Queue names starting with ``prefix``, sorted (cached while ``queues/`` is unchanged: _queue_list.py)."""
        names, _ = await self.run_in(self.savers, self.queue_names.names, prefix)
        return names

    async def list_queue_page(self, prefix: str, after: str, limit: int) -> tuple[list[QueueName], bool]:
        """At most ``limit`` queue names starting with ``prefix`` after ``after``, sorted; and whether more follow."""
        return await self.run_in(self.savers, self.queue_names.names, prefix, after, limit)

    async def ready_count(self, queue: QueueName) -> int:
        """Approximate number of ready messages (from the index)."""
        return len((await self.queues.queue_state(queue)).index)

    async def get_attributes(self, queue: QueueName) -> QueueAttributes:
        """The effective attributes of ``queue`` (QueueNotFound)."""
        return (await self.queues.queue_state(queue)).attrs

    async def set_attributes(self, queue: QueueName, changes: dict[str, Any]) -> QueueAttributes:
        """Merge ``changes`` (None = back to the default) into the queue's attributes (SQS SetQueueAttributes).

        Returns:
            The effective attributes after the change.
        Raises:
            InvalidAttribute: A bad key or value (nothing changed).
            QueueNotFound: No such queue.
        """
        explicit = await self.run_in(self.savers, self.store.set_attributes, queue, changes)
        state = self.queues.fetcher_for(queue).queues.get(queue)
        if state is not None:
            self.queues.apply_meta(queue, state, (explicit, state.created_ms, state.purged_before))
        if "delay_seconds" in changes and is_fifo_queue(queue):  # retroactive (19.3): waiting polls look again
            self.queues.fire(self._arrivals, queue)
        logger.info("attributes changed queue=%s explicit=%s", queue, json.dumps(explicit, sort_keys=True))
        return effective(explicit, self.defaults)

    async def stats(self, queue: QueueName) -> dict[str, Any]:
        """The JSON of ``GET /<queue>`` (:func:`mqcore.service.queues.queue_stats`).

        ``ready`` and the oldest age come from this daemon's index, brought up to date with
        the inotify events queued by then (:meth:`QueueStates.catch_up`: a change made through
        another daemon before this request shows at once); ``in_flight`` and ``delayed`` from one
        listing of ``delay/`` (Store.count_delay).
        """
        state = await self.queues.queue_state(queue)

        def read() -> tuple[tuple[int, int], dict[str, Any] | None]:
            counts = self.store.count_delay(queue).get(queue, (0, 0))
            return counts, self.store.read_redrive_status(queue)

        (in_flight, delayed), redrive = await self.run_in(self.savers, read)
        self.queues.catch_up()  # what other processes did before the listing, not a window later
        await recheck(self.queues, queue)  # shared filesystem: other hosts' changes since the last change check
        return queue_stats(
            queue,
            ready=len(state.index),
            oldest_ready=state.index.peek_oldest(),
            in_flight=in_flight,
            delayed=delayed,
            created_ms=state.created_ms,
            attrs=state.attrs,
            redrive=redrive,
            now=now_ms(),
        )

    async def peek(
        self, queue: QueueName, after: MessageId | None, limit: int, partition: tuple[int, int] | None = None
    ) -> tuple[list[PeekedFile], MessageId | None]:
        """A page of the queue's messages read without receiving them (:meth:`mqcore.protocol.Store.peek`).

        Runs on a saver thread, not the queue's fetcher: a large page never
        holds up receives.

        Raises:
            QueueNotFound: No such queue.
        """
        return await self.run_in(self.savers, lambda: self.store.peek(queue, after, limit, partition=partition))

    async def peek_ids(self, queue: QueueName, message_ids: list[str]) -> list[PeekedFile]:
        """The given messages read without receiving them (:meth:`mqcore.protocol.Store.peek_ids`).

        Raises:
            QueueNotFound: No such queue.
        """
        return await self.run_in(self.savers, self.store.peek_ids, queue, message_ids)

    async def purge(self, queue: QueueName) -> int:
        """Remove every message sent before now, in one step as seen by consumers (SQS PurgeQueue).

        Runs under the queue's fetcher lock, so no receive of this daemon
        interleaves; the purged names (a prefix of the index: ids sort by send
        time) are dropped from the index and waiting senders are woken.

        Returns:
            Message files moved to ``remove/`` at once.
        """
        fetcher = self.queues.fetcher_for(queue)
        async with fetcher.lock:
            await self.queues.queue_state(queue)

            def purge() -> tuple[int, Meta]:
                return self.store.purge(queue), self.queues.read_meta(queue)

            removed, meta = await fetcher.thread.run(purge)
            state = fetcher.queues.get(queue)
            if state is not None:
                self.queues.apply_meta(queue, state, meta)
                threshold = meta[2]
                while threshold is not None:
                    name = state.index.peek_oldest()
                    if name is None or name.partition(".")[0] > threshold:
                        break
                    state.index.discard(name)
        self.queues.fire(self.queues.room, queue)
        self.counts.add("purged", queue, removed)
        logger.info("purged queue=%s removed=%d", queue, removed)
        return removed

    # -- receive ---------------------------------------------------------------

    async def _lease_some(
        self, request: ReceiveRequest, check_exists: bool, state: QueueState | None = None
    ) -> list[ReceivedMessage]:
        """Lease up to ``max_messages`` ready messages, oldest first, in as few fetcher round trips as possible.

        The names are popped from the index on the loop and leased on the
        queue's fetcher thread (:class:`daemons._handoff.Handoff`: its jobs run
        in the order they were handed over, so receives keep the index's
        order). Receives do not wait for each other's round trip: the receives
        that arrive together are leased in one batch of the fetcher and
        answered with one wake of the loop. A purge or a queue deletion holds
        the fetcher's lock: a receive arriving meanwhile waits for it. A lone
        receive (:mod:`daemons._inline`) leases its names on the loop thread.

        An answer holds each message at most once. A message leased by an
        earlier round trip of this call can be ready again before the next
        one (visibility timeout 0: mq-mover redelivers it and inotify
        indexes it); its new name is set aside and put back in the index,
        not leased again, so the handle this call returns stays the
        message's latest.

        With ``partition`` = ``(i, M)`` only messages of partition ``i`` of ``M``
        are leased (SMQ's batches; strict FIFO within the partition, no peer fuzz).

        ``state`` is the queue's state when the caller got it with no yield since (one
        ``queue_state`` per receive instead of two); None: looked up here.

        Raises:
            QueueNotFound: Nothing was ready and (``check_exists``) the queue does not exist.
            StorageUnavailable: A lease failed and nothing was leased.
        """
        queue, wanted, partition = request.queue, request.max_messages, request.partition
        fetcher = self.queues.fetcher_for(queue)
        out: dict[str, ReceivedMessage] = {}
        popped = caught_up = rechecked = False
        held: list[str] = []
        fifo = is_fifo_queue(queue)
        if fifo:  # one receive of a FIFO queue at a time here: its group check and its leases go together (19.3)
            await fetcher.lock.acquire()
        try:
            if state is None or fifo:  # a FIFO receive may have waited for the lock
                state = await self.queues.queue_state(queue)
            try:
                while len(out) < wanted:
                    if not fifo and fetcher.lock.locked():  # a purge, queue deletion or attempt retry: pop after it
                        async with fetcher.lock:
                            pass
                        state = await self.queues.queue_state(queue)
                    index = state.index
                    rebuilds = index.rebuilds  # FIFO step 4 asks the index what entered it since these pops
                    names: list[str] = []
                    room = wanted - len(out)
                    while len(names) < (FIFO_ROUND_NAMES if fifo else room):  # FIFO: past blocked groups in few rounds
                        name = (
                            index.pop_fuzzed(0 if fifo else self.settings.peers)  # FIFO: oldest first
                            if partition is None
                            else index.pop_oldest_in(*partition)
                        )
                        if name is None:
                            break
                        (held if name.partition(".")[0] in out else names).append(name)
                    if not names:
                        if not out and not caught_up and self.queues.catch_up():
                            caught_up = True  # events held back by the inotify window may add ready names
                            continue
                        if not out and not rechecked and self.queues.change_check_seconds:
                            rechecked = True  # shared filesystem: another host's send since the last change check?
                            if await recheck(self.queues, queue):
                                continue
                        break
                    popped = True
                    relist = not (state.watched and partition is None)  # else step 4 is ours (19.3)
                    lease = (
                        self.store,
                        queue,
                        names,
                        request.visibility_timeout_ms,
                        state.policy,
                        room if fifo else None,
                        relist,
                        tuple(held) if fifo else (),  # an earlier round's: their groups stay blocked (19.3)
                    )
                    try:  # LoneOps.enter without its coroutine, unless a yield must decide
                        here = self.lone.enter_now()
                        if here is None:
                            here = await self.lone.settle()
                    except BaseException:  # cancelled before the lease: the names stay ready
                        index.update(names)
                        raise
                    try:  # alone: leased on the loop thread (daemons/_inline.py), else on the fetcher
                        if here and len(names) == 1 and not fifo:  # the usual lone receive: no LeaseOutcome
                            try:
                                message = self.store.lease(queue, names[0], lease[3], policy=state.policy)
                            except MQError as exc:  # lease_names' rule: the name stays ready; raised if none leased
                                index.update(names)
                                LeaseOutcome(error=exc).check(queue, len(out))
                                break
                            if message is not None:
                                out[message.message_id] = message
                            continue
                        outcome = lease_names(*lease) if here else await fetcher.thread.run(lease_names, *lease)
                    finally:
                        self.lone.leave()
                    index.update(outcome.untried)
                    if fifo and not relist:
                        await keep_group_order(self.queues, self.store, fetcher.thread, queue, state, outcome, rebuilds)
                    held.extend(outcome.held)  # FIFO: their group is in flight; back in the index after this receive
                    if fifo:
                        self.fifo_wakes.note(queue, outcome)  # a due delay or a group freed elsewhere wakes polls
                    outcome.check(queue, len(out))
                    for message in outcome.messages:
                        out[message.message_id] = message
                    if outcome.error is not None or outcome.next_due_ms is not None:
                        break  # FIFO queue delay: every later name is not due either (ids grow with send time)
            finally:
                state.index.update(held)
                if popped:
                    self.queues.fire(self.queues.room, queue)
        finally:
            if fifo:
                fetcher.lock.release()
        if not out and check_exists and not await self._queue_exists_now(fetcher.thread, queue):
            self.queues.forget_queue(queue)
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
        messages = list(out.values())
        self.leases.memory.received(*messages)
        self.counts.add("received", queue, len(messages))
        return messages

    async def _queue_exists_now(self, thread: Handoff, queue: QueueName) -> bool:
        """Whether ``queue`` exists, asked after a receive found nothing (its 404).

        One ``stat`` of ``queues/Q``: on the loop thread on a local filesystem (no thread round
        trip for an empty short poll), else on the queue's fetcher thread.

        Raises:
            StorageUnavailable: The ``stat`` failed other than with ENOENT/ENOTDIR.
        """
        if self.lone.enabled:
            return self.store.queue_exists(queue)
        return await thread.run(self.store.queue_exists, queue)

    async def _receive_waiting(self, request: ReceiveRequest, state: QueueState | None = None) -> list[ReceivedMessage]:
        """Lease up to ``max_messages``; if none is ready, wait up to ``wait_time_seconds`` for one (long polling).

        The wait is on the queue's arrival notification (sends through this
        daemon, inotify arrivals, rescans), never a poll; it ends at once when
        the daemon stops.

        ``state``: the queue's state, got with no yield since (for the first look only), or None.

        Raises:
            ServerBusy: More than ``--max-waiters`` long polls wait on the queue (503).
        """
        queue = request.queue
        if request.wait_time_seconds <= 0:  # no long poll: no arrival to wait for, so no signal to hold
            return await self._lease_some(request, True, state)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.wait_time_seconds
        check_exists = True
        while True:
            with self.queues.holding(self.queues.arrivals, queue) as arrival:
                messages = await self._lease_some(request, check_exists, state)
                state = None  # a later look after a wait looks the state up again
                remaining = deadline - loop.time()
                if messages or self.stopping or remaining <= 0:
                    return messages
                waiters = self.queues.arrivals.get(queue)
                if waiters is None:  # forgotten meanwhile (its directory went): look again, 404 if it is gone
                    check_exists = True
                    continue
                if waiters.holders > self.settings.max_waiters:
                    self.refusals["waiters"] += 1
                    raise ServerBusy(
                        f"more than {self.settings.max_waiters} long polls wait on queue {queue} (--max-waiters)",
                        queue=queue,
                    )
                woken = await arrival.wait_for(remaining)
            check_exists = not woken or self.stopping

    async def receive_state(self, queue: QueueName) -> QueueState:
        """``queue``'s state as a receive must see it: under ``--processes N`` another worker's sends
        are indexed first (they are in this worker's inotify queue before their 201, docs/api.md).

        Raises:
            QueueNotFound: No such queue.
        """
        state = self.receive_state_now(queue)
        return state if state is not None else await self.queues.queue_state(queue)

    def receive_state_now(self, queue: QueueName) -> QueueState | None:
        """:meth:`receive_state` without a coroutine when the queue is loaded and its metadata current, else None
        (then ``await`` ``queues.queue_state``: the load or the metadata's re-read). The hot receive calls this."""
        if self.settings.processes > 1 and self.queues.watcher is not None:
            self.queues.on_watch_events()
        state = self.queues.fetcher_for(queue).queues.get(queue)
        return None if state is None or state.meta_stale else state

    async def receive(self, queue: QueueName, args: ReceiveArgs) -> list[ReceivedMessage]:
        """Receive up to ``args.max_messages`` (1-10) messages (SQS ReceiveMessage); [] if none became ready.

        Args:
            queue: The queue.
            args: The checked arguments (:func:`mqcore.service.requests.check_receive`); None values
                take the queue's ``visibility_timeout_seconds`` and ``receive_wait_seconds``. With an
                ``attempt_id`` (SQS ReceiveRequestAttemptId), a retry within 5 minutes receives the
                same messages again (fresh handles) instead of new ones (:mod:`mqcore.service.attempts`).
        Raises:
            QueueNotFound: No such queue.
            ServerBusy: Too many long polls wait on the queue.
            StorageUnavailable: The receive failed.
        """
        state = self.receive_state_now(queue)  # usually loaded: no coroutine for it
        if state is None:
            state = await self.queues.queue_state(queue)  # receive_state's rest (on_watch_events is done)
        request = args.resolve(queue, state.attrs)
        if request.attempt_id is None:
            if request.wait_time_seconds <= 0:  # a short poll (_receive_waiting's first step): one layer less
                return await self._lease_some(request, True, state)
            return await self._receive_waiting(request, state)
        async with self._attempt_locks.holding_async((queue, request.attempt_id)):
            return await run_async(attempted_receive(self.store, request), self.in_saver, self._attempt_step)

    async def _attempt_step(self, op: ReceiveNew | Relet) -> list[ReceivedMessage]:
        """An operation of :func:`mqcore.service.attempts.attempted_receive`: a new receive, or a retry's."""
        if isinstance(op, Relet):
            return await self._relet(op.request, op.handles)
        return await self._receive_waiting(op.request)

    async def _relet(self, request: ReceiveRequest, handles: list[str]) -> list[ReceivedMessage]:
        """Receive again the messages of earlier receives (an attempt-id retry), on the queue's fetcher."""
        queue = request.queue
        fetcher = self.queues.fetcher_for(queue)
        async with fetcher.lock:
            state = await self.queues.queue_state(queue)
            hints = self.leases.memory.hints(handles)
            messages = await fetcher.thread.run(relet, self.store, request, handles, state.policy, hints)
            for message in messages:
                state.index.discard(ready_name(message.message_id, message.receive_count - 1))
        self.queues.fire(self.queues.room, queue)
        for message in messages:
            self.leases.memory.received(message)
        self.counts.add("received", queue, len(messages))
        return messages
