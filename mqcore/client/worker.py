"""A worker that consumes a queue with a handler function (SMQ's ``SMQ::Worker``, over any sync client).

:class:`Worker` receives messages, calls the handler with each, and acks the
message when the handler returns. When the handler raises, the message is
released for a retry after an exponential backoff (``nack``), and the
exception is logged. After the queue's ``max_receive_count`` receives the
server (mq-mover, or the brokerless client's receive) moves the message to the
queue's dead-letter queue; the worker never moves messages itself.
:meth:`Worker.failed` and :meth:`Worker.clear_failed` show and empty that
dead-letter queue (SMQ's failed messages).

While a handler runs, one heartbeat thread extends the message's visibility
timeout (``change_visibility``) each time a third of it has passed, so a slow
handler keeps its message and no other consumer receives it meanwhile.
``concurrency`` threads each receive and handle one message at a time.
``partition``/``partitions`` split the queue between workers by message id
(SMQ's batches, :func:`mqcore.names.partition_of`).

Stopping is graceful: :meth:`Worker.stop`, SIGINT or SIGTERM stop receiving,
let running handlers finish and ack, then :meth:`Worker.run` returns its
:class:`WorkerStats`.

Example::

    from mqcore.client.worker import Worker

    def handle(message):
        print(message.json())

    stats = Worker("jobs", handle, client="http://127.0.0.1:8080", concurrency=4).run()
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, InitVar, dataclass
from types import FrameType
from typing import Any

from mqcore.attributes import MAX_VISIBILITY_TIMEOUT_SECONDS, MAX_WAIT_SECONDS
from mqcore.client.api import QueueClient
from mqcore.client.types import Message, PeekedMessage
from mqcore.errors import (
    InvalidRequest,
    MessageNotFound,
    MessageNotInFlight,
    MQError,
    QueueNotFound,
    StaleReceiptHandle,
)
from mqcore.limits import MAX_PEEK_LIMIT
from mqcore.names import MAX_PARTITIONS

logger = logging.getLogger(__name__)

#: How long after a released message's visibility deadline ``until_empty`` still waits for it, in
#: seconds: time for mq-mover to redeliver or dead-letter it and for the receive to see it.
UNTIL_EMPTY_GRACE_SECONDS = 2.0
#: Pause after an empty receive that did not long-poll, in seconds (SMQ: 1 second between polls).
IDLE_PAUSE_SECONDS = 1.0
#: First and largest pause after a failed receive, in seconds (doubles on each failure in a row).
RECEIVE_ERROR_BACKOFF_SECONDS = 1.0
MAX_RECEIVE_ERROR_BACKOFF_SECONDS = 30.0
#: Delay before retrying a lease extension that failed for a transient reason, in seconds.
EXTEND_RETRY_SECONDS = 1.0

#: Errors of a receive that retrying cannot fix: the queue is gone, or the request is wrong.
_FATAL_RECEIVE_ERRORS = (QueueNotFound, InvalidRequest)
#: Errors meaning the lease behind a receipt handle is over: another receive took the message,
#: or it is gone (deleted, purged, expired, dead-lettered), or it is ready again.
_LEASE_OVER_ERRORS = (StaleReceiptHandle, MessageNotFound, MessageNotInFlight, QueueNotFound)


Handler = Callable[[Message], Any]


@dataclass
class WorkerStats:
    """What one :meth:`Worker.run` did (counts of messages, or of calls where said)."""

    received: int = 0
    """Messages received."""
    acked: int = 0
    """Messages whose handler returned and that were then deleted (acked)."""
    failed: int = 0
    """Messages whose handler raised (each failed attempt counts once)."""
    dead_lettered: int = 0
    """Of ``failed``: attempts on the message's last allowed receive (``receive_count >= max_receive_count``
    with a dead-letter queue set), so the message goes to the dead-letter queue instead of coming back
    (SQS: RedrivePolicy)."""
    retried: int = 0
    """Of ``failed``: messages released for another attempt after a backoff."""
    released: int = 0
    """Messages received after a stop was asked, released unhandled at once."""
    extended: int = 0
    """Lease extensions (successful ``change_visibility`` calls of the heartbeat)."""
    lease_lost: int = 0
    """Messages whose ack or release failed because their lease was over (received again by another
    consumer, or gone): the handler's work may be repeated."""


def retry_backoff_seconds(receive_count: int, base_seconds: float, max_seconds: float) -> int:
    """Delay before the retry of a message whose handler failed, in whole seconds.

    ``min(max_seconds, base_seconds * 2 ** (receive_count - 1))`` rounded up, and at most
    :data:`MAX_VISIBILITY_TIMEOUT_SECONDS` (what a change of visibility accepts).

    Args:
        receive_count: Receives of the message so far, the failed one included (1 on the first).
        base_seconds: Delay after the first failure, in seconds.
        max_seconds: Largest delay, in seconds.
    """
    exponent = min(max(receive_count - 1, 0), 64)
    delay = min(max_seconds, base_seconds * 2.0**exponent)
    return min(MAX_VISIBILITY_TIMEOUT_SECONDS, math.ceil(delay))


@dataclass(eq=False)
class Worker:
    """Consume one queue with a handler (SMQ's worker; SQS consumer loop with ack and retries).

    Args:
        queue: The queue to consume.
        handler: Called with each :class:`~mqcore.client.Message`; returning acks the message,
            raising releases it for a retry (its return value is ignored). Runs on one of the
            worker's threads, up to ``concurrency`` at a time.
        client: A :class:`~mqcore.client.api.QueueClient` (``Client``, ``LocalClient``), shared by the worker's threads;
            or a URL / root directory given to ``mqcore.client.connect``, in which case the
            worker owns that client and closes it when :meth:`run` returns.
        concurrency: Threads, each receiving and handling one message at a time.
        partition: Receive only messages with ``partition_of(message_id, partitions) ==
            partition`` (SMQ's batches); with ``partitions``, or neither.
        partitions: Number of partitions (1-1000).
        visibility_timeout_seconds: Visibility timeout of each receive and of each lease
            extension, in seconds (1-43200); None = the queue's ``visibility_timeout_seconds``.
        wait_time_seconds: Long-polling wait of each receive, in seconds (0-20; SQS:
            WaitTimeSeconds). A stop waits for receives in progress, so this bounds how long
            :meth:`stop` can take beyond the running handlers.
        retry_backoff_seconds: Delay before the first retry of a failed message, in seconds;
            doubles with each receive of the message.
        max_retry_backoff_seconds: Largest retry delay, in seconds.
        install_signal_handlers: Make SIGINT and SIGTERM call :meth:`stop` while :meth:`run`
            runs on the main thread (the previous handlers are restored when it returns; a
            second signal goes to them, e.g. a second Ctrl-C raises KeyboardInterrupt).
        token: Bearer token when ``client`` is a URL (default: ``MQ_TOKEN``; docs/security.md).

    Raises:
        ValueError: An argument is out of its range, or only one of ``partition`` and
            ``partitions`` is given.
    """

    queue: str
    handler: Handler
    _: KW_ONLY
    client: InitVar[QueueClient | str]
    concurrency: int = 1
    partition: int | None = None
    partitions: int | None = None
    visibility_timeout_seconds: int | None = None
    wait_time_seconds: int = 20
    retry_backoff_seconds: float = 1.0
    max_retry_backoff_seconds: float = 300.0
    install_signal_handlers: bool = True
    token: InitVar[str | None] = None

    def __post_init__(self, client: QueueClient | str, token: str | None) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        partition, partitions = self.partition, self.partitions
        if (partition is None) != (partitions is None):
            raise ValueError("partition and partitions go together: give both or neither")
        if partitions is not None and partition is not None and not 0 <= partition < partitions <= MAX_PARTITIONS:
            raise ValueError(
                f"need 0 <= partition < partitions <= {MAX_PARTITIONS}, "
                f"got partition={partition} partitions={partitions}"
            )
        visibility = self.visibility_timeout_seconds
        if visibility is not None and not 1 <= visibility <= MAX_VISIBILITY_TIMEOUT_SECONDS:
            raise ValueError(
                f"visibility_timeout_seconds must be 1-{MAX_VISIBILITY_TIMEOUT_SECONDS} "
                f"(SQS: VisibilityTimeout), got {visibility}"
            )
        if not 0 <= self.wait_time_seconds <= MAX_WAIT_SECONDS:
            raise ValueError(
                f"wait_time_seconds must be 0-{MAX_WAIT_SECONDS} (SQS: WaitTimeSeconds), got {self.wait_time_seconds}"
            )
        if self.retry_backoff_seconds < 0 or self.max_retry_backoff_seconds < self.retry_backoff_seconds:
            raise ValueError(
                "need 0 <= retry_backoff_seconds <= max_retry_backoff_seconds, got "
                f"{self.retry_backoff_seconds} and {self.max_retry_backoff_seconds}"
            )
        self._client = client
        self._token = token
        self._lock = threading.RLock()  # reentrant: a signal handler of the caller's may call stop()
        self._stop_requested = False
        self._current: _Run | None = None

    # -- public API ------------------------------------------------------------------------

    def run(self, until_empty: bool = False) -> WorkerStats:
        """Consume the queue until :meth:`stop` (or a signal), or until it is empty.

        Args:
            until_empty: Return once a receive finds nothing, no handler runs, and every
                message this run released for a retry is :data:`UNTIL_EMPTY_GRACE_SECONDS`
                past its visibility deadline (so its retry was received, or it was
                dead-lettered). Receives then poll briefly (0 s when nothing is pending,
                else at most 1 s while handlers run, or until the next retry is due).
        Returns:
            What this run did.
        Raises:
            QueueNotFound: The queue does not exist (at the start, or was deleted meanwhile).
            InvalidRequest: The server refused the receive's parameters (e.g. an older server
                without partitions).
            RuntimeError: :meth:`run` is already running on another thread.
            MQError: Reading the queue's attributes at the start failed.
            Exception: Anything else a worker thread raised that was not an mq error of a
                receive, ack or release (a bug), or what the handler raised that is not an
                ``Exception`` (e.g. SystemExit in a handler); the other threads are stopped first.
        """
        with self._lock:
            if self._current is not None:
                raise RuntimeError("Worker.run() is already running")
            current = self._current = _Run(self, until_empty)
            if self._stop_requested:
                current.halt.set()
        try:
            with self._open_client() as client:
                current.client = client
                current.prepare()
                with self._signals():
                    current.start()
                    current.wait()
                if current.fatal is not None:
                    raise current.fatal
                return dataclasses.replace(current.stats)
        finally:
            with self._lock:
                self._current = None
                self._stop_requested = False

    def stop(self) -> None:
        """Stop the running :meth:`run` gracefully (thread-safe).

        From a signal handler of your own, call it from a new thread
        (``threading.Thread(target=worker.stop).start()``), as the handlers
        :meth:`run` installs do: a handler runs in the main thread between two
        bytecodes, maybe while that thread holds a ``threading.Event``'s lock, and
        setting that event there would wait forever (cpython gh-126434).

        No new handler starts; messages that receives in progress bring back are released at
        once; running handlers finish and ack (or release) their messages; then :meth:`run`
        returns. Called while no run is in progress, the next :meth:`run` returns at once.
        """
        with self._lock:
            self._stop_requested = True
            current = self._current
        if current is not None:
            current.halt.set()

    def failed(self, limit: int = 100) -> list[PeekedMessage]:
        """The messages in the queue's dead-letter queue, oldest first (SMQ's failed messages).

        Read with ``peek``: nothing is received or changed. A dead-letter queue shared by
        several queues lists their messages too (``source_queue`` tells them apart).

        Args:
            limit: Most messages to return (>= 1).
        Returns:
            Up to ``limit`` messages; [] if the queue has no dead-letter queue.
        Raises:
            ValueError: ``limit`` < 1.
            QueueNotFound: The queue or its dead-letter queue does not exist.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        with self._open_client() as client:
            dead_letter_queue = client.get_attributes(self.queue).get("dead_letter_queue")
            if not dead_letter_queue:
                return []
            out: list[PeekedMessage] = []
            after: str | None = None
            while len(out) < limit:
                page = client.peek(dead_letter_queue, after=after, limit=min(limit - len(out), MAX_PEEK_LIMIT))
                out.extend(page.messages)
                if page.next_after is None or not page.messages:
                    break
                after = page.next_after
            return out[:limit]

    def clear_failed(self) -> int:
        """Purge the queue's dead-letter queue (SMQ: clear failed messages).

        A dead-letter queue shared by several queues loses their messages too.

        Returns:
            Messages removed; 0 if the queue has no dead-letter queue.
        Raises:
            QueueNotFound: The queue or its dead-letter queue does not exist.
        """
        with self._open_client() as client:
            dead_letter_queue = client.get_attributes(self.queue).get("dead_letter_queue")
            if not dead_letter_queue:
                return 0
            removed = client.purge(dead_letter_queue)
            logger.info(
                "cleared failed messages queue=%s dead_letter_queue=%s removed=%d",
                self.queue,
                dead_letter_queue,
                removed,
            )
            return removed

    # -- helpers ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _open_client(self) -> Iterator[QueueClient]:
        """The client given, or one connected from the URL / root given and closed afterwards."""
        if not isinstance(self._client, str):
            yield self._client
            return
        from mqcore.client import connect

        options = {"token": self._token} if self._token is not None else {}
        client: QueueClient = connect(self._client, **options)
        try:
            yield client
        finally:
            client.close()

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM -> stop() while inside, when asked for and on the main thread."""
        if not self.install_signal_handlers or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous: dict[int, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            logger.info(
                "stopping on %s queue=%s (running handlers finish first)", signal.Signals(signum).name, self.queue
            )
            restore()  # a second signal goes to the previous handlers (a second Ctrl-C: KeyboardInterrupt)
            # stop() from another thread: a handler runs in the main thread between two bytecodes, possibly while
            # that thread holds the run's halt event's own (non-reentrant) lock, and halt.set() there would wait
            # for it forever (mqctl's StopSignal had this deadlock; cpython gh-126434).
            threading.Thread(target=self.stop, name=f"mq-worker-{self.queue}-stop", daemon=True).start()

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, signal.SIG_DFL if old is None else old)  # None: set outside Python

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
        try:
            yield
        finally:
            restore()


@dataclass(eq=False)
class _Lease:
    """A message whose handler is running, and when the heartbeat extends its lease next."""

    message: Message
    extend_at: float
    """Monotonic time of the next extension."""
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    """Held around each extension and around the end of the handler, so no extension runs after the ack."""
    active: bool = True
    """False once the handler finished or the lease was found over."""


class _Run:
    """The threads and shared state of one :meth:`Worker.run`."""

    def __init__(self, worker: Worker, until_empty: bool) -> None:
        self.worker = worker
        self.queue = worker.queue
        self.until_empty = until_empty
        self.client: QueueClient | None = None
        self.stats = WorkerStats()
        #: Set to end the run: stop(), drained (until_empty) or a fatal error.
        self.halt = threading.Event()
        self.fatal: BaseException | None = None
        self.visibility_timeout_seconds = 0
        self.max_receive_count: int | None = None
        self.dead_letter_queue: str | None = None
        # Guarded by self.lock:
        self.lock = threading.Lock()
        self.handlers_running = 0
        self.threads_alive = 0
        self.quiet_after = 0.0
        """Monotonic time after which every message this run released has come back or been dead-lettered."""
        self.all_done = threading.Event()
        # Heartbeat state, guarded by self.beat:
        self.beat = threading.Condition()
        self.leases: set[_Lease] = set()
        self.beat_stop = False
        self.threads: list[threading.Thread] = []

    @property
    def api(self) -> QueueClient:
        assert self.client is not None
        return self.client

    def prepare(self) -> None:
        """Read the queue's attributes: visibility timeout and redrive policy; warn about gaps."""
        attributes = self.api.get_attributes(self.queue)
        worker = self.worker
        queue_timeout = int(attributes.get("visibility_timeout_seconds") or 0)
        self.visibility_timeout_seconds = worker.visibility_timeout_seconds or queue_timeout
        self.dead_letter_queue = attributes.get("dead_letter_queue") or None
        self.max_receive_count = attributes.get("max_receive_count")
        if self.dead_letter_queue is None:
            logger.warning(
                "queue has no dead-letter queue: a message whose handler keeps failing is retried for ever "
                "(as SQS without a redrive policy) queue=%s",
                self.queue,
            )
        if self.visibility_timeout_seconds <= 0:
            logger.warning(
                "visibility timeout is 0: received messages are visible again at once and leases cannot be "
                "extended; pass visibility_timeout_seconds queue=%s",
                self.queue,
            )
        logger.info(
            "worker started queue=%s concurrency=%d visibility_timeout_seconds=%d partition=%s partitions=%s "
            "dead_letter_queue=%s max_receive_count=%s until_empty=%s",
            self.queue,
            worker.concurrency,
            self.visibility_timeout_seconds,
            worker.partition,
            worker.partitions,
            self.dead_letter_queue,
            self.max_receive_count,
            self.until_empty,
        )

    def start(self) -> None:
        """Start the heartbeat thread and the consumer threads."""
        heartbeat = threading.Thread(target=self._heartbeat, name=f"mq-worker-{self.queue}-heartbeat", daemon=True)
        heartbeat.start()
        self.threads.append(heartbeat)
        with self.lock:
            self.threads_alive = self.worker.concurrency
        for i in range(self.worker.concurrency):
            thread = threading.Thread(target=self._consume, name=f"mq-worker-{self.queue}-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def wait(self) -> None:
        """Wait (interruptible by signal handlers) until every consumer thread ended; stop the heartbeat."""
        self.all_done.wait()
        with self.beat:
            self.beat_stop = True
            self.beat.notify_all()
        for thread in self.threads:
            thread.join()
        stats = self.stats
        logger.info(
            "worker stopped queue=%s received=%d acked=%d failed=%d dead_lettered=%d released=%d extended=%d "
            "lease_lost=%d",
            self.queue,
            stats.received,
            stats.acked,
            stats.failed,
            stats.dead_lettered,
            stats.released,
            stats.extended,
            stats.lease_lost,
        )

    def _fail(self, exc: BaseException) -> None:
        """Record the first fatal error and stop the run."""
        with self.lock:
            if self.fatal is None:
                self.fatal = exc
        self.halt.set()

    # -- consumer threads ------------------------------------------------------------------

    def _consume(self) -> None:
        worker = self.worker
        error_pause = RECEIVE_ERROR_BACKOFF_SECONDS
        try:
            while not self.halt.is_set():
                wait_time_seconds = self._poll_wait()
                try:
                    messages = self.api.receive(
                        self.queue,
                        max_messages=1,
                        wait_time_seconds=wait_time_seconds,
                        visibility_timeout_seconds=worker.visibility_timeout_seconds,
                        partition=worker.partition,
                        partitions=worker.partitions,
                    )
                except _FATAL_RECEIVE_ERRORS:
                    raise
                except MQError as exc:
                    logger.warning(
                        "receive failed, retrying in %.1f s queue=%s error=%s: %s",
                        error_pause,
                        self.queue,
                        exc.code,
                        exc,
                    )
                    self.halt.wait(error_pause)
                    error_pause = min(MAX_RECEIVE_ERROR_BACKOFF_SECONDS, error_pause * 2)
                    continue
                error_pause = RECEIVE_ERROR_BACKOFF_SECONDS
                with self.lock:
                    self.stats.received += len(messages)
                    self.handlers_running += len(messages)
                if not messages:
                    if self.until_empty and self._drained():
                        break
                    if worker.wait_time_seconds == 0:  # no long polling: pause as SMQ
                        self.halt.wait(IDLE_PAUSE_SECONDS)
                    continue
                for message in messages:
                    try:
                        if worker._stop_requested:
                            self._release(message)
                        else:
                            self._handle(message)
                    finally:
                        with self.lock:
                            self.handlers_running -= 1
        except BaseException as exc:  # noqa: BLE001 - run() re-raises it after stopping the other threads
            self._fail(exc)
        finally:
            with self.lock:
                self.threads_alive -= 1
                last = self.threads_alive == 0
            if last:
                self.all_done.set()

    def _poll_wait(self) -> int:
        """The long-polling wait of the next receive, in seconds."""
        wait_time_seconds = self.worker.wait_time_seconds
        if not self.until_empty:
            return wait_time_seconds
        with self.lock:
            now = time.monotonic()
            if self.handlers_running == 0 and now >= self.quiet_after:
                return 0
            if self.handlers_running:
                return min(wait_time_seconds, 1)
            return min(wait_time_seconds, max(1, math.ceil(self.quiet_after - now)))

    def _drained(self) -> bool:
        """After an empty receive: True (and the run halts) if until_empty's condition holds."""
        with self.lock:
            if self.handlers_running or time.monotonic() < self.quiet_after:
                return False
        logger.info("queue is empty, worker stopping queue=%s", self.queue)
        self.halt.set()
        return True

    def _handle(self, message: Message) -> None:
        """Run the handler on one message; ack it, or release it for a retry if the handler raised."""
        lease = self._watch(message)
        try:
            self.worker.handler(message)
        except Exception as exc:  # noqa: BLE001 - any handler error means a retry; _retry logs it with exc_info
            self._unwatch(lease)
            self._retry(message, exc)
        except BaseException:
            self._unwatch(lease)
            self._release(message)
            raise
        else:
            self._unwatch(lease)
            self._ack(message)

    def _ack(self, message: Message) -> None:
        try:
            self.api.ack(message)
        except _LEASE_OVER_ERRORS as exc:
            logger.warning(
                "ack failed, the lease was over: another consumer may handle the message again "
                "queue=%s id=%s receive_count=%d error=%s",
                self.queue,
                message.message_id,
                message.receive_count,
                exc.code,
            )
            self._count(lease_lost=1)
        except MQError as exc:
            logger.error(
                "ack failed: the message comes back after its visibility timeout queue=%s id=%s error=%s: %s",
                self.queue,
                message.message_id,
                exc.code,
                exc,
            )
            self._count(lease_lost=1)
            self._expect_back(self.visibility_timeout_seconds)
        else:
            logger.debug("acked queue=%s id=%s receive_count=%d", self.queue, message.message_id, message.receive_count)
            self._count(acked=1)

    def _retry(self, message: Message, exc: Exception) -> None:
        """The handler raised: release the message after the backoff (at once on its last receive)."""
        worker = self.worker
        last = (
            self.dead_letter_queue is not None
            and self.max_receive_count is not None
            and message.receive_count >= self.max_receive_count
        )
        delay = (
            0
            if last
            else retry_backoff_seconds(
                message.receive_count, worker.retry_backoff_seconds, worker.max_retry_backoff_seconds
            )
        )
        if last:
            logger.warning(
                "handler failed on the last receive, the message goes to the dead-letter queue "
                "queue=%s id=%s receive_count=%d max_receive_count=%s dead_letter_queue=%s",
                self.queue,
                message.message_id,
                message.receive_count,
                self.max_receive_count,
                self.dead_letter_queue,
                exc_info=exc,
            )
        else:
            logger.warning(
                "handler failed, retrying in %d s queue=%s id=%s receive_count=%d",
                delay,
                self.queue,
                message.message_id,
                message.receive_count,
                exc_info=exc,
            )
        self._count(failed=1, dead_lettered=int(last), retried=int(not last))
        if self._nack(message, delay):
            self._expect_back(delay)

    def _release(self, message: Message) -> None:
        """Give a message back unhandled (visible again at once)."""
        logger.info("released unhandled on stop queue=%s id=%s", self.queue, message.message_id)
        if self._nack(message, 0):
            self._count(released=1)
            self._expect_back(0)

    def _nack(self, message: Message, delay_seconds: int) -> bool:
        """Release a message; False (logged) if that failed."""
        try:
            self.api.nack(message, delay_seconds)
        except _LEASE_OVER_ERRORS as exc:
            logger.warning(
                "release failed, the lease was over queue=%s id=%s error=%s", self.queue, message.message_id, exc.code
            )
            self._count(lease_lost=1)
            return False
        except MQError as exc:
            logger.error(
                "release failed: the message comes back after its visibility timeout queue=%s id=%s error=%s: %s",
                self.queue,
                message.message_id,
                exc.code,
                exc,
            )
            self._expect_back(self.visibility_timeout_seconds)
            return False
        return True

    def _expect_back(self, delay_seconds: float) -> None:
        """A message of this run becomes ready (or dead-lettered) after ``delay_seconds``: until_empty waits."""
        with self.lock:
            self.quiet_after = max(self.quiet_after, time.monotonic() + delay_seconds + UNTIL_EMPTY_GRACE_SECONDS)

    def _count(self, **increments: int) -> None:
        with self.lock:
            for name, value in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    # -- heartbeat: lease extension ----------------------------------------------------------

    def _watch(self, message: Message) -> _Lease:
        """Let the heartbeat extend this message's lease while its handler runs."""
        lease = _Lease(message, time.monotonic() + self.visibility_timeout_seconds / 3)
        if self.visibility_timeout_seconds > 0:
            with self.beat:
                self.leases.add(lease)
                self.beat.notify()
        return lease

    def _unwatch(self, lease: _Lease) -> None:
        """The handler finished: no extension runs after this returns."""
        with lease.lock:
            lease.active = False
            with self.beat:
                self.leases.discard(lease)

    def _heartbeat(self) -> None:
        """Extend each running message's lease once a third of its visibility timeout has passed."""
        try:
            with self.beat:
                while not self.beat_stop:
                    now = time.monotonic()
                    due = [lease for lease in self.leases if lease.extend_at <= now]
                    if not due:
                        next_at = min((lease.extend_at for lease in self.leases), default=None)
                        self.beat.wait(None if next_at is None else next_at - now)
                        continue
                    self.beat.release()
                    try:
                        for lease in due:
                            self._extend(lease)
                    finally:
                        self.beat.acquire()
        except BaseException as exc:  # noqa: BLE001 - run() re-raises it after stopping the consumers
            self._fail(exc)

    def _extend(self, lease: _Lease) -> None:
        seconds = self.visibility_timeout_seconds
        message = lease.message
        with lease.lock:
            if not lease.active:
                return
            started = time.monotonic()
            try:
                self.api.change_visibility(self.queue, message.receipt_handle, visibility_timeout_seconds=seconds)
            except _LEASE_OVER_ERRORS as exc:
                logger.warning(
                    "lease extension failed, the lease is over: another consumer may receive the message "
                    "queue=%s id=%s error=%s",
                    self.queue,
                    message.message_id,
                    exc.code,
                )
                lease.active = False
                next_at = None
            except MQError as exc:
                logger.warning(
                    "lease extension failed, retrying queue=%s id=%s error=%s: %s",
                    self.queue,
                    message.message_id,
                    exc.code,
                    exc,
                )
                next_at = started + min(EXTEND_RETRY_SECONDS, seconds / 3)
            else:
                logger.debug(
                    "lease extended queue=%s id=%s visibility_timeout_seconds=%d",
                    self.queue,
                    message.message_id,
                    seconds,
                )
                self._count(extended=1)
                next_at = started + seconds / 3
            with self.beat:
                if next_at is None:
                    self.leases.discard(lease)
                else:
                    lease.extend_at = next_at
