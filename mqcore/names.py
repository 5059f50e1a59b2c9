"""Queue names, message ids and every file-name form of the on-disk protocol.

This is the only module that turns names into paths, so nothing a client sends
can address a path outside the root: queue names are checked against
``[A-Za-z0-9_-]{1,80}``, or ``[A-Za-z0-9_-]{1,75}.fifo`` for a FIFO queue
(SQS's rules), and message ids against the UUIDv7 form before any path is
built. ``docs/protocol.md`` describes the same forms.

A FIFO queue's name holds exactly one ``.``, in its ``.fifo`` suffix; no other
field of any form (id, receive count, deadline, token, hash) ever equals
``fifo`` or contains a ``.``, so every form stays unambiguous: a parser that
meets the field ``fifo`` right after a queue name's field joins the two
(``DL.Q.fifo.ID.RC.LT``), and ``Q.ID`` forms split at the last ``.``
(docs/protocol.md 19.1). Names of standard queues parse exactly as before.

File-name forms (protocol version 2; ``Q`` queue name, ``ID`` message id,
``RC`` receive count, ``DL`` deadline in epoch milliseconds, 13 digits,
``LT`` lease token, 17-32 lowercase hex digits unique to the receive or
delayed send that made the name: :func:`new_lease_token`)::

    new/Q.ID                 being written by a sender (O_EXCL)
    queues/Q/ID.RC           ready; RC receives so far (0 = never received)
    delay/DL.Q.ID.RC.LT      in flight until DL; RC counts this receive
    delay/DL.Q.ID.RC         the same, made by protocol version 1 (read, never made, by v2)
    remove/Q.ID              deleted message, to be unlinked by mq-reaper
    remove/Q.TOKEN.queue     a deleted queue's directory, to be removed whole

Extensions (issue 3; optional files, a root without them is valid)::

    queues/Q/.attributes     the queue's explicitly set attributes (JSON)
    queues/Q/.purge          purge marker: messages with ids <= purged_before_id are gone
    queues/Q/.redrive        status of the redrive task out of Q (a dead-letter queue)
    queues/Q/.redrive-cancel request to cancel the redrive task named in it
    queues/Q/.NAME.TOKEN.tmp one of the above being written (renamed over it)
    queues/.Q.TOKEN.creating a queue being created with its attributes (renamed to queues/Q)
    delay/DL.Q.ID.0.LT       a delayed send (receive count 0), invisible until DL
    attempts/Q.HASH          receive request attempt record; HASH = sha256 of the attempt id, hex
    queues/Q/.lease.KEY      bulk lease record: the receipt handles leased under KEY (issue 17)

A receipt handle is the ``delay/`` name its receive made (``DL.Q.ID.RC.LT``).
Everything after ``DL.`` is the lease's key (:attr:`InFlightName.lease_key`):
a change of visibility renames the file to a new ``DL`` and keeps the key, so
a handle names exactly one lease for its whole life, and no other receive can
ever make a name with the same key (the token is unique to its receive).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass
from typing import NewType

from mqcore._frozen import frozen_builder
from mqcore.errors import InvalidMessageId, InvalidQueueName, InvalidReceiptHandle, InvalidRequest, cap, echo

#: Version of the on-disk protocol these names implement (docs/protocol.md; 2 since lease tokens, issue 18).
PROTOCOL_VERSION = 2

QueueName = NewType("QueueName", str)
MessageId = NewType("MessageId", str)

#: Longest queue name, in characters (SQS: 80, a FIFO queue's ``.fifo`` suffix included).
MAX_QUEUE_NAME_CHARS = 80
#: Suffix of a FIFO queue's name (SQS: a queue is FIFO if and only if its name ends with it).
FIFO_SUFFIX = ".fifo"

_QUEUE_RE = re.compile(r"[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo")
_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_DEADLINE_DIGITS = 13
_COUNT_RE = re.compile(r"0|[1-9][0-9]{0,8}")
#: ``ID.RC``: :data:`_ID_RE` and :data:`_COUNT_RE` as one pattern (ids and counts hold no ".").
_READY_NAME_RE = re.compile(rf"({_ID_RE.pattern})\.({_COUNT_RE.pattern})")
_DEADLINE_RE = re.compile(r"[0-9]{13}")
_TOKEN_RE = re.compile(r"[0-9a-f]{17,32}")
#: A ``delay/`` name as one pattern (every delete by handle parses one): ``DL.Q.fifo.ID.RC.LT`` (a FIFO queue,
#: v2 only, section 19.1), or ``DL.Q.ID.RC.LT`` / v1's ``DL.Q.ID.RC`` (a queue name without a ".").
_IN_FLIGHT_NAME_RE = re.compile(
    rf"({_DEADLINE_RE.pattern})\."
    rf"(?:([A-Za-z0-9_-]{{1,75}}\.fifo)\.({_ID_RE.pattern})\.({_COUNT_RE.pattern})\.({_TOKEN_RE.pattern})"
    rf"|([A-Za-z0-9_-]{{1,80}})\.({_ID_RE.pattern})\.({_COUNT_RE.pattern})(?:\.({_TOKEN_RE.pattern}))?)"
)
_TOKEN32_RE = re.compile(r"[0-9a-f]{32}")

NEW_DIR = "new"
QUEUES_DIR = "queues"
DELAY_DIR = "delay"
REMOVE_DIR = "remove"
ATTEMPTS_DIR = "attempts"
#: File names of a queue's metadata inside ``queues/Q/`` (never message names: they start with ".").
ATTRIBUTES_FILE = ".attributes"
PURGE_FILE = ".purge"
REDRIVE_FILE = ".redrive"
REDRIVE_CANCEL_FILE = ".redrive-cancel"
#: Prefix of a bulk lease record's name in its queue's directory: ``queues/Q/.lease.KEY`` (issue 17).
BULK_LEASE_PREFIX = ".lease."
#: Suffix of a queue directory being created, inside ``queues/``.
STAGING_SUFFIX = ".creating"
#: How long a receive request attempt id is remembered, in ms (SQS: 5 minutes).
ATTEMPT_WINDOW_MS = 300_000
#: Suffix of a deleted queue's directory inside ``remove/``.
REMOVED_QUEUE_SUFFIX = ".queue"


#: Queue names that passed :func:`check_queue_name` (plain ``str`` only; cleared when full).
_checked_queue_names: set[str] = set()
#: Most names :data:`_checked_queue_names` holds before it starts again.
_MAX_CHECKED_QUEUE_NAMES = 100_000


def check_queue_name(name: str) -> QueueName:
    """Return ``name`` as a :data:`QueueName` if it is 1-80 chars of ``[A-Za-z0-9_-]`` or a FIFO name.

    A FIFO queue's name is 1-75 chars of ``[A-Za-z0-9_-]`` followed by ``.fifo`` (SQS: 80 in all).
    A name that passed once is remembered (a set lookup instead of the regex: a receive+delete
    cycle checks its queue's name at each layer that builds a path from it). Only exact ``str``
    values are remembered, so the answer for any input is the regex's.

    Raises:
        InvalidQueueName: Any other string (so ``..``, ``a/b`` or ``""`` never reach a path).
    """
    if type(name) is str and name in _checked_queue_names:
        return QueueName(name)
    if not isinstance(name, str) or not _QUEUE_RE.fullmatch(name):
        raise InvalidQueueName(
            "queue names are 1-80 characters of A-Z, a-z, 0-9, '-' and '_' (a FIFO queue's end with '.fifo')",
            queue=cap(name) if isinstance(name, str) else echo(name),
        )
    if type(name) is str:
        if len(_checked_queue_names) >= _MAX_CHECKED_QUEUE_NAMES:
            _checked_queue_names.clear()
        _checked_queue_names.add(name)
    return QueueName(name)


#: Longest bulk lease key (issue 17).
MAX_BULK_KEY_CHARS = 128
_BULK_KEY_RE = re.compile(rf"[A-Za-z0-9_:-]{{1,{MAX_BULK_KEY_CHARS}}}")


def check_bulk_key(key: object) -> str:
    """Return ``key`` if it is a bulk lease key: 1-128 characters of ``A-Z a-z 0-9 - _ :``.

    The key is part of the record's file name ``queues/Q/.lease.KEY`` (docs/protocol.md 20),
    so it can never hold a ``/``, a NUL or a ``.`` (a record's name never ends in ``.tmp``, and
    is never ``.`` or ``..``).

    Raises:
        InvalidRequest: Anything else (``details.parameter`` = ``key``), before any path is built.
    """
    if not isinstance(key, str) or not _BULK_KEY_RE.fullmatch(key):
        raise InvalidRequest(
            f"bulk lease keys are 1-{MAX_BULK_KEY_CHARS} characters of A-Z, a-z, 0-9, '-', '_' and ':'",
            parameter="key",
            key=cap(key) if isinstance(key, str) else echo(key),
        )
    return key


_PREFIX_RE = re.compile(r"[A-Za-z0-9_-]{0,80}|[A-Za-z0-9_-]{1,75}\.(?:f|fi|fif|fifo)?")


def is_fifo_queue(queue: str) -> bool:
    """True if ``queue`` names a FIFO queue: it ends with ``.fifo`` (SQS's rule; a string test, no I/O)."""
    return queue.endswith(FIFO_SUFFIX)


def is_queue_prefix(value: object) -> bool:
    """True for a queue name prefix (``list_queues``): 0-80 characters of ``[A-Za-z0-9_-]``, or a FIFO name's start."""
    return isinstance(value, str) and _PREFIX_RE.fullmatch(value) is not None


#: Longest MessageGroupId / MessageDeduplicationId, in characters (SQS: 128).
MAX_FIFO_ID_CHARS = 128
_FIFO_ID_RE = re.compile(rf"[\x21-\x7e]{{1,{MAX_FIFO_ID_CHARS}}}")


def check_fifo_id(value: object, parameter: str) -> str:
    """A MessageGroupId or MessageDeduplicationId: 1-128 characters of ``[!-~]`` (SQS: alphanumeric and punctuation).

    Raises:
        InvalidRequest: Anything else (``details["parameter"]`` = ``parameter``).
    """
    if not isinstance(value, str) or not _FIFO_ID_RE.fullmatch(value):
        raise InvalidRequest(
            f"{parameter} must be 1-{MAX_FIFO_ID_CHARS} characters of letters, digits and punctuation (SQS)",
            parameter=parameter,
            value=cap(value) if isinstance(value, str) else None,
        )
    return value


def check_message_id(value: str) -> MessageId:
    """Return ``value`` as a :data:`MessageId` if it is a lowercase canonical UUIDv7.

    Raises:
        InvalidMessageId: Anything else.
    """
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidMessageId(
            "message ids are lowercase UUIDv7 strings as returned in X-Message-Id",
            message_id=cap(value) if isinstance(value, str) else echo(value),
        )
    return MessageId(value)


def sent_ms_of(message_id: MessageId) -> int:
    """Return the send time of a message, in epoch milliseconds, from its id."""
    return int(message_id[0:8] + message_id[9:13], 16)


#: Most partitions a receive may split a queue into (SMQ's batches).
MAX_PARTITIONS = 1000


def partition_of(message_id: str, partitions: int) -> int:
    """The partition (0 to ``partitions - 1``) a message belongs to when a queue is split ``partitions`` ways.

    SMQ's batches split a queue "by the modulo of the ID". The rule is part
    of the on-disk contract (every daemon and brokerless client must agree):
    the last 8 hex digits of the id (random bits of the UUIDv7) as an
    integer, modulo ``partitions``. A message keeps its partition when it is
    received again or dead-lettered; a redrive gives it a new id (and so a
    new partition).

    Raises:
        ValueError: ``partitions`` is not 1 to :data:`MAX_PARTITIONS`.
    """
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be 1-{MAX_PARTITIONS}, got {partitions}")
    return int(message_id[-8:], 16) % partitions


def check_partition(partition: int | None, partitions: int | None) -> tuple[int, int] | None:
    """``(partition, partitions)`` of a partitioned receive or peek, or None when neither is given.

    Raises:
        InvalidRequest: Only one of them, ``partitions`` not 1 to :data:`MAX_PARTITIONS`, or
            ``partition`` not 0 to ``partitions - 1`` (``details["parameter"]`` names it).
    """
    if partition is None and partitions is None:
        return None
    if partition is None or partitions is None:
        missing = "partitions" if partitions is None else "partition"
        raise InvalidRequest("partition and partitions must be given together", parameter=missing)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidRequest(
            f"partitions must be an integer 1-{MAX_PARTITIONS}, got {partitions}", parameter="partitions"
        )
    if not 0 <= partition < partitions:
        raise InvalidRequest(
            f"partition must be 0-{partitions - 1} when partitions is {partitions}", parameter="partition"
        )
    return partition, partitions


#: Ids whose random bits one ``os.urandom`` call draws (:class:`IdGenerator`): one ``getrandom`` per this many ids.
ID_RANDOM_BLOCK = 256
#: The variant digit of an id (``8``-``b``: bits ``10`` then two random bits) for each random hex digit.
_VARIANT_DIGIT = {f"{i:x}": "89ab"[i & 3] for i in range(16)}
#: Every live generator, so a forked child drops the random bits it inherited (:func:`_forget_random_blocks`).
_GENERATORS: weakref.WeakSet[IdGenerator] = weakref.WeakSet()


class IdGenerator:
    """Makes message ids: UUIDv7 (RFC 9562) with a 12-bit monotonic counter.

    Ids from one generator strictly increase, even when the wall clock steps
    back (the last timestamp is reused and the counter carries on). Across
    processes and hosts they are unique by 62 random bits and sort by send
    time to the millisecond, so a queue's ready files, sorted by name, are in
    send order. Thread-safe.

    The random bits come from ``os.urandom``, drawn for :data:`ID_RANDOM_BLOCK`
    ids at once (one ``getrandom`` system call per block instead of one per id);
    each id takes bits no other id took, and a child made by ``fork`` drops the
    block it inherited and draws its own, so parent and child never share bits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0
        #: Random hex digits of the current block, and how many of them ids have taken.
        self._random = ""
        self._taken = 0
        _GENERATORS.add(self)

    def next_id(self, now_ms: int | None = None) -> MessageId:
        """Return a new message id; ``now_ms`` (epoch ms) defaults to the wall clock."""
        ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        with self._lock:
            ms, counter = self._stamp(ms)
            at = self._taken
            if at >= len(self._random):
                self._random, at = os.urandom(8 * ID_RANDOM_BLOCK).hex(), 0
            self._taken = at + 16
            rand = self._random[at : at + 16]
        return _format_id(ms, counter, rand)

    def next_ids(self, count: int) -> list[MessageId]:
        """Return ``count`` new message ids, in increasing order, with one lock for all.

        The same ids as ``count`` calls of :meth:`next_id` in this wall-clock
        millisecond would give (a batch send takes its entries' ids at once).
        """
        ms = time.time_ns() // 1_000_000
        with self._lock:
            stamps = [self._stamp(ms) for _ in range(count)]
            at = self._taken
            if at + 16 * count > len(self._random):  # a fresh block, large enough for all of them
                self._random, at = os.urandom(8 * max(count, ID_RANDOM_BLOCK)).hex(), 0
            self._taken = at + 16 * count
            rand = self._random[at : at + 16 * count]
        return [_format_id(ms, counter, rand[16 * i : 16 * i + 16]) for i, (ms, counter) in enumerate(stamps)]

    def _stamp(self, ms: int) -> tuple[int, int]:
        """The next (millisecond, counter) at wall-clock ``ms``, never going back (the caller holds the lock)."""
        if ms > self._last_ms:
            self._last_ms, self._counter = ms, 0
        else:
            self._counter += 1
            if self._counter > 0xFFF:
                self._last_ms, self._counter = self._last_ms + 1, 0
        return self._last_ms, self._counter

    def _forget_random(self) -> None:
        """Drop the random bits not yet taken (a forked child: its parent holds the same ones)."""
        self._random, self._taken = "", 0


def _forget_random_blocks() -> None:
    """In a child made by ``fork``: every generator draws fresh random bits for its next id."""
    for generator in list(_GENERATORS):
        generator._forget_random()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_random_blocks)


def _format_id(ms: int, counter: int, rand: str) -> MessageId:
    """A UUIDv7 message id from its millisecond, its 12-bit counter and 16 random hex digits (62 bits kept).

    ``xxxxxxxx-xxxx-7CCC-Vrrr-rrrrrrrrrrrr``: the millisecond's 12 hex digits, version 7, the counter,
    the variant digit (``10`` and the low two bits of ``rand``'s first digit), ``rand``'s other 15 digits.
    """
    return MessageId(  # %-formatting: 1.1 µs against an f-string's 1.5 (one per message sent; performance.md, stop 23)
        "%08x-%04x-7%03x-%s%s-%s"  # noqa: UP031
        % (ms >> 16, ms & 0xFFFF, counter, _VARIANT_DIGIT[rand[0]], rand[1:4], rand[4:])
    )


#: Hex digits of a lease token's per-process random part (64 bits, from ``os.urandom``).
LEASE_TOKEN_RANDOM_DIGITS = 16

_lease_tokens: tuple[str, itertools.count[int]] = ("", itertools.count())


def _new_lease_token_source() -> None:
    """Draw this process's random token prefix and restart its counter (at import and in every forked child)."""
    global _lease_tokens
    _lease_tokens = (os.urandom(LEASE_TOKEN_RANDOM_DIGITS // 2).hex(), itertools.count())


_new_lease_token_source()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lease_token_source)


def new_lease_token() -> str:
    """A lease token ``LT`` no other receive or delayed send, in any process on any host, ever makes.

    16 hex digits drawn from ``os.urandom`` once per process (again in every
    child after ``fork``, so a forked brokerless client or multiprocessing
    worker never repeats its parent's tokens), followed by a per-process
    counter in hex without leading zeros: 17-32 lowercase hex digits. Two
    processes make the same token only if their 64 random bits are equal
    (about 2^-64 per pair of processes); one process never repeats one. No
    system call: a string format and a counter step (``itertools.count``
    is atomic under the GIL, so it is thread-safe).
    """
    prefix, counter = _lease_tokens
    return f"{prefix}{next(counter):x}"


@dataclass(frozen=True, slots=True)
class InFlightName:
    """A parsed ``delay/`` file name: ``DL.Q.ID.RC.LT`` (protocol v2) or ``DL.Q.ID.RC`` (v1).

    Attributes:
        deadline_ms: Epoch milliseconds at which the message becomes ready again.
        queue: The queue the message belongs to.
        message_id: The message id.
        receive_count: Number of receives, this one included.
        token: The lease token ``LT`` (17-32 hex digits), or ``""`` for a name
            made by protocol version 1.
    """

    deadline_ms: int
    queue: QueueName
    message_id: MessageId
    receive_count: int
    token: str = ""

    @property
    def filename(self) -> str:
        """The file name inside ``delay/``."""
        return in_flight_name(self.deadline_ms, self.queue, self.message_id, self.receive_count, self.token)

    @property
    def lease_key(self) -> str:
        """``Q.ID.RC.LT`` (v1: ``Q.ID.RC``): the name without its deadline, which identifies one lease.

        A change of visibility keeps it; no other receive can make it.
        """
        if self.token:  # the file name after ``DL.``, without formatting the deadline (a lookup per delete)
            return f"{self.queue}.{self.message_id}.{self.receive_count}.{self.token}"
        return f"{self.queue}.{self.message_id}.{self.receive_count}"

    @property
    def is_legacy(self) -> bool:
        """True for a name of protocol version 1 (``DL.Q.ID.RC``, no token)."""
        return not self.token


#: ``InFlightName(*fields)`` without its frozen ``__init__`` (:func:`mqcore._frozen.frozen_builder`): one per delete.
_in_flight = frozen_builder(InFlightName)


def ready_name(message_id: MessageId, receive_count: int) -> str:
    """File name of a ready message inside ``queues/Q/``: ``ID.RC``."""
    return f"{message_id}.{receive_count}"


def parse_ready_name(filename: str) -> tuple[MessageId, int] | None:
    """Parse ``ID.RC``; return ``(message_id, receive_count)`` or None for any other name."""
    match = _READY_NAME_RE.fullmatch(filename)  # one regex: every receive parses the name it leases
    if match is None:
        return None
    return match[1], int(match[2])  # type: ignore[return-value]  # match[1] is an id (the NewType is a no-op)


def in_flight_name(
    deadline_ms: int, queue: QueueName, message_id: MessageId, receive_count: int, token: str = ""
) -> str:
    """File name of an in-flight or delayed message inside ``delay/``: ``DL.Q.ID.RC.LT``.

    Every v2 writer passes a ``token`` (:func:`new_lease_token` for a new
    receive or delayed send; the lease's own token for a change of
    visibility). Without one the v1 form ``DL.Q.ID.RC`` is built: only for
    a change of visibility of a lease made by protocol version 1.
    """
    if token:
        return f"{deadline_ms:0{_DEADLINE_DIGITS}d}.{queue}.{message_id}.{receive_count}.{token}"
    return f"{deadline_ms:0{_DEADLINE_DIGITS}d}.{queue}.{message_id}.{receive_count}"


def parse_in_flight_name(filename: str) -> InFlightName | None:
    """Parse a ``delay/`` file name ``DL.Q.ID.RC.LT`` (or v1's ``DL.Q.ID.RC``); None for any other name."""
    match = _IN_FLIGHT_NAME_RE.fullmatch(filename) if isinstance(filename, str) else None
    if match is None:
        return None
    deadline, fifo_queue, fifo_mid, fifo_rc, fifo_token, queue, mid, rc, token = match.groups()
    if fifo_queue is not None:  # InFlightName(...) without its frozen __init__ (the fields, checked by the regex)
        return _in_flight(int(deadline), fifo_queue, fifo_mid, int(fifo_rc), fifo_token)
    return _in_flight(int(deadline), queue, mid, int(rc), token or "")


def lease_key_of(filename: str) -> str | None:
    """The lease key (:attr:`InFlightName.lease_key`) of a ``delay/`` name, or None if it does not parse."""
    parsed = parse_in_flight_name(filename)
    return parsed.lease_key if parsed is not None else None


def parse_receipt_handle(handle: str) -> InFlightName:
    """Parse a receipt handle: the ``delay/`` name ``DL.Q.ID.RC.LT`` (or v1's ``DL.Q.ID.RC``) its receive made, RC >= 1.

    Raises:
        InvalidReceiptHandle: Anything else.
    """
    parsed = parse_in_flight_name(handle) if isinstance(handle, str) else None
    if parsed is None or parsed.receive_count < 1:
        raise InvalidReceiptHandle(
            "receipt handles are the X-Receipt-Handle strings returned by a receive",
            receipt_handle=cap(handle, 200) if isinstance(handle, str) else echo(handle),
        )
    return parsed


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    """A receipt handle, parsed once where it enters (HTTP, the SQS layer, a client call).

    The text is the ``delay/`` name ``DL.Q.ID.RC.LT`` (v1: ``DL.Q.ID.RC``) that its receive
    made (docs/protocol.md §8); :attr:`lease` is that name parsed. Past the edge, code passes
    this object, never the bare string, so nothing parses a handle twice.

    Attributes:
        text: The handle as the client holds it (``X-Receipt-Handle``, SQS ``ReceiptHandle``).
        lease: The parsed name; ``lease.lease_key`` identifies the one lease it stands for.
    """

    text: str
    lease: InFlightName

    @classmethod
    def parse(cls, text: object, queue: QueueName | None = None, message_id: str | None = None) -> ReceiptHandle:
        """Parse ``text`` as a receipt handle of ``queue`` (and of ``message_id``, if given).

        Args:
            text: What the caller sent; any type (a non-string is refused, not crashed on).
            queue: The queue named by the request; the handle must belong to it.
            message_id: The message id named by the request, if any; the handle must be of it.
        Raises:
            InvalidReceiptHandle: Not a handle a receive returns (receive count >= 1), or of
                another queue or message (HTTP 400; SQS ``ReceiptHandleIsInvalid``).
        """
        lease = parse_receipt_handle(text)  # type: ignore[arg-type]  # refuses non-strings itself
        assert isinstance(text, str)
        return _receipt_handle(text, lease).check(queue, message_id)  # cls(text, lease), quicker

    def check(self, queue: QueueName | None = None, message_id: str | None = None) -> ReceiptHandle:
        """This handle, if it is of ``queue`` (and of ``message_id``, if given).

        Raises:
            InvalidReceiptHandle: Of another queue or message (HTTP 400; SQS ``ReceiptHandleIsInvalid``).
        """
        if queue is not None and self.lease.queue != queue:
            raise InvalidReceiptHandle(
                f"receipt handle belongs to queue {self.lease.queue!r}, not {queue!r}",
                receipt_handle=cap(self.text, 200),
            )
        if message_id is not None and self.lease.message_id != message_id:
            raise InvalidReceiptHandle(
                f"receipt handle is of message {self.lease.message_id}, not {message_id}",
                receipt_handle=cap(self.text, 200),
            )
        return self

    @property
    def queue(self) -> QueueName:
        """The queue whose message the handle leases."""
        return self.lease.queue

    @property
    def message_id(self) -> MessageId:
        """The id of the leased message."""
        return self.lease.message_id

    @property
    def lease_key(self) -> str:
        """``Q.ID.RC.LT``: the handle's lease, kept across changes of visibility (§8.1)."""
        return self.lease.lease_key

    def __str__(self) -> str:
        return self.text


#: ``ReceiptHandle(text, lease)`` without its frozen ``__init__`` (:func:`mqcore._frozen.frozen_builder`).
_receipt_handle = frozen_builder(ReceiptHandle)


def new_name(queue: QueueName, message_id: MessageId) -> str:
    """File name of a message being written, inside ``new/``: ``Q.ID``."""
    return f"{queue}.{message_id}"


def parse_new_name(filename: str) -> tuple[QueueName, MessageId] | None:
    """Parse ``Q.ID`` from ``new/``; None for any other name (split at the last ``.``: ``Q`` may end ``.fifo``)."""
    queue, dot, mid = filename.rpartition(".")
    if not dot or not _QUEUE_RE.fullmatch(queue) or not _ID_RE.fullmatch(mid):
        return None
    return QueueName(queue), MessageId(mid)


def removed_name(queue: QueueName, message_id: MessageId) -> str:
    """File name of a deleted message inside ``remove/``: ``Q.ID``.

    Both are checked, the id first (a delete by id refuses a bad id before a bad queue name).

    Raises:
        InvalidMessageId: ``message_id`` is not a message id.
        InvalidQueueName: ``queue`` is not a queue name.
    """
    checked_id = check_message_id(message_id)
    return f"{check_queue_name(queue)}.{checked_id}"


def removed_entry_queue(filename: str) -> QueueName | None:
    """The queue of a ``remove/`` entry: ``Q.ID`` (a message) or ``Q.TOKEN.queue`` (a directory); None for others.

    Splits from the end, so the entries of queue ``a`` and of FIFO queue ``a.fifo`` never mix.
    """
    is_dir = filename.endswith(REMOVED_QUEUE_SUFFIX)
    queue, dot, last = filename.removesuffix(REMOVED_QUEUE_SUFFIX).rpartition(".")
    if not dot or not _QUEUE_RE.fullmatch(queue) or not (_TOKEN32_RE if is_dir else _ID_RE).fullmatch(last):
        return None
    return QueueName(queue)


#: Queue directory paths a :class:`Layout` remembers (cleared when full).
_MAX_CACHED_QUEUE_DIRS = 100_000


class Layout:
    """The folder tree under one root: ``new/``, ``queues/<queue>/``, ``delay/``, ``remove/``.

    Args:
        root: The root directory (created by :meth:`create` if missing).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        #: queue name -> its checked directory path (every receive and delete asks for one).
        self._queue_dirs: dict[str, str] = {}
        #: queue name -> ``new/<queue>.``, the checked start of its files' paths in ``new/`` (one per file sent).
        self._new_prefixes: dict[str, str] = {}
        self.new = os.path.join(self.root, NEW_DIR)
        self.queues = os.path.join(self.root, QUEUES_DIR)
        self.delay = os.path.join(self.root, DELAY_DIR)
        self.remove = os.path.join(self.root, REMOVE_DIR)
        self.attempts = os.path.join(self.root, ATTEMPTS_DIR)

    def create(self) -> None:
        """Create the top-level folders if missing (idempotent; mode 0o777 & ~umask)."""
        for path in (self.new, self.queues, self.delay, self.remove, self.attempts):
            os.makedirs(path, exist_ok=True)

    def queue_dir(self, queue: QueueName) -> str:
        """Path of ``queues/<queue>`` (the name is checked again, once per name: defence in depth)."""
        path = self._queue_dirs.get(queue) if type(queue) is str else None
        if path is None:
            path = os.path.join(self.queues, check_queue_name(queue))
            if len(self._queue_dirs) >= _MAX_CACHED_QUEUE_DIRS:
                self._queue_dirs.clear()
            self._queue_dirs[queue] = path
        return path

    def attributes_path(self, queue: QueueName) -> str:
        """Path of ``queues/<queue>/.attributes``."""
        return os.path.join(self.queue_dir(queue), ATTRIBUTES_FILE)

    def purge_path(self, queue: QueueName) -> str:
        """Path of ``queues/<queue>/.purge``."""
        return os.path.join(self.queue_dir(queue), PURGE_FILE)

    def redrive_path(self, queue: QueueName) -> str:
        """Path of ``queues/<queue>/.redrive``."""
        return os.path.join(self.queue_dir(queue), REDRIVE_FILE)

    def attempt_path(self, queue: QueueName, attempt_hash: str) -> str:
        """Path of ``attempts/<queue>.<hash>`` (``attempt_hash`` must be 64 lowercase hex digits)."""
        if not re.fullmatch(r"[0-9a-f]{64}", attempt_hash):
            raise ValueError(f"not a sha256 hex digest: {attempt_hash!r}")
        return os.path.join(self.attempts, f"{check_queue_name(queue)}.{attempt_hash}")

    def bulk_lease_path(self, queue: QueueName, key: str) -> str:
        """Path of ``queues/<queue>/.lease.<key>`` (queue name and key checked again: defence in depth)."""
        return os.path.join(self.queue_dir(queue), BULK_LEASE_PREFIX + check_bulk_key(key))

    def ready_path(self, queue: QueueName, message_id: MessageId, receive_count: int) -> str:
        """Path of a ready message file."""
        return os.path.join(self.queue_dir(queue), ready_name(message_id, receive_count))

    def new_path(self, queue: QueueName, message_id: MessageId) -> str:
        """Path of a message file being written, ``new/Q.ID`` (both checked again: the queue once per name, as
        :meth:`queue_dir`; the id each time)."""
        prefix = self._new_prefixes.get(queue) if type(queue) is str else None
        if prefix is None:
            prefix = os.path.join(self.new, new_name(check_queue_name(queue), MessageId("")))
            if len(self._new_prefixes) >= _MAX_CACHED_QUEUE_DIRS:
                self._new_prefixes.clear()
            self._new_prefixes[queue] = prefix
        return prefix + check_message_id(message_id)

    def delay_path(self, filename: str) -> str:
        """Path of a file in ``delay/``: a plain join (``os.path.join`` would let an absolute name escape it); the
        name's maker checks it (``..`` and ``/`` are refused by the name checks above)."""
        return f"{self.delay}/{filename}"

    def remove_path(self, filename: str) -> str:
        """Path of a file in ``remove/``: a plain join, as :meth:`delay_path`."""
        return f"{self.remove}/{filename}"
