"""Reading queues into Spark: a batch snapshot by peek (the streaming read is :mod:`mqcore.spark._stream`).

Batch (:class:`MQBatchReader`): ``numPartitions`` input partitions per queue;
partition ``i`` peeks only its share of the queue (``iter_peek(partition=i,
partitions=n)``, the server's id-based split), on the executor. Nothing is
received, leased or changed. With ``includeDeadLetters`` each partition also
peeks the same share of the queue's dead-letter queue and keeps the messages
that came from this queue (state ``dead_lettered``).

The rows' columns (:data:`READ_SCHEMA`) and their making (:func:`_row`) are
shared with the streaming read (:mod:`mqcore.spark._stream`).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from mqcore.client import Message, PeekedMessage
from mqcore.errors import QueueNotFound
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
