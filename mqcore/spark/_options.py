"""The options of the ``mq`` data source: parsed once, checked, with their defaults and units.

Spark hands a data source its options as strings in a case-insensitive dict
(keys lower-cased). :func:`parse` turns them into a frozen :class:`SourceOptions`
that pickles to the executors (plain values only) and opens clients on demand.
Every option is documented in docs/spark.md; the table there and the constants
here must agree.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from mqcore.attributes import MAX_VISIBILITY_TIMEOUT_SECONDS
from mqcore.client import DEFAULT_URL, QueueClient, connect
from mqcore.client.types import TEXT_CONTENT_TYPE
from mqcore.limits import DEFAULT_BATCH_MESSAGES, MAX_BATCH_MESSAGES, MAX_PEEK_LIMIT
from mqcore.names import MAX_PARTITIONS

logger = logging.getLogger(__name__)

#: Default ``numPartitions``: input partitions per queue (batch read) or per micro-batch (streaming read).
DEFAULT_NUM_PARTITIONS = 2
#: Default ``pageSize``: messages per peek request of a batch read (the most the server allows).
DEFAULT_PAGE_SIZE = MAX_PEEK_LIMIT
#: Default ``consumer``: the prefix of the streaming read's bulk lease keys.
DEFAULT_CONSUMER = "spark"
#: Default ``maxMessagesPerBatch``: most messages leased for one micro-batch.
DEFAULT_MAX_MESSAGES_PER_BATCH = 10_000
#: Default ``visibilityTimeoutSeconds``: how long a leased message stays invisible, in seconds.
DEFAULT_VISIBILITY_TIMEOUT_SECONDS = 600
#: Default ``batchSize``: entries per ``send_batch`` request of a write (SQS: 10).
DEFAULT_BATCH_SIZE = DEFAULT_BATCH_MESSAGES
#: Default ``contentType`` of string bodies written.
DEFAULT_CONTENT_TYPE = TEXT_CONTENT_TYPE

#: Longest ``consumer``: a bulk lease key ``<consumer>:<run>:<seq>:<k>`` must stay within 128 characters.
MAX_CONSUMER_LENGTH = 64
_CONSUMER_RE = re.compile(rf"[!-~]{{1,{MAX_CONSUMER_LENGTH}}}")  # printable ASCII, no space

Mode = Literal["read", "stream", "load", "write"]

#: The options each use accepts (lower-cased, as Spark passes them); ``path`` comes from ``load(path)``.
_COMMON = {"url", "root", "queue", "path", "token", "cabundle"}
_KNOWN: dict[Mode, set[str]] = {
    "read": _COMMON | {"queues", "numpartitions", "pagesize", "includedeadletters"},
    "stream": _COMMON
    | {"queues", "consumer", "maxmessagesperbatch", "visibilitytimeoutseconds", "numpartitions", "prefetch"},
    "write": _COMMON | {"batchsize", "contenttype"},
}
#: ``load()`` does not tell a batch read from a streaming one: it accepts the options of either.
_KNOWN["load"] = _KNOWN["read"] | _KNOWN["stream"]
#: Options Spark itself passes to a streaming writer.
_SPARK_WRITE_OPTIONS = {"checkpointlocation"}


class OptionError(ValueError):
    """An option of the ``mq`` data source is missing, unknown or out of range (the message names it)."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The parsed options (see docs/spark.md for each).

    Attributes:
        target: The ``url`` (``http://...``) or the brokerless ``root`` folder (or ``load(path)``'s path: either).
        queues: The queues to read (``queue`` or ``queues``); for a write, the default queue or ().
        num_partitions: Input partitions per queue (batch read) or per micro-batch (streaming read).
        page_size: Messages per peek page (batch read), 1-1,000.
        include_dead_letters: Batch read: also the queue's dead-lettered messages.
        consumer: Prefix of the bulk lease keys ``<consumer>:<run>:<seq>:<k>``.
        max_messages_per_batch: Most messages leased for one micro-batch.
        visibility_timeout_seconds: Lease length of the streaming read, seconds (1-43,200).
        batch_size: Entries per ``send_batch`` request of a write.
        content_type: Content-Type of string bodies written.
        prefetch: Accepted for compatibility; no effect since the executors lease (issue 17, docs/spark.md).
        token: Bearer token for a server with ``--auth-file`` (option ``token``; default MQ_TOKEN of each process).
        ca_bundle: PEM CA bundle verifying an ``https://`` url (option ``caBundle``; default MQ_CA_BUNDLE).
    """

    target: str
    queues: tuple[str, ...]
    num_partitions: int = DEFAULT_NUM_PARTITIONS
    page_size: int = DEFAULT_PAGE_SIZE
    include_dead_letters: bool = True
    consumer: str = DEFAULT_CONSUMER
    max_messages_per_batch: int = DEFAULT_MAX_MESSAGES_PER_BATCH
    visibility_timeout_seconds: int = DEFAULT_VISIBILITY_TIMEOUT_SECONDS
    batch_size: int = DEFAULT_BATCH_SIZE
    content_type: str = DEFAULT_CONTENT_TYPE
    prefetch: bool = False
    token: str | None = field(default=None, repr=False)
    ca_bundle: str | None = None

    def connect(self) -> QueueClient:
        """A new client of :attr:`target` (the caller closes it)."""
        if self.target.startswith(("http://", "https://")):
            return connect(self.target, token=self.token, ca_bundle=self.ca_bundle)
        return connect(self.target)


def _integer(options: Mapping[str, str], key: str, name: str, default: int, low: int, high: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise OptionError(f"option {name}={value} is out of range {low}-{high:,}")
    return value


def _boolean(options: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {name}={raw!r} is not true or false")
    return text == "true"


def _queues(options: Mapping[str, str], mode: Mode) -> tuple[str, ...]:
    queue = options.get("queue")
    queues = options.get("queues")
    if queue is not None and queues is not None:
        raise OptionError("give option queue or queues, not both")
    if queues is not None:
        names = tuple(q.strip() for q in str(queues).split(",") if q.strip())
        if not names:
            raise OptionError("option queues is empty")
        if len(set(names)) != len(names):
            raise OptionError(f"option queues={queues!r} names a queue twice")
        return names
    if queue is not None and str(queue).strip():
        return (str(queue).strip(),)
    if mode == "write":
        return ()  # a `queue` column may name each row's queue
    raise OptionError("option queue is required (or queues: a comma-separated list)")


def parse(options: Mapping[str, str], mode: Mode) -> SourceOptions:
    """Check and parse the options of one use of the data source.

    Args:
        options: Spark's options (case-insensitive keys, string values).
        mode: ``read`` (batch read), ``stream`` (streaming read), ``load`` (either: the check
            ``load()`` makes before Spark knows which) or ``write`` (batch or streaming write).
    Returns:
        The parsed options.
    Raises:
        OptionError: An unknown option for this use, a missing ``queue``, both ``url`` and
            ``root``, or a value that is not a number/boolean or out of range.
    """
    keys = {str(k).lower() for k in options}
    unknown = sorted(keys - _KNOWN[mode])
    if mode == "write":
        # Writers also see options meant for Spark (checkpointLocation, ...): warn, do not refuse.
        unknown = [key for key in unknown if key not in _SPARK_WRITE_OPTIONS]
        if unknown:
            logger.warning("mq write ignores unknown option(s): %s", ", ".join(unknown))
    elif unknown:
        use = {"read": "a batch read", "stream": "a streaming read", "load": "a read"}[mode]
        raise OptionError(
            f"unknown option(s) for {use} of mq: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_KNOWN[mode] - {'path'}))})"
        )
    given = {key: str(options[key]) for key in ("url", "root", "path") if options.get(key) is not None}
    if len(given) > 1:
        raise OptionError(f"give one of option url (HTTP) or root (brokerless), not {' and '.join(given)}")
    target = next(iter(given.values()), DEFAULT_URL)
    consumer = str(options.get("consumer", DEFAULT_CONSUMER))
    if not _CONSUMER_RE.fullmatch(consumer):
        raise OptionError(f"option consumer={consumer!r} must be 1-{MAX_CONSUMER_LENGTH} printable ASCII, no spaces")
    return SourceOptions(
        target=target,
        queues=_queues(options, mode),
        num_partitions=_integer(options, "numpartitions", "numPartitions", DEFAULT_NUM_PARTITIONS, 1, MAX_PARTITIONS),
        page_size=_integer(options, "pagesize", "pageSize", DEFAULT_PAGE_SIZE, 1, MAX_PEEK_LIMIT),
        include_dead_letters=_boolean(options, "includedeadletters", "includeDeadLetters", True),
        consumer=consumer,
        max_messages_per_batch=_integer(
            options, "maxmessagesperbatch", "maxMessagesPerBatch", DEFAULT_MAX_MESSAGES_PER_BATCH, 1, 10_000_000
        ),
        visibility_timeout_seconds=_integer(
            options,
            "visibilitytimeoutseconds",
            "visibilityTimeoutSeconds",
            DEFAULT_VISIBILITY_TIMEOUT_SECONDS,
            1,
            MAX_VISIBILITY_TIMEOUT_SECONDS,
        ),
        batch_size=_integer(options, "batchsize", "batchSize", DEFAULT_BATCH_SIZE, 1, MAX_BATCH_MESSAGES),
        content_type=str(options.get("contenttype", DEFAULT_CONTENT_TYPE)),
        prefetch=_boolean(options, "prefetch", "prefetch", False),
        token=str(options["token"]) if options.get("token") else None,
        ca_bundle=str(options["cabundle"]) if options.get("cabundle") else None,
    )
