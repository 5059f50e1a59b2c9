"""Writing DataFrames to queues: each row is a message, sent from the executors with ``send_batch``.

The DataFrame's columns (checked on the driver when the write is planned):

- ``body`` or ``value`` (exactly one): BINARY (sent as is) or STRING (sent as UTF-8
  with the ``contentType`` option's type unless the row's ``content_type`` says otherwise);
- optional ``content_type`` STRING, ``attributes`` MAP<STRING,STRING>,
  ``delay_seconds`` (an integer type), ``queue`` STRING (the row's queue; null = the
  ``queue`` option).

Any other column is refused (select what the message should carry). A failed entry
raises after the client's own retries, so the Spark task fails and is retried: no
row is silently dropped, and a retried task sends again the rows it had sent
(duplicates; docs/spark.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    Row,
    ShortType,
    StringType,
    StructType,
)

from mqcore.client import BatchEntry, QueueClient
from mqcore.errors import MQError
from mqcore.spark._options import OptionError, SourceOptions

logger = logging.getLogger(__name__)

#: Rows gathered before they are sent (bounds an executor's memory; each send is ``batchSize`` per request).
ROWS_PER_FLUSH = 1000

_BODY_COLUMNS = ("body", "value")
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


class WriteFailed(RuntimeError):
    """Some rows of a write task were not sent; the task fails (and Spark retries it).

    Attributes:
        queue: The queue written to.
        failed: How many entries of the last ``send_batch`` failed.
        errors: The first few errors (the client's typed :class:`~mqcore.errors.MQError`).
    """

    def __init__(self, queue: str, failed: int, total: int, errors: Sequence[MQError]) -> None:
        first = "; ".join(f"{type(e).__name__}: {e}" for e in errors[:3])
        super().__init__(f"{failed} of {total} messages not sent to queue {queue!r}: {first}")
        self.queue = queue
        self.failed = failed
        self.errors = list(errors)


@dataclass
class MQCommitMessage(WriterCommitMessage):
    """What one write task sent: messages per queue."""

    sent: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RowPlan:
    """Where each message field is in a row (column positions, from the DataFrame's schema)."""

    body: int
    body_is_text: bool
    content_type: int | None
    attributes: int | None
    delay_seconds: int | None
    queue: int | None

    @classmethod
    def from_schema(cls, schema: StructType, options: SourceOptions) -> RowPlan:
        """Check the DataFrame's columns and find them.

        Raises:
            OptionError: No or both body columns, a column of the wrong type, an unknown
                column, or neither a ``queue`` option nor a ``queue`` column.
        """
        types: dict[str, DataType] = {f.name: f.dataType for f in schema.fields}
        index = {f.name: i for i, f in enumerate(schema.fields)}
        known = {*_BODY_COLUMNS, "content_type", "attributes", "delay_seconds", "queue"}
        unknown = [name for name in index if name not in known]
        if unknown:
            raise OptionError(
                f"column(s) {', '.join(unknown)} cannot be written to mq: select body or value "
                "(BINARY or STRING) and optionally content_type, attributes, delay_seconds, queue"
            )
        bodies = [name for name in _BODY_COLUMNS if name in index]
        if len(bodies) != 1:
            raise OptionError("a DataFrame written to mq needs exactly one of the columns body or value")
        body = bodies[0]
        if not isinstance(types[body], BinaryType | StringType):
            raise OptionError(f"column {body} must be BINARY or STRING, not {types[body].simpleString()}")
        expected: dict[str, tuple[type[DataType], ...]] = {
            "content_type": (StringType,),
            "attributes": (MapType,),
            "delay_seconds": _INTEGERS,
            "queue": (StringType,),
        }
        for name, allowed in expected.items():
            if name in types and not isinstance(types[name], allowed):
                raise OptionError(f"column {name} has type {types[name].simpleString()}, see docs/spark.md")
        attributes = types.get("attributes")
        if isinstance(attributes, MapType) and not (
            isinstance(attributes.keyType, StringType) and isinstance(attributes.valueType, StringType)
        ):
            raise OptionError(f"column attributes must be MAP<STRING,STRING>, not {attributes.simpleString()}")
        if not options.queues and "queue" not in index:
            raise OptionError("option queue is required (or a queue column naming each row's queue)")
        return cls(
            body=index[body],
            body_is_text=isinstance(types[body], StringType),
            content_type=index.get("content_type"),
            attributes=index.get("attributes"),
            delay_seconds=index.get("delay_seconds"),
            queue=index.get("queue"),
        )

    def message(self, row: Sequence[Any], options: SourceOptions) -> tuple[str, BatchEntry]:
        """The queue and the message of one row.

        Raises:
            ValueError: A null body, or a null queue with no ``queue`` option.
        """
        body = row[self.body]
        if body is None:
            raise ValueError("a row with a null body cannot be sent to mq")
        content_type = row[self.content_type] if self.content_type is not None else None
        if self.body_is_text:
            content_type = content_type or options.content_type
        else:
            body = bytes(body)
        attributes = row[self.attributes] if self.attributes is not None else None
        delay = row[self.delay_seconds] if self.delay_seconds is not None else None
        queue = row[self.queue] if self.queue is not None else None
        if queue is None:
            if not options.queues:
                raise ValueError("a row with a null queue, and no queue option")
            queue = options.queues[0]
        entry = BatchEntry(
            body,
            content_type=content_type,
            attributes=dict(attributes) if attributes else None,
            delay_seconds=None if delay is None else int(delay),
        )
        return queue, entry


def _send(client: QueueClient, queue: str, entries: list[BatchEntry], batch_size: int) -> None:
    results = client.send_batch(queue, entries, batch_size=batch_size)
    errors = [r for r in results if isinstance(r, MQError)]
    if errors:
        raise WriteFailed(queue, len(errors), len(entries), errors) from errors[0]


def write_rows(rows: Iterable[Row], plan: RowPlan, options: SourceOptions) -> MQCommitMessage:
    """Send every row (executor); the counts per queue go back to the driver.

    Raises:
        WriteFailed: An entry failed (after the client's retries); rows before it were sent.
        MQError: A whole request failed (e.g. QueueNotFound, ConnectionFailed after the retries).
    """
    sent: dict[str, int] = {}
    pending: dict[str, list[BatchEntry]] = {}
    count = 0
    with options.connect() as client:

        def flush() -> None:
            for queue, entries in pending.items():
                _send(client, queue, entries, options.batch_size)
                sent[queue] = sent.get(queue, 0) + len(entries)
            pending.clear()

        for row in rows:
            queue, entry = plan.message(row, options)
            pending.setdefault(queue, []).append(entry)
            count += 1
            if count % ROWS_PER_FLUSH == 0:
                flush()
        flush()
    return MQCommitMessage(sent)


def _totals(messages: Iterable[WriterCommitMessage | None]) -> tuple[int, int, dict[str, int]]:
    """(tasks that reported, tasks that did not, messages per queue)."""
    done = missing = 0
    sent: dict[str, int] = {}
    for message in messages:
        if isinstance(message, MQCommitMessage):
            done += 1
            for queue, n in message.sent.items():
                sent[queue] = sent.get(queue, 0) + n
        else:
            missing += 1
    return done, missing, sent


class _RowSender:
    """What the batch and the streaming writers share: the options and plan, and ``write``."""

    def __init__(self, options: SourceOptions, plan: RowPlan) -> None:
        self._options = options
        self._plan = plan

    def write(self, iterator: Iterator[Row]) -> MQCommitMessage:
        """Send this task's rows (executor)."""
        return write_rows(iterator, self._plan, self._options)


class MQWriter(_RowSender, DataSourceWriter):
    """Batch write: ``df.write.format("mq").option("queue", Q).mode("append").save()``."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what was sent (driver)."""
        done, _, sent = _totals(messages)
        logger.info("mq write committed tasks=%d sent=%d per_queue=%s", done, sum(sent.values()), sent)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what the finished tasks had sent: those messages stay in the queues (driver)."""
        done, failed, sent = _totals(messages)
        logger.warning(
            "mq write aborted tasks_done=%d tasks_failed=%d sent_by_done_tasks=%d per_queue=%s "
            "(sent messages stay; failed tasks may have sent part of their rows)",
            done,
            failed,
            sum(sent.values()),
            sent,
        )


class MQStreamWriter(_RowSender, DataSourceStreamWriter):
    """Streaming write: each micro-batch's rows are sent like a batch write's."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what micro-batch ``batchId`` sent (driver)."""
        done, _, sent = _totals(messages)
        logger.info("mq stream write committed batch=%d tasks=%d sent=%d", batchId, done, sum(sent.values()))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log an aborted micro-batch (driver); its sent messages stay and the batch is retried."""
        done, failed, sent = _totals(messages)
        logger.warning(
            "mq stream write aborted batch=%d tasks_done=%d tasks_failed=%d sent_by_done_tasks=%d",
            batchId,
            done,
            failed,
            sum(sent.values()),
        )
