"""mq: the HTTP front end (SoftLayer MQ's six endpoints) over the mqcore protocol.

Worker pairs, as in SoftLayer MQ: ``--workers N`` starts N savers (threads
that write, fsync and publish sent messages; their directory fsyncs are
group-committed) and N fetchers. All receives of one queue run on one
fetcher, chosen by a hash of the queue name, so they are serialized: with
``--peers 0`` a queue is strictly FIFO. Each fetcher keeps an in-memory index
of its queues' ready files, filled by one listing when a queue is first used
and kept fresh by this process's own sends, inotify events and a periodic
rescan, so a receive costs the same on a queue of 100 or 100,000 messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from aiohttp import web

from daemons import _runtime
from mqcore.errors import ConfigError, MessageTooLarge, MQError, QueueNotFound, StorageUnavailable
from mqcore.index import ReadyIndex
from mqcore.model import ReceivedMessage
from mqcore.names import (
    MessageId,
    QueueName,
    check_message_id,
    check_queue_name,
    parse_in_flight_name,
    ready_name,
)
from mqcore.protocol import Store
from mqcore.watch import DirEvent, DirWatcher, open_watcher

logger = logging.getLogger("mq.front")

T = TypeVar("T")

#: Largest visibility timeout, in seconds (SQS: VisibilityTimeout 0-43200).
MAX_VISIBILITY_TIMEOUT_SECONDS = 43_200
#: Default maximum body size, in bytes (SQS: 1 MiB).
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
#: Seconds a stopping mq waits for requests in progress before cancelling them. A send
#: whose body has arrived finishes in milliseconds (its fsync); what is still waiting
#: after this is a client that has not finished uploading, and never got a 201.
SHUTDOWN_TIMEOUT_SECONDS = 5.0
#: How many of this process's leases are remembered to make deletes by id cheap.
MAX_REMEMBERED_LEASES = 100_000


@dataclass(frozen=True, slots=True)
class Settings:
    """Settings of the ``mq`` daemon (checked on construction)."""

    root: str = "/tmp/mq"
    """Root directory of the folder tree (created if missing)."""
    address: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8080
    """TCP port; 0 picks a free one (logged in the readiness line)."""
    workers: int = 8
    """Worker pairs: N saver threads and N fetchers (SoftLayer MQ: --workers, default 8)."""
    peers: int = 0
    """Receive picks at random among the oldest peers+1 ready messages (0 = strict FIFO)."""
    visibility_timeout_seconds: int = 30
    """How long a received message stays invisible before redelivery, in seconds (SQS: 0-43200, default 30)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest accepted body, in bytes (default 1 MiB = 1,048,576 bytes, as SQS)."""
    rescan_interval_seconds: float = 10.0
    """Seconds between listings of each active queue (catches changes inotify cannot see, e.g. over NFS)."""
    log_level: str = "INFO"
    """Logging level name."""
    access_log: bool = False
    """Log one line per HTTP request on the ``mq.access`` logger (costs ~20% of send throughput)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535, got {self.port}", key="port")
        if not 1 <= self.workers <= 1024:
            raise ConfigError(f"workers must be 1-1024, got {self.workers}", key="workers")
        _runtime.positive("peers", self.peers, allow_zero=True)
        if not 0 <= self.visibility_timeout_seconds <= MAX_VISIBILITY_TIMEOUT_SECONDS:
            raise ConfigError(
                f"visibility-timeout must be 0-{MAX_VISIBILITY_TIMEOUT_SECONDS} seconds (as SQS), "
                f"got {self.visibility_timeout_seconds}",
                key="visibility_timeout",
            )
        _runtime.positive("max-message-size", self.max_message_bytes)
        _runtime.positive("rescan-interval", self.rescan_interval_seconds)


@dataclass
class _QueueState:
    """What a fetcher knows about one queue."""

    index: ReadyIndex = field(default_factory=ReadyIndex)
    watched: bool = False


class Fetcher:
    """One fetcher of a worker pair: a lock and a thread that serialize receives of its queues."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.lock = asyncio.Lock()
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mq-fetcher-{number}")
        self.queues: dict[QueueName, _QueueState] = {}


class Broker:
    """The daemon's state: the store, the worker pairs, the indexes and the watches.

    Args:
        settings: Daemon settings.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store(settings.root)
        self.savers = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="mq-saver")
        self.fetchers = [Fetcher(i) for i in range(settings.workers)]
        self.leases: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.watcher: DirWatcher | None = None
        self._rescan_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Attach inotify to the loop and start the periodic rescan."""
        self.watcher = open_watcher()
        if self.watcher is not None:
            asyncio.get_running_loop().add_reader(self.watcher.fileno(), self._on_watch_events)
        self._rescan_task = asyncio.create_task(self._rescan_loop(), name="mq-rescan")

    async def close(self) -> None:
        """Stop background work and the worker threads (after in-flight requests finished)."""
        self._stop.set()
        if self._rescan_task is not None:
            self._rescan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rescan_task
        if self.watcher is not None:
            asyncio.get_running_loop().remove_reader(self.watcher.fileno())
            self.watcher.close()
        self.savers.shutdown(wait=True)
        for fetcher in self.fetchers:
            fetcher.thread.shutdown(wait=True)
        self.store.close()

    # -- helpers -----------------------------------------------------------

    def fetcher_for(self, queue: QueueName) -> Fetcher:
        """The fetcher that serves ``queue`` (crc32 of the name modulo the worker count)."""
        return self.fetchers[zlib.crc32(queue.encode()) % len(self.fetchers)]

    async def _in(self, pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def _queue_state(self, fetcher: Fetcher, queue: QueueName) -> _QueueState:
        """The fetcher's index of ``queue``, loaded by one listing on first use.

        The watch is set before the listing, so no file slips between them.

        Raises:
            QueueNotFound: No such queue.
        """
        state = fetcher.queues.get(queue)
        if state is not None:
            return state
        qdir = self.store.layout.queue_dir(queue)
        watched = self.watcher.watch(qdir, queue) if self.watcher is not None else False
        try:
            names = await self._in(fetcher.thread, self.store.scan_ready, queue)
        except QueueNotFound:
            if self.watcher is not None:
                self.watcher.unwatch(queue)
            raise
        state = _QueueState(ReadyIndex(names), watched)
        fetcher.queues[queue] = state
        logger.info("indexed queue=%s ready=%d inotify=%s", queue, len(state.index), watched)
        return state

    def _forget_queue(self, queue: QueueName) -> None:
        self.fetcher_for(queue).queues.pop(queue, None)
        if self.watcher is not None:
            self.watcher.unwatch(queue)

    def _on_watch_events(self) -> None:
        assert self.watcher is not None
        for event in self.watcher.read():
            self._apply_event(event)

    def _apply_event(self, event: DirEvent) -> None:
        if event.overflow:
            logger.warning("inotify queue overflowed, rescanning every indexed queue")
            asyncio.get_running_loop().create_task(self.rescan_all())
            return
        queue = QueueName(event.tag)
        state = self.fetcher_for(queue).queues.get(queue)
        if state is None:
            return
        if event.dir_gone:
            self._forget_queue(queue)
        elif event.arrived:
            state.index.add(event.name)
        elif event.left:
            state.index.discard(event.name)

    async def _rescan_loop(self) -> None:
        interval = self.settings.rescan_interval_seconds
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=interval)
            if not self._stop.is_set():
                await self.rescan_all()

    async def rescan_all(self) -> None:
        """List every indexed queue again and add what the index missed."""
        for fetcher in self.fetchers:
            for queue in list(fetcher.queues):
                try:
                    names = await self._in(fetcher.thread, self.store.scan_ready, queue)
                except QueueNotFound:
                    self._forget_queue(queue)
                    continue
                state = fetcher.queues.get(queue)
                if state is not None:
                    before = len(state.index)
                    state.index.update(names)
                    if len(state.index) > before:
                        logger.info("rescan found queue=%s new=%d", queue, len(state.index) - before)

    # -- operations --------------------------------------------------------

    async def queue_exists(self, queue: QueueName) -> bool:
        """True if the queue exists."""
        return await self._in(self.savers, self.store.queue_exists, queue)

    async def create_queue(self, queue: QueueName) -> bool:
        """Create a queue; False if it existed."""
        created = await self._in(self.savers, self.store.create_queue, queue)
        if created:
            logger.info("created queue=%s", queue)
        return created

    async def delete_queue(self, queue: QueueName) -> None:
        """Delete a queue and all its messages (QueueNotFound if missing)."""
        fetcher = self.fetcher_for(queue)
        async with fetcher.lock:
            await self._in(fetcher.thread, self.store.delete_queue, queue)
            self._forget_queue(queue)
        logger.info("deleted queue=%s", queue)

    async def ready_count(self, queue: QueueName) -> int:
        """Approximate number of ready messages (from the index)."""
        fetcher = self.fetcher_for(queue)
        async with fetcher.lock:
            state = await self._queue_state(fetcher, queue)
            return len(state.index)

    async def send(self, queue: QueueName, body: bytes, content_type: str | None) -> MessageId:
        """Store a message durably and index it; return its id."""
        message_id = await self._in(self.savers, self.store.send, queue, body, content_type)
        state = self.fetcher_for(queue).queues.get(queue)
        if state is not None:
            state.index.add(ready_name(message_id, 0))
        return message_id

    async def receive(self, queue: QueueName, visibility_timeout_ms: int) -> ReceivedMessage | None:
        """Lease the oldest ready message (or one of the oldest peers+1); None if none is ready."""
        fetcher = self.fetcher_for(queue)
        async with fetcher.lock:
            state = await self._queue_state(fetcher, queue)
            while True:
                name = state.index.pop_fuzzed(self.settings.peers)
                if name is None:
                    if not await self._in(fetcher.thread, self.store.queue_exists, queue):
                        self._forget_queue(queue)
                        raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)
                    return None
                message = await self._in(fetcher.thread, self.store.lease, queue, name, visibility_timeout_ms)
                if message is not None:
                    self._remember_lease(message)
                    return message

    def _remember_lease(self, message: ReceivedMessage) -> None:
        key = (message.queue, message.message_id)
        self.leases[key] = message.in_flight_name
        self.leases.move_to_end(key)
        while len(self.leases) > MAX_REMEMBERED_LEASES:
            self.leases.popitem(last=False)

    async def delete(self, queue: QueueName, message_id: MessageId) -> str:
        """Delete a message by id wherever it is; return where it was.

        Hints from the index and from this process's leases make the usual
        case a single rename; when they miss (another process moved the
        message, or a redelivery's inotify event is still queued), the store
        lists ``delay/`` and the queue directory before answering 404.
        """
        if self.watcher is not None:
            self._on_watch_events()
        state = self.fetcher_for(queue).queues.get(queue)
        ready_hints = [ready_name(message_id, 0)]
        indexed = state.index.name_for(message_id) if state is not None else None
        if indexed:
            ready_hints.insert(0, indexed)
        lease = self.leases.pop((queue, message_id), None)
        if lease:
            parsed = parse_in_flight_name(lease)
            if parsed is not None:
                ready_hints.append(ready_name(message_id, parsed.receive_count))
        where = await self._in(
            self.savers,
            lambda: self.store.delete(
                queue, message_id, ready_hint=ready_hints, in_flight_hint=[lease] if lease else []
            ),
        )
        if indexed and state is not None:
            state.index.discard(indexed)
        return where


# -- HTTP ------------------------------------------------------------------

BROKER = web.AppKey("broker", Broker)


def _json_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn every error into a status plus a JSON body ``{"error": code, "message": ...}``."""
    try:
        return await handler(request)
    except MQError as exc:
        headers = {}
        if isinstance(exc, StorageUnavailable):
            headers["Retry-After"] = str(exc.retry_after_seconds)
            logger.error("storage unavailable method=%s path=%s error=%s", request.method, request.path, exc)
        return web.json_response(exc.to_json(), status=exc.status, headers=headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "message_too_large"}.get(exc.status, "http_error")
        return _json_error(exc.status, code, exc.reason or "error")
    except Exception:
        logger.exception("internal error method=%s path=%s", request.method, request.path)
        return _json_error(500, "internal_error", "internal error; see the server log")


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """Read the request body, at most ``max_bytes`` bytes.

    Raises:
        MessageTooLarge: Content-Length or the bytes received exceed ``max_bytes``.
    """
    if request.content_length is not None and request.content_length > max_bytes:
        raise MessageTooLarge(request.content_length, max_bytes)
    # The application's client_max_size is max_bytes + 1: aiohttp stops reading
    # a longer (chunked) body with 413, which the error middleware answers as
    # message_too_large; one extra byte is enough to tell "over the limit".
    body = await request.read()
    if len(body) > max_bytes:
        raise MessageTooLarge(len(body), max_bytes)
    return body


async def list_queues(request: web.Request) -> web.Response:
    """GET / -> 200 {"queues": [names]}."""
    broker = request.app[BROKER]
    names = await broker._in(broker.savers, broker.store.list_queues)
    return web.json_response({"queues": names})


async def get_queue(request: web.Request) -> web.Response:
    """GET /<queue> -> 200 {"queue", "ready"} or 404."""
    queue = check_queue_name(request.match_info["queue"])
    broker = request.app[BROKER]
    return web.json_response({"queue": queue, "ready": await broker.ready_count(queue)})


async def put_queue(request: web.Request) -> web.Response:
    """PUT /<queue> -> 201, also when the queue exists (idempotent); the body is ignored."""
    queue = check_queue_name(request.match_info["queue"])
    created = await request.app[BROKER].create_queue(queue)
    return web.json_response({"queue": queue, "created": created}, status=201)


async def delete_queue(request: web.Request) -> web.Response:
    """DELETE /<queue> -> 200 (the queue and every message in it) or 404."""
    queue = check_queue_name(request.match_info["queue"])
    await request.app[BROKER].delete_queue(queue)
    return web.json_response({"queue": queue, "deleted": True})


async def send_message(request: web.Request) -> web.Response:
    """POST /<queue>/messages -> 201 + X-Message-Id once the message is durable."""
    queue = check_queue_name(request.match_info["queue"])
    broker = request.app[BROKER]
    body = await read_body(request, broker.settings.max_message_bytes)
    content_type = request.headers.get("Content-Type")
    message_id = await broker.send(queue, body, content_type)
    return web.Response(
        status=201,
        body=b'{"message_id": "%s"}' % message_id.encode(),
        content_type="application/json",
        headers={"X-Message-Id": message_id},
    )


async def receive_message(request: web.Request) -> web.Response:
    """GET /<queue>/messages -> 200 raw body + X-Message-Id, X-Receive-Count, X-Sent-Timestamp; 204 if none."""
    queue = check_queue_name(request.match_info["queue"])
    broker = request.app[BROKER]
    message = await broker.receive(queue, broker.settings.visibility_timeout_seconds * 1000)
    if message is None:
        return web.Response(status=204)
    return web.Response(
        body=message.body,
        headers={
            "Content-Type": message.content_type,
            "X-Message-Id": message.message_id,
            "X-Receive-Count": str(message.receive_count),
            "X-Sent-Timestamp": str(message.sent_ms),
        },
    )


async def delete_message(request: web.Request) -> web.Response:
    """DELETE /<queue>/messages/<id> -> 200 wherever the message was; 404 if nowhere; 400 bad id."""
    queue = check_queue_name(request.match_info["queue"])
    message_id = check_message_id(request.match_info["message_id"])
    where = await request.app[BROKER].delete(queue, message_id)
    return web.json_response({"message_id": message_id, "deleted": True, "was": where})


def make_app(broker: Broker) -> web.Application:
    """The aiohttp application for ``broker`` (routes, error middleware)."""
    app = web.Application(middlewares=[errors_middleware], client_max_size=broker.settings.max_message_bytes + 1)
    app[BROKER] = broker
    app.router.add_get("/", list_queues)
    app.router.add_get("/{queue}", get_queue)
    app.router.add_put("/{queue}", put_queue)
    app.router.add_delete("/{queue}", delete_queue)
    app.router.add_post("/{queue}/messages", send_message)
    app.router.add_get("/{queue}/messages", receive_message)
    app.router.add_delete("/{queue}/messages/{message_id}", delete_message)
    return app


async def serve(settings: Settings, *, shutdown_trigger: asyncio.Event | None = None) -> int:
    """Run the HTTP front end until ``shutdown_trigger`` is set (or SIGTERM/SIGINT when None).

    In-flight requests finish before the process exits.

    Returns:
        Exit code 0.
    """
    stop = shutdown_trigger or asyncio.Event()
    if shutdown_trigger is None:
        _runtime.install_stop_signals(stop)
    broker = Broker(settings)
    await broker.start()
    access_log = logging.getLogger("mq.access") if settings.access_log else None
    runner = web.AppRunner(make_app(broker), access_log=access_log, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.address, settings.port, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await broker.close()
        raise ConfigError(f"cannot listen on {settings.address}:{settings.port}: {exc.strerror}") from exc
    host, port = runner.addresses[0][:2]
    logger.info("mq listening on http://%s:%d root=%s workers=%d", host, port, settings.root, settings.workers)
    _runtime.sd_notify("READY=1")
    await stop.wait()
    logger.info("stopping: finishing in-flight requests")
    await runner.cleanup()
    await broker.close()
    logger.info("stopped")
    return _runtime.EXIT_OK


@click.command(name="mq", context_settings={"help_option_names": ["-h", "--help"]})
@_runtime.config_option
@_runtime.root_option
@click.option(
    "--address",
    default="127.0.0.1",
    envvar="MQ_ADDRESS",
    show_envvar=True,
    show_default=True,
    help="Address to listen on.",
)
@click.option(
    "--port",
    type=int,
    default=8080,
    envvar="MQ_PORT",
    show_envvar=True,
    show_default=True,
    help="TCP port (0 = any free port).",
)
@click.option(
    "--workers",
    type=int,
    default=8,
    envvar="MQ_WORKERS",
    show_envvar=True,
    show_default=True,
    help="Worker pairs (one saver thread and one fetcher each).",
)
@click.option(
    "--peers",
    type=int,
    default=0,
    envvar="MQ_PEERS",
    show_envvar=True,
    show_default=True,
    help="Receive picks among the oldest PEERS+1 messages (0 = strict FIFO).",
)
@click.option(
    "--visibility-timeout",
    type=int,
    default=30,
    envvar="MQ_VISIBILITY_TIMEOUT",
    show_envvar=True,
    show_default=True,
    help="Seconds a received message stays invisible (0-43200).",
)
@click.option(
    "--max-message-size",
    type=int,
    default=DEFAULT_MAX_MESSAGE_BYTES,
    envvar="MQ_MAX_MESSAGE_SIZE",
    show_envvar=True,
    show_default=True,
    help="Largest body in bytes.",
)
@click.option(
    "--rescan-interval",
    type=float,
    default=10.0,
    envvar="MQ_RESCAN_INTERVAL",
    show_envvar=True,
    show_default=True,
    help="Seconds between listings of active queues.",
)
@_runtime.log_level_option
@click.option(
    "--access-log/--no-access-log",
    default=False,
    envvar="MQ_ACCESS_LOG",
    show_envvar=True,
    show_default=True,
    help="Log one line per HTTP request (logger mq.access).",
)
@click.pass_context
def cli(ctx: click.Context, **values: Any) -> int:
    """mq: the HTTP front end of the queue."""
    _runtime.setup_logging(values["log_level"])
    _runtime.log_sources(ctx, values)
    settings = Settings(
        root=_runtime.check_root(values["root"]),
        address=values["address"],
        port=values["port"],
        workers=values["workers"],
        peers=values["peers"],
        visibility_timeout_seconds=values["visibility_timeout"],
        max_message_bytes=values["max_message_size"],
        rescan_interval_seconds=values["rescan_interval"],
        log_level=values["log_level"],
        access_log=values["access_log"],
    )
    return _runtime.run(lambda: serve(settings))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mq`` console script; returns the exit code."""
    return _runtime.run_command(cli, argv, "mq")


if __name__ == "__main__":
    sys.exit(main())
