"""The streaming read: the executors lease their partitions of each micro-batch with bulk leases (issue 17).

Spark runs ``latestOffset``, ``partitions``, ``commit`` and
``prepareForTriggerAvailableNow`` in one long-lived Python process on the
driver, and ``read`` on executors in fresh unpickled copies (docs/spark.md,
"Streaming read: delivery"). The offset of micro-batch ``seq`` names its bulk
lease keys before any task runs::

    {"seq": seq, "run": R, "leases": [[queue, k, n], ...]}

- ``latestOffset(start, limit)`` (driver): deletes batch ``start``'s keys in the
  background (Spark calls it only once that batch is durably committed), asks
  the queues how many messages are ready (``queue_stats``), and when some are,
  returns the next offset: up to ``limit`` messages split over ``numPartitions``
  keys per queue. Nothing ready: the delete runs to its end and ``start`` is
  returned (no new batch).
- ``partitions(start, end)`` (driver): one :class:`BulkPartition` per entry; no
  request. After a restart the same offset gives the same keys.
- ``read(partition)`` (executor): one ``lease_bulk(queue, key, n)`` request; a
  retried or re-run task gets the key's messages again (the server re-lets its
  record), so a batch's rows do not depend on when its tasks ran.
- ``commit(end)`` deletes ``end``'s keys too (deleting a key is idempotent).

``R`` is drawn once per query (``initialOffset``) and carried from offset to
offset, so two queries that share a ``consumer`` name never share a key. Offsets
of the source before issue 17 (``{"seq", "messages": {queue: [ids]}}``) are still
read: such a batch is rebuilt from its ids (``peek_ids``) and acknowledged by id.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from mqcore.client import QueueClient
from mqcore.errors import MessageNotFound, MQError, QueueNotFound
from mqcore.spark._options import SourceOptions
from mqcore.spark._read import IN_FLIGHT, MessageTuple, _as_tuple, _row

logger = logging.getLogger(__name__)

#: ``delete_bulk`` calls in flight at once while the driver acknowledges a micro-batch.
ACK_THREADS = 4
#: Acknowledged sequence numbers remembered to skip repeated acks (``latestOffset`` then ``commit``).
REMEMBERED_ACKS = 64
#: Characters a ``consumer`` keeps in a lease key (``mqcore.names.check_bulk_key``); others become ``_``.
_NOT_IN_KEY = re.compile(r"[^A-Za-z0-9_:-]")


def lease_key(consumer: str, run: str, seq: int, k: int) -> str:
    """The bulk lease key of entry ``k`` of micro-batch ``seq``: ``<consumer>:<run>:<seq>:<k>`` (at most 128)."""
    return f"{_NOT_IN_KEY.sub('_', consumer)}:{run}:{seq}:{k}"


@dataclass(frozen=True, slots=True)
class BulkPartition(InputPartition):
    """One bulk lease of a micro-batch, leased by the executor that runs it.

    Attributes:
        queue: The queue.
        key: The bulk lease key (:func:`lease_key`).
        max_messages: The most messages it leases.
    """

    queue: str
    key: str
    max_messages: int


@dataclass(slots=True)
class RebuiltPartition(InputPartition):
    """A batch planned by the source before issue 17, rebuilt on the driver from its ids (a restart)."""

    messages: list[MessageTuple]


@dataclass
class _Driver:
    """What the driver-side reader keeps between calls (never pickled)."""

    client: QueueClient
    pool: ThreadPoolExecutor
    #: Recently acknowledged seqs (acks repeat: ``latestOffset`` and ``commit``).
    acked: list[int] = field(default_factory=list)
    #: ``availableNow``: messages this run may lease in all (None = no bound).
    budget: int | None = None
    #: Batches this process planned and has not acknowledged yet: seq -> most messages they lease.
    planned: dict[int, int] = field(default_factory=dict)
    #: Messages deleted by the acknowledgements of batches this process planned.
    counted: int = 0
    #: The acknowledgement running in the background while Spark processes the next batch: (seq, future).
    pending_ack: tuple[int, Future[int]] | None = None
    #: Runs :attr:`pending_ack` (its deletes go through :attr:`pool`).
    acker: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "mq-spark-ack"))


class MQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches leased by the executors under keys the offsets name; deleted by key once committed."""

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
            self._driver = _Driver(self._options.connect(), ThreadPoolExecutor(ACK_THREADS, "mq-spark"))
        return self._driver

    def initialOffset(self) -> dict[str, Any]:
        """Batch 0, nothing leased, and this query's run id (a new query starts with whatever is ready)."""
        return {"seq": 0, "run": secrets.token_hex(4), "leases": []}

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
        """Acknowledge batch ``start`` (in the background) and plan the next one; ``start`` when nothing is ready.

        Raises:
            MQError: The previous background acknowledgement failed, or a statistics request failed (after
                the client's retries): the query fails and its restart tries again.
        """
        state = self._state()
        self._finish_ack()
        self._ack_later(start)
        want = self._options.max_messages_per_batch
        if isinstance(limit, ReadMaxRows):
            want = min(want, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            logger.warning("read limit %r not supported, using maxMessagesPerBatch=%d", limit, want)
        if state.budget is not None:
            remaining = state.budget - state.counted - sum(state.planned.values())
            if remaining <= 0 and state.pending_ack is not None:  # the batch being acknowledged may have been short
                self._finish_ack()
                remaining = state.budget - state.counted - sum(state.planned.values())
            want = min(want, remaining)
        ready = {} if want <= 0 else self._ready()
        if not ready:
            self._finish_ack()  # nothing new: the last batch is deleted now (an availableNow run ends empty)
            return start
        seq = int(start["seq"]) + 1
        run = str(start.get("run") or secrets.token_hex(4))
        leases = self._split(seq, want, ready)
        state.planned[seq] = sum(n for _, _, n in leases)
        return {"seq": seq, "run": run, "leases": leases}

    def _ready(self) -> dict[str, int]:
        """Ready messages per queue that has some (``queue_stats``; a queue deleted meanwhile has none)."""
        out: dict[str, int] = {}
        client = self._state().client
        for queue in self._options.queues:
            try:
                ready = int(client.queue_stats(queue)["ready"])
            except QueueNotFound:
                logger.warning("queue not found, nothing read from it queue=%s", queue)
                continue
            if ready > 0:
                out[queue] = ready
        return out

    def _split(self, seq: int, want: int, ready: Mapping[str, int]) -> list[list[Any]]:
        """``[[queue, k, n], ...]``: up to ``want`` messages, queue after queue (the first rotates with ``seq``),
        each queue's share split over ``numPartitions`` keys."""
        queues = [q for q in self._options.queues if q in ready]
        first = seq % len(queues)
        parts = self._options.num_partitions
        out: list[list[Any]] = []
        for queue in queues[first:] + queues[:first]:
            share = min(ready[queue], want)
            want -= share
            for i in range(parts):
                n = share // parts + (1 if i < share % parts else 0)
                if n:
                    out.append([queue, len(out), n])
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """One :class:`BulkPartition` per lease of batch ``end`` (the same after a restart)."""
        seq = int(end["seq"])
        if seq == int(start["seq"]):
            return []
        self._ack_later(start)  # after a restart: the committed batch the dead process may not have deleted
        if "leases" not in end:
            return self._rebuild(end)
        run, consumer = str(end["run"]), self._options.consumer
        return [BulkPartition(q, lease_key(consumer, run, seq, int(k)), int(n)) for q, k, n in end["leases"]]

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
            self._driver.pool.shutdown(wait=False)
            self._driver.client.close()
            self._driver = None

    def _ack_later(self, offset: Mapping[str, Any]) -> None:
        """Start acknowledging ``offset``'s batch in the background (after the one still running, if any).

        Raises:
            MQError: The previous background acknowledgement failed.
        """
        state = self._state()
        seq = int(offset["seq"])
        if seq == 0 or seq in state.acked:
            return
        if state.pending_ack is not None:
            if state.pending_ack[0] == seq:
                return
            self._finish_ack()
        state.pending_ack = (seq, state.acker.submit(self._ack, offset))

    def _finish_ack(self) -> None:
        """Wait for the background acknowledgement, if any, and count what it deleted.

        Raises:
            MQError: It failed (a delete, after the client's retries).
        """
        state = self._state()
        if state.pending_ack is None:
            return
        seq, future = state.pending_ack
        state.pending_ack = None
        deleted = future.result()
        state.acked.append(seq)
        del state.acked[:-REMEMBERED_ACKS]
        if state.planned.pop(seq, None) is not None:
            state.counted += deleted

    def _ack(self, offset: Mapping[str, Any]) -> int:
        """Delete the messages of a committed batch: one ``delete_bulk`` per key; return how many were deleted."""
        state = self._state()
        seq = int(offset["seq"])
        if "leases" not in offset:
            return self._ack_ids(offset)
        run, consumer = str(offset["run"]), self._options.consumer
        jobs = [(str(q), lease_key(consumer, run, seq, int(k))) for q, k, _ in offset["leases"]]

        def delete(job: tuple[str, str]) -> int:
            try:
                return state.client.delete_bulk(*job)
            except QueueNotFound:
                logger.warning("queue deleted, its leased messages are gone queue=%s", job[0])
                return 0

        deleted = sum(state.pool.map(delete, jobs))
        logger.debug("acked seq=%d keys=%d deleted=%d", seq, len(jobs), deleted)
        return deleted

    def _ack_ids(self, offset: Mapping[str, Any]) -> int:
        """Delete a batch planned before issue 17 by its message ids; MessageNotFound counts as done."""
        client = self._state().client
        deleted = 0
        for queue, ids in (offset.get("messages") or {}).items():
            try:
                results = client.delete_by_ids(queue, ids)
            except QueueNotFound:
                continue
            failures = [r for r in results if r is not None and not isinstance(r, MessageNotFound)]
            if failures:
                raise failures[0]
            deleted += sum(r is None for r in results)
        return deleted

    def _rebuild(self, end: Mapping[str, Any]) -> list[InputPartition]:
        """A batch planned before issue 17, from its message ids (after a restart); deleted ones left out."""
        client = self._state().client
        items: list[MessageTuple] = []
        for queue, ids in (end.get("messages") or {}).items():
            try:
                items += [_as_tuple(m, queue, m.state) for m in client.peek_ids(queue, ids)]
            except QueueNotFound:
                continue
        items.sort(key=lambda item: item[0])
        return [RebuiltPartition(items)] if items else []

    # -- executor side --

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The rows of one lease (executor): ``lease_bulk`` under the partition's key, oldest first.

        A retried task (or a re-run after a restart) gets the key's messages again.
        """
        if isinstance(partition, RebuiltPartition):
            yield from (_row(item) for item in partition.messages)
            return
        assert isinstance(partition, BulkPartition)
        opts = self._options
        with opts.connect() as client:
            try:
                messages = client.lease_bulk(
                    partition.queue,
                    partition.key,
                    max_messages=partition.max_messages,
                    visibility_timeout_seconds=opts.visibility_timeout_seconds,
                )
            except QueueNotFound:
                logger.warning("queue deleted, partition read nothing queue=%s", partition.queue)
                return
        messages.sort(key=lambda m: m.message_id)
        for message in messages:
            yield _row(_as_tuple(message, partition.queue, IN_FLIGHT))
