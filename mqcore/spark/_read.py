"""Reading queues into Spark: a batch snapshot by peek, and a streaming read that leases and acknowledges.

Batch (:class:`MQBatchReader`): ``numPartitions`` input partitions per queue;
partition ``i`` peeks only its share of the queue (``iter_peek(partition=i,
partitions=n)``, the server's id-based split), on the executor. Nothing is
received, leased or changed. With ``includeDeadLetters`` each partition also
peeks the same share of the queue's dead-letter queue and keeps the messages
that came from this queue (state ``dead_lettered``).

Streaming (:class:`MQStreamReader`), at least once. Spark runs ``latestOffset``,
``partitions``, ``commit`` and ``prepareForTriggerAvailableNow`` in one
long-lived Python process on the driver, and ``read`` on executors in fresh
unpickled copies (docs/spark.md, "Delivery"). The offset of micro-batch ``seq``
is ``{"seq": seq, "messages": {queue: [message ids]}}``:

- ``latestOffset(start, limit)`` leases the next batch on the driver: receives
  with attempt ids ``<consumer>:<seq>:<k>`` until the limit or until the queue
  has nothing ready. The leased messages stay in a driver-side dict by ``seq``
  and the offset names them. Then it acknowledges batch ``start`` (Spark calls
  it only once that batch is durably committed in the checkpoint): it deletes
  the batch's messages, in the background while Spark processes the new batch
  (the next call waits for that acknowledgement and raises its failure); when
  nothing new is ready it acknowledges at once and returns ``start``.
- ``partitions(start, end)`` ships the batch's messages to the executors inside
  the input partitions; after a restart (nothing in the dict) it rebuilds them
  from the offset's ids with ``peek_ids``, and acknowledges ``start`` (committed,
  but perhaps not deleted by the process that died).
- ``commit(end)`` acknowledges ``end`` too (deleting is idempotent).

Nothing is opened in ``__init__`` (readers are created and pickled in several
processes): the driver-side client, thread pool and dict are made on first use
and left out of pickles.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import math
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from mqcore.client import Message, PeekedMessage, QueueClient
from mqcore.errors import MessageNotFound, MQError, QueueNotFound
from mqcore.spark._options import SourceOptions

logger = logging.getLogger(__name__)

#: The read schema (batch and streaming), as a Spark DDL string.
READ_SCHEMA = (
    "message_id STRING, queue STRING, body BINARY, body_text STRING, content_type STRING, "
    "attributes MAP<STRING,STRING>, sent_timestamp TIMESTAMP, receive_count INT, state STRING"
)
#: ``state`` of a dead-lettered message in a batch read (the others are the peek's states).
DEAD_LETTERED = "dead_lettered"
#: ``state`` of a message leased by the streaming read.
IN_FLIGHT = "in_flight"

#: Most messages per receive request (the API's limit, SQS MaxNumberOfMessages).
RECEIVE_MAX_MESSAGES = 10
#: Receives in flight at once while the driver leases a micro-batch (each with its own attempt id).
LEASE_THREADS = 4
#: ``delete_batch`` / ``delete_by_ids`` calls in flight at once while the driver acknowledges a micro-batch.
ACK_THREADS = 4
#: Requests in flight at once on the driver in all (leases of the next batch and acks share them).
DRIVER_THREADS = max(LEASE_THREADS, ACK_THREADS)
#: Acknowledged sequence numbers remembered to skip repeated acks (``latestOffset`` then ``commit``).
REMEMBERED_ACKS = 64

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

#: One message as it travels to the executors: id, queue, body, content type, attributes,
#: sent (epoch ms), receive count, state.
MessageTuple = tuple[str, str, bytes, str, dict[str, str], int, int, str]


def _as_tuple(message: Message | PeekedMessage, queue: str, state: str) -> MessageTuple:
    return (
        message.message_id,
        queue,
        message.body,
        message.content_type,
        dict(message.attributes),
        message.sent_ms,
        message.receive_count,
        state,
    )


def _row(item: MessageTuple) -> tuple[Any, ...]:
    """A row of :data:`READ_SCHEMA` (``body_text`` is decoded here, on the executor)."""
    message_id, queue, body, content_type, attributes, sent_ms, receive_count, state = item
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    sent = _EPOCH + datetime.timedelta(milliseconds=sent_ms)  # exact, unlike a float division
    return (message_id, queue, body, text, content_type, attributes, sent, receive_count, state)


# -- batch read ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeekPartition(InputPartition):
    """One share of one queue for a batch read.

    Attributes:
        queue: The queue read.
        index: This share, ``0 <= index < count`` (the server's ``partition``).
        count: How many shares the queue is split into (``numPartitions``).
        dead_letter_queue: The queue's dead-letter queue, or None (or not read).
    """

    queue: str
    index: int
    count: int
    dead_letter_queue: str | None


class MQBatchReader(DataSourceReader):
    """A snapshot of the queues by peek: nothing is received or changed."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> list[PeekPartition]:
        """``numPartitions`` shares per queue; looks up each queue's dead-letter queue (driver).

        Raises:
            QueueNotFound: A queue does not exist.
        """
        opts = self._options
        out: list[PeekPartition] = []
        with opts.connect() as client:
            for queue in opts.queues:
                attributes = client.get_attributes(queue)
                dlq = attributes.get("dead_letter_queue") if opts.include_dead_letters else None
                out += [PeekPartition(queue, i, opts.num_partitions, dlq) for i in range(opts.num_partitions)]
        return out

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The rows of one share (executor): the queue's messages, then its dead-lettered ones."""
        assert isinstance(partition, PeekPartition)
        opts = self._options
        share = {"page_size": opts.page_size, "partition": partition.index, "partitions": partition.count}
        with opts.connect() as client:
            for message in client.iter_peek(partition.queue, **share):
                yield _row(_as_tuple(message, partition.queue, message.state))
            if partition.dead_letter_queue is None:
                return
            try:
                for message in client.iter_peek(partition.dead_letter_queue, **share):
                    if message.source_queue == partition.queue:
                        yield _row(_as_tuple(message, partition.queue, DEAD_LETTERED))
            except QueueNotFound:
                logger.warning(
                    "dead-letter queue not found, skipped queue=%s dead_letter_queue=%s",
                    partition.queue,
                    partition.dead_letter_queue,
                )


# -- streaming read -----------------------------------------------------------------------------


@dataclass(slots=True)
class LeasedPartition(InputPartition):
    """Part of one micro-batch, with the messages themselves (pickled to the executor)."""

    messages: list[MessageTuple]


@dataclass
class _Driver:
    """What the driver-side reader keeps between calls (never pickled)."""

    client: QueueClient
    pool: ThreadPoolExecutor
    #: Leased and not yet acknowledged batches: seq -> messages (id order).
    batches: dict[int, list[MessageTuple]] = field(default_factory=dict)
    #: Receipt handles of the messages this process leased: seq -> {message id: handle} (acks by handle).
    handles: dict[int, dict[str, str]] = field(default_factory=dict)
    #: Recently acknowledged seqs (acks repeat: ``latestOffset`` and ``commit``).
    acked: list[int] = field(default_factory=list)
    #: ``availableNow``: messages still to lease in this run (None = no bound).
    budget: int | None = None
    #: Random suffix for attempt ids that must be new (see :meth:`MQStreamReader._receive`).
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))
    #: Seqs whose plain attempt ids got an empty answer in this process: they use ``<id>:<nonce>``.
    fresh_ids: set[int] = field(default_factory=set)
    #: Guards :attr:`fresh_ids`, :attr:`handles`, :attr:`batches` and :attr:`acked` (the lease and ack
    #: threads share them).
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The next batch's lease, started in the background once this one is planned: (seq, future).
    prefetch: tuple[int, Future[list[MessageTuple]]] | None = None
    #: Runs the prefetch (its receives go through :attr:`pool`).
    prefetcher: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "mq-spark-prefetch"))
    #: The acknowledgement running in the background while Spark processes the next batch: (seq, future).
    pending_ack: tuple[int, Future[None]] | None = None
    #: Runs :attr:`pending_ack` (its deletes go through :attr:`pool`).
    acker: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "mq-spark-ack"))


def _offset(seq: int, messages: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    return {"seq": seq, "messages": {queue: list(ids) for queue, ids in messages.items() if ids}}


class MQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches leased on the driver, acknowledged once Spark has committed them (at least once)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._driver: _Driver | None = None  # opened on first use, in the driver's process only

    def __getstate__(self) -> dict[str, Any]:
        return {"_options": self._options, "_driver": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- driver side --

    def _state(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self._options.connect(), ThreadPoolExecutor(DRIVER_THREADS, "mq-spark"))
        return self._driver

    def initialOffset(self) -> dict[str, Any]:
        """Batch 0, no messages (a new query starts with whatever is ready when it runs)."""
        return _offset(0, {})

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxMessagesPerBatch)``: Spark's admission control caps each micro-batch."""
        return ReadMaxRows(self._options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Bound this run to the messages there are now: ready + delayed, summed over the queues."""
        state = self._state()
        total = 0
        for queue in self._options.queues:
            stats = state.client.queue_stats(queue)
            total += int(stats["ready"]) + int(stats["delayed"])
        state.budget = total
        logger.info("availableNow run bounded messages=%d queues=%s", total, ",".join(self._options.queues))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Lease the next batch, then acknowledge batch ``start``; ``start`` again when nothing is ready.

        The acknowledgement of ``start`` runs in the background while Spark processes the new
        batch (the daemon deletes while the executors work); the next call waits for it first.
        When nothing new is leased it runs at once, so an ``availableNow`` run ends with its
        last batch deleted.

        Raises:
            MQError: A delete failed other than with MessageNotFound (this call's, or the
                previous call's background one), or a receive failed (after the client's
                retries): the query fails and its restart tries again.
        """
        state = self._state()
        self._finish_ack()
        seq = int(start["seq"]) + 1
        want = self._options.max_messages_per_batch
        if isinstance(limit, ReadMaxRows):
            want = min(want, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            logger.warning("read limit %r not supported, using maxMessagesPerBatch=%d", limit, want)
        if state.budget is not None:
            want = min(want, state.budget)
        ahead = self._take_prefetch(seq)
        if want <= 0:
            self._release(ahead or [])
            self._ack(start)
            return start
        if ahead is None:
            leased = self._lease(seq, want)
        else:
            leased = ahead[:want]
            self._release(ahead[want:])  # a smaller limit than the prefetch's (Spark's admission control)
        if not leased:
            self._ack(start)
            return start
        if state.budget is not None:
            state.budget -= len(leased)
        with state.lock:
            state.batches[seq] = leased
        # prefetch=true: lease the next batch while Spark processes this one (the daemon would idle meanwhile).
        following = self._options.max_messages_per_batch
        if state.budget is not None:
            following = min(following, state.budget)
        if self._options.prefetch and following > 0:
            state.prefetch = (seq + 1, state.prefetcher.submit(self._lease, seq + 1, following))
        self._ack_later(start)
        by_queue: dict[str, list[str]] = {}
        for item in leased:
            by_queue.setdefault(item[1], []).append(item[0])
        return _offset(seq, by_queue)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[LeasedPartition]:
        """The messages of batch ``end``, in up to ``numPartitions`` parts (rebuilt by peek after a restart)."""
        seq = int(end["seq"])
        if seq == int(start["seq"]):
            return []
        state = self._state()
        with state.lock:
            items = state.batches.get(seq)
        if items is None:
            items = self._rebuild(end)
            with state.lock:
                state.batches[seq] = items
        self._ack_later(start)  # after a restart: the committed batch the dead process may not have deleted
        parts = min(self._options.num_partitions, len(items))
        if parts == 0:
            return []
        size = math.ceil(len(items) / parts)
        return [LeasedPartition(items[i : i + size]) for i in range(0, len(items), size)]

    def commit(self, end: dict[str, Any]) -> None:
        """Acknowledge batch ``end`` (Spark committed it; usually already done by ``latestOffset``)."""
        self._ack_later(end)

    def stop(self) -> None:
        """Finish a background acknowledgement, close the driver's client (Spark may never call this)."""
        if self._driver is not None:
            try:
                self._finish_ack()
            except MQError as exc:
                logger.warning("ack failed at stop, a restart deletes the batch again: %s", exc)
            self._driver.acker.shutdown(wait=True)
            self._driver.prefetcher.shutdown(wait=True)
            self._driver.pool.shutdown(wait=False)
            self._driver.client.close()
            self._driver = None

    def _take_prefetch(self, seq: int) -> list[MessageTuple] | None:
        """The prefetched lease of batch ``seq`` (waiting for it), or None if there is none.

        A prefetch for another batch (Spark planned differently) is released at once.

        Raises:
            MQError: The prefetch's receives failed (as a lease would).
        """
        state = self._state()
        if state.prefetch is None:
            return None
        ahead_seq, future = state.prefetch
        state.prefetch = None
        items = future.result()
        if ahead_seq == seq:
            return items
        self._release(items)
        return None

    def _release(self, items: Sequence[MessageTuple]) -> None:
        """Make leased messages visible again at once (visibility 0); failures only delay them."""
        if not items:
            return
        state = self._state()
        with state.lock:
            known = {i: h for handles in state.handles.values() for i, h in handles.items()}
        by_queue: dict[str, list[tuple[str, int]]] = {}
        for item in items:
            if item[0] in known:
                by_queue.setdefault(item[1], []).append((known[item[0]], 0))
        for queue, entries in by_queue.items():
            try:
                state.client.change_visibility_batch(queue, entries)
            except MQError as exc:
                logger.warning("release failed, the messages come back after their visibility timeout: %s", exc)
        logger.debug("released %d prefetched messages", len(items))

    def _ack_later(self, offset: Mapping[str, Any]) -> None:
        """Start acknowledging ``offset``'s batch in the background (after the one still running, if any).

        Raises:
            MQError: The previous background acknowledgement failed.
        """
        state = self._state()
        seq = int(offset["seq"])
        with state.lock:
            if seq == 0 or seq in state.acked:
                return
        if state.pending_ack is not None:
            if state.pending_ack[0] == seq:
                return
            self._finish_ack()
        state.pending_ack = (seq, state.acker.submit(self._ack, offset))

    def _finish_ack(self) -> None:
        """Wait for the background acknowledgement, if any.

        Raises:
            MQError: It failed (a delete other than MessageNotFound, after the client's retries).
        """
        state = self._state()
        if state.pending_ack is None:
            return
        _, future = state.pending_ack
        state.pending_ack = None
        future.result()

    def _ack(self, offset: Mapping[str, Any]) -> None:
        """Delete the messages of a committed batch; MessageNotFound counts as done.

        By receipt handle when this process leased them (the daemon's cheaper delete), by id
        otherwise (after a restart) and for any handle the daemon refused (e.g. stale: the
        message was leased again after its visibility timeout; it is still the committed
        batch's message, so it is deleted by id as before).
        """
        state = self._state()
        seq = int(offset["seq"])
        messages: Mapping[str, list[str]] = offset.get("messages") or {}
        with state.lock:
            if seq == 0 or seq in state.acked:
                return
            known = dict(state.handles.get(seq, {}))
        jobs: list[tuple[str, list[str], list[str] | None]] = []
        for queue, ids in messages.items():
            chunk = max(RECEIVE_MAX_MESSAGES, math.ceil(len(ids) / ACK_THREADS))
            by_handle = [i for i in ids if i in known]
            by_id = [i for i in ids if i not in known]
            for i in range(0, len(by_handle), chunk):
                part = by_handle[i : i + chunk]
                jobs.append((queue, part, [known[m] for m in part]))
            jobs += [(queue, by_id[i : i + chunk], None) for i in range(0, len(by_id), chunk)]
        deleted = missing = 0
        failures: list[MQError] = []
        for (queue, _, _), results in zip(jobs, state.pool.map(lambda job: self._delete(*job), jobs), strict=True):
            for result in results:
                if result is None:
                    deleted += 1
                elif isinstance(result, MessageNotFound):
                    missing += 1
                else:
                    failures.append(result)
                    logger.error("ack failed queue=%s seq=%d error=%s", queue, seq, result)
        if failures:
            raise failures[0]
        with state.lock:
            state.acked.append(seq)
            del state.acked[:-REMEMBERED_ACKS]
            for old in [s for s in state.batches if s <= seq]:
                del state.batches[old]
            for old in [s for s in state.handles if s <= seq]:
                del state.handles[old]
        logger.debug("acked seq=%d deleted=%d already_gone=%d", seq, deleted, missing)

    def _delete(self, queue: str, ids: list[str], handles: list[str] | None) -> list[MQError | None]:
        """Delete ``ids`` of ``queue`` (by their ``handles`` first, if given); one result per id."""
        client = self._state().client
        try:
            if handles is None:
                return client.delete_by_ids(queue, ids)
            results = client.delete_batch(queue, handles)
            retry = [k for k, r in enumerate(results) if r is not None and not isinstance(r, MessageNotFound)]
            if retry:
                for k, result in zip(retry, client.delete_by_ids(queue, [ids[k] for k in retry]), strict=True):
                    results[k] = result
            return results
        except QueueNotFound:
            logger.warning("queue deleted, its leased messages are gone queue=%s", queue)
            return [None] * len(ids)

    def _lease(self, seq: int, want: int) -> list[MessageTuple]:
        """Receive up to ``want`` messages for batch ``seq``, queue after queue (the first one rotates)."""
        queues = self._options.queues
        first = seq % len(queues)
        counter = itertools.count()
        out: list[MessageTuple] = []
        for queue in queues[first:] + queues[:first]:
            if len(out) >= want:
                break
            out += self._lease_queue(queue, seq, want - len(out), counter)
        return out

    def _lease_queue(self, queue: str, seq: int, want: int, counter: Iterator[int]) -> list[MessageTuple]:
        """Lease up to ``want`` messages of ``queue`` with a few receives in flight at once."""
        state = self._state()
        lock = threading.Lock()
        got: list[Message] = []
        remaining = want
        empty = False

        def take() -> None:
            nonlocal remaining, empty
            while True:
                with lock:
                    if empty or remaining <= 0:
                        return
                    n = min(RECEIVE_MAX_MESSAGES, remaining)
                    remaining -= n
                    k = next(counter)
                messages = self._receive(queue, n, seq, k)
                with lock:
                    remaining += n - len(messages)
                    got.extend(messages)
                    if not messages:
                        empty = True

        threads = min(LEASE_THREADS, math.ceil(want / RECEIVE_MAX_MESSAGES))
        for future in [state.pool.submit(take) for _ in range(threads)]:
            future.result()
        got.sort(key=lambda m: m.message_id)
        with state.lock:
            state.handles.setdefault(seq, {}).update((m.message_id, m.receipt_handle) for m in got)
        return [_as_tuple(m, queue, IN_FLIGHT) for m in got]

    def _receive(self, queue: str, n: int, seq: int, k: int) -> list[Message]:
        """One receive of batch ``seq`` with attempt id ``<consumer>:<seq>:<k>`` (or a new one, see below).

        The id is the same after a restart, so a batch leased by a run that died before Spark
        recorded it comes back at once (the server replays an attempt id's messages for 5
        minutes) instead of after the visibility timeout. But a query reusing the consumer name
        of another one (a new checkpoint, or two queries at once) within those 5 minutes gets
        the other run's replays, whose messages are gone: an empty answer although messages
        are ready. So once an id gets an empty answer, the receive is repeated with
        ``<consumer>:<seq>:<k>:<nonce>`` (random per process), and every later receive for
        ``seq`` in this process uses such ids: an idle poll costs one request.
        """
        state = self._state()
        plain = f"{self._options.consumer}:{seq}:{k}"
        options: dict[str, Any] = {
            "max_messages": n,
            "wait_time_seconds": 0,
            "visibility_timeout_seconds": self._options.visibility_timeout_seconds,
        }
        if seq not in state.fresh_ids:
            messages = state.client.receive(queue, attempt_id=plain, **options)
            if messages:
                return messages
            with state.lock:
                state.fresh_ids.add(seq)
                for old in [s for s in state.fresh_ids if s < seq - REMEMBERED_ACKS]:
                    state.fresh_ids.discard(old)
        messages = state.client.receive(queue, attempt_id=f"{plain}:{state.nonce}", **options)
        return messages

    def _rebuild(self, end: Mapping[str, Any]) -> list[MessageTuple]:
        """Batch ``end`` from its message ids (after a restart); messages deleted since are left out."""
        client = self._state().client
        items: list[MessageTuple] = []
        for queue, ids in (end.get("messages") or {}).items():
            try:
                found = client.peek_ids(queue, ids)
            except QueueNotFound:
                logger.warning("queue deleted, batch rebuilt without it queue=%s seq=%s", queue, end["seq"])
                continue
            items += [_as_tuple(m, queue, m.state) for m in found]
            if len(found) < len(ids):
                logger.info(
                    "batch rebuilt after a restart seq=%s queue=%s found=%d of %d",
                    end["seq"],
                    queue,
                    len(found),
                    len(ids),
                )
        items.sort(key=lambda item: item[0])
        return items

    # -- executor side --

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The rows of one part of a micro-batch (executor; the messages came inside the partition)."""
        assert isinstance(partition, LeasedPartition)
        for item in partition.messages:
            yield _row(item)
