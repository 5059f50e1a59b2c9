"""mq: the HTTP front end (SoftLayer MQ's six endpoints plus SQS semantics) over the mqcore protocol.

Worker threads, as SoftLayer MQ's worker pairs: ``--workers N`` allows N
savers (``daemons._savers``, one pool for every route, started as work needs
them: each send's files written and fsynced, the renames of a batch published
with one group-committed directory fsync; queue administration, change of
visibility, redrive) and N fetchers (``daemons._handoff``, each started by its
first job), plus one remover thread (deletes, one fsync of ``remove/`` per
batch, started by its first delete). All receives of one queue run on one fetcher,
chosen by a hash of the queue name, leased in batches in index order: with
``--peers 0`` a queue is strictly FIFO. Each fetcher keeps an in-memory index
of its queues' ready files, filled by one listing when a queue is first used
and kept fresh by this process's own sends, inotify events and a periodic
rescan, so a receive costs the same on a queue of 100 or 100,000 messages.

On top of that (issue 3, the routes of ``docs/api.md``): receipt handles and
change of visibility, receives of up to 10 messages in one fetcher round trip,
long polling (a receive waits on a per-queue asyncio notification set by this
daemon's sends, inotify arrivals and rescans: no polling), batch send with one
group commit, receive request attempt ids, delayed sends, message attributes,
queue attributes (cached per queue, re-read when inotify or a rescan sees the
``.attributes`` or ``.purge`` file change), capacity (a send to a full queue
waits on a notification set when the ready count drops), purge, queue
statistics and redrive tasks out of dead-letter queues. Every state lives in
the folder tree (``docs/protocol.md``); the daemon holds only caches, waiters
and the one redrive task it runs per dead-letter queue.

The code is in these modules, each importing only the ones after it:
``front`` (this one, the entry point: settings from the command line, the
routes, serving), ``daemons._fastpath`` (the single send, receive and delete
served without the router and middlewares), ``daemons._http`` and
``daemons._sqs`` (request parsing, the error middleware, the route handlers), ``daemons._broker`` (one method per
operation; the leases), ``daemons._send`` (sends and capacity waits),
``daemons._redrive`` (the redrive tasks) and ``daemons._queues`` (indexes,
watches, rescans, waiters, fetchers); ``daemons._settings`` holds the checked
settings they share. The rules of every operation are ``mqcore.service``'s,
shared with the brokerless client. With ``--processes N`` (N > 1) this process
supervises N workers that each run :func:`serve` on the same port and root
(``daemons._processes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import click
from aiohttp import web

from daemons import _auth, _bulk, _fastpath, _listen, _processes, _runtime, _watchdog
from daemons._batches import delete_batch, send_batch, visibility_batch
from daemons._broker import Broker
from daemons._console import add_console_routes
from daemons._http import (
    BROKER,
    cancel_redrive,
    change_visibility,
    delete_message,
    delete_queue,
    errors_middleware,
    get_attributes,
    get_queue,
    get_redrive,
    list_queues,
    peek_by_ids,
    peek_messages,
    purge_queue,
    put_attributes,
    put_queue,
    receive_message,
    send_message,
    start_redrive,
)
from daemons._inline import INLINE_IO_MODES
from daemons._metrics import DEFAULT_MAX_QUEUES, metrics_middleware
from daemons._savers import FILE_SYNC_MODES
from daemons._settings import DEFAULT_MAX_BATCH_MESSAGES, DEFAULT_MAX_MESSAGE_BYTES, Settings
from daemons._stopguard import DEFAULT_STOP_TIMEOUT_SECONDS
from mqcore.errors import ConfigError
from mqcore.fsinfo import journal_warning, shared_warning

__all__ = ["Broker", "Settings", "cli", "main", "make_app", "make_runner", "serve"]

logger = logging.getLogger("mq.front")

#: Seconds a stopping mq waits for requests in progress before cancelling them. A send
#: whose body has arrived finishes in milliseconds (its fsync); what is still waiting
#: after this is a client that has not finished uploading, and never got a 201.
#: Long polls and sends waiting for room return at once when mq stops.
SHUTDOWN_TIMEOUT_SECONDS = 5.0
#: Longest HTTP header value mq reads, in bytes (aiohttp's default: 8,190). A message's attributes are
#: at most 8,000 bytes as compact JSON (mqcore.attributes.MAX_ATTRIBUTES_JSON_BYTES), but a client may
#: send X-Message-Attributes with spaces or \u escapes; below this size the header reaches mq, which
#: accepts it or answers 400 invalid_attribute with a JSON body, never aiohttp's plain-text 400.
MAX_HEADER_FIELD_BYTES = 32_768
#: aiohttp's ``read_bufsize`` for mq, in bytes (aiohttp's default: 65,536): a request body's unread bytes
#: above twice this pause the socket until the handler has taken them below it. At 64 KiB a 1 MiB send
#: paused and resumed its socket (two ``epoll_ctl`` calls and their Python) for about every piece
#: received; at 1 MiB it is read straight through: 11 % less of mq's CPU per 1 MiB send on tmpfs
#: (docs/performance.md, "Leaner HTTP path"). A connection so holds at most 2 MiB of a body not yet
#: read, what one send of the largest message (``--max-message-size``, 1 MiB) holds anyway once read.
READ_BUFFER_BYTES = 1_048_576


async def sqs_endpoint(request: web.Request) -> web.Response:
    """POST / and POST /<account>/<queue>: :func:`daemons._sqs.sqs_endpoint`, imported by the first SQS request.

    A start that serves no SQS request never imports the SQS modules (``daemons._sqs``, ``mqcore.sqs``,
    ``sqs_query``, ``sqs_fifo``: ~10 ms of the ~0.5 s every mq start spends importing; docs/performance.md,
    "Fewer daemon start-up costs", stop 29). Same answers as calling it directly.
    """
    from daemons._sqs import sqs_endpoint as endpoint

    return await endpoint(request)


def make_app(broker: Broker, auth: _auth.Authenticator | None = None) -> web.Application:
    """The aiohttp application for ``broker`` (routes, error middleware; with ``auth``, the token check first).

    ``client_max_size`` admits a full batch send (JSON, base64 bodies); every
    handler reads its body with its own, smaller limit (a single send: the
    queue's max_message_bytes).
    """
    middlewares: list[Any] = [metrics_middleware(broker.metrics.times), errors_middleware]
    if auth is not None:
        middlewares.insert(1, _auth.make_auth_middleware(auth, broker.refusals))
    app = web.Application(middlewares=middlewares, client_max_size=broker.settings.batch_request_limit_bytes)
    app[BROKER] = broker
    router = app.router
    # aiohttp tries the resources under "/{queue}..." in registration order: the hot ones first.
    router.add_post("/{queue}/messages", send_message)
    router.add_get("/{queue}/messages", receive_message, allow_head=False)  # a HEAD must not consume a message
    router.add_delete("/{queue}/messages/{message_id}", delete_message)
    router.add_post("/{queue}/messages/batch", send_batch)
    router.add_post("/{queue}/messages/delete", delete_batch)
    router.add_post("/{queue}/messages/visibility", visibility_batch)
    router.add_post("/{queue}/messages/{message_id}/visibility", change_visibility)
    router.add_get("/", list_queues)
    # Before "/{queue}": GET of these names is not a queue's statistics (docs/api.md "Operations").
    router.add_get("/metrics", broker.metrics.handle, allow_head=False)
    router.add_get("/healthz", broker.health.healthz, allow_head=False)
    router.add_get("/readyz", broker.health.readyz, allow_head=False)
    add_console_routes(router)
    router.add_get("/{queue}", get_queue)
    router.add_put("/{queue}", put_queue)
    router.add_delete("/{queue}", delete_queue)
    router.add_get("/{queue}/attributes", get_attributes)
    router.add_put("/{queue}/attributes", put_attributes)
    router.add_post("/{queue}/purge", purge_queue)
    router.add_get("/{queue}/peek", peek_messages)
    router.add_post("/{queue}/peek", peek_by_ids)
    router.add_post("/{queue}/redrive", start_redrive)
    router.add_get("/{queue}/redrive", get_redrive)
    router.add_delete("/{queue}/redrive", cancel_redrive)
    _bulk.add_routes(app)  # issue 17: POST/DELETE /{queue}/leases/{key}
    router.add_post("/", sqs_endpoint)  # SQS's AWS JSON 1.0 protocol (docs/sqs.md); the native API has no POST /
    router.add_post(r"/{account:[0-9]{12}}/{queue}", sqs_endpoint)  # SDKs that post to the queue URL
    return app


def make_runner(broker: Broker, auth: _auth.Authenticator | None = None) -> _fastpath.FastPathRunner:
    """The aiohttp runner that serves ``broker`` (what :func:`serve` listens with).

    Requests whose client disconnects are cancelled (``handler_cancellation``:
    a long poll must not lease messages for a consumer that is gone); header
    values up to :data:`MAX_HEADER_FIELD_BYTES` are read; the single send, receive and delete skip the
    router and middlewares (``daemons._fastpath``), and on mq's own connections without aiohttp's parser
    and responses (``daemons._wire``, the runner's ``wire``: ``serve`` passes it to the site; the batch
    send and batch delete too); a request
    line or header over aiohttp's
    limits gets the JSON error body (``daemons._badrequest``); a body is buffered up to
    :data:`READ_BUFFER_BYTES` twice over before its socket pauses; a connection without a complete
    request header for ``idle_timeout_seconds`` is closed (idle keep-alive or slow headers).
    """
    access_log = logging.getLogger("mq.access") if broker.settings.access_log else None
    return _fastpath.FastPathRunner(
        make_app(broker, auth),
        broker,
        auth,
        access_log=access_log,
        handle_signals=False,
        handler_cancellation=True,
        max_field_size=MAX_HEADER_FIELD_BYTES,
        keepalive_timeout=broker.settings.idle_timeout_seconds,
        read_bufsize=READ_BUFFER_BYTES,
    )


async def serve(
    settings: Settings, *, shutdown_trigger: asyncio.Event | None = None, link: _processes.WorkerLink | None = None
) -> int:
    """Run the HTTP front end until ``shutdown_trigger`` is set (or SIGTERM/SIGINT when None).

    With ``link`` this is one worker of ``mq --processes N`` (``daemons._processes``): it binds the
    supervisor's port with ``SO_REUSEPORT`` (or serves the socket it shares) and reports to the
    supervisor instead of logging the readiness line and talking to systemd.

    On stop, long polls and sends waiting for room answer at once, then the
    other in-flight requests finish (up to SHUTDOWN_TIMEOUT_SECONDS). A
    request whose client disconnects is cancelled (a long poll must not lease
    messages for a consumer that is gone).

    Returns:
        Exit code 0.
    """
    stop = shutdown_trigger or asyncio.Event()
    auth = _auth.Authenticator(settings.auth_file) if settings.auth_file else None
    tls = _listen.tls_context(settings.tls_cert, settings.tls_key)
    sock = _listen.inherited_socket() if link is None else link.socket()
    address = sock.getsockname()[0] if sock is not None else settings.address
    exposure = _listen.check_exposure(address, auth=auth is not None, insecure_listen=settings.insecure_listen)
    if shutdown_trigger is None:
        _runtime.install_stop_signals(stop)
    broker = Broker(settings)
    shared = shared_warning(settings.root, broker.mount)
    if shared:
        logger.warning("%s", shared)
    journal = journal_warning(settings.root, broker.mount)
    if journal:
        logger.warning("%s", journal)
        broker.health.warnings.append(journal)  # also in GET /readyz
    await broker.start()
    runner = make_runner(broker, auth)
    await runner.setup()
    site = _listen.LimitedSite(
        runner,
        settings.address,
        settings.port if link is None else link.port,
        sock=sock,
        reuse_port=link is not None,
        max_connections=settings.max_connections,
        refusals=broker.refusals,
        connections=runner.wire if tls is None else None,  # with TLS every connection is aiohttp's
        ssl_context=tls,
        shutdown_timeout=min(SHUTDOWN_TIMEOUT_SECONDS, settings.stop_timeout_seconds / 2),
        backlog=1024,
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await broker.close()
        raise ConfigError(f"cannot listen on {settings.address}:{settings.port}: {exc.strerror}") from exc
    host, port = runner.addresses[0][:2]
    logger.info(exposure)
    if auth is not None:
        _runtime.install_reload_signal(auth.reload)
        logger.info("auth file %s: %d tokens (SIGHUP reloads it)", settings.auth_file, auth.count)
        if settings.sqs_credentials:  # docs/sqs.md "Authentication": the auth file's access keys win
            from daemons._sqs_auth import IGNORED_CREDENTIALS

            logger.warning("%s", IGNORED_CREDENTIALS.format(settings.sqs_credentials))
    elif shutdown_trigger is None:  # systemctl reload must not kill mq: SIGHUP only says there is nothing to reload
        _runtime.install_reload_signal(lambda: logger.info("nothing to reload (no --auth-file)"))
    if sock is not None:
        logger.info("socket activation: serving the socket systemd passed (fd %d)", sock.fileno())
    scheme = "https" if tls is not None else "http"
    host_text = f"[{host}]" if ":" in host else host
    _runtime.freeze_start_up("mq")
    if link is not None:
        watchdog = await link.serving(broker, runner, f"{scheme}://{host_text}:{port}")
    else:
        logger.info(
            "mq listening on %s://%s:%d root=%s workers=%d", scheme, host_text, port, settings.root, settings.workers
        )
        _runtime.sd_notify("READY=1")
        watchdog = asyncio.create_task(_watchdog.run(_status_line(broker, runner)))
    await stop.wait()
    watchdog.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watchdog
    logger.info("stopping: finishing in-flight requests")
    await broker.begin_stop()
    await runner.cleanup()
    await broker.close()
    logger.info("stopped")
    return _runtime.EXIT_OK


def _status_line(broker: Broker, runner: web.AppRunner) -> Callable[[], str]:
    """The watchdog's STATUS= text: queues this daemon holds in memory, requests per second since the last line."""
    rate = _watchdog.Rate()

    def line() -> str:
        server = runner.server
        per_second = rate.update(server.requests_count if server is not None else 0)
        queues = sum(len(fetcher.queues) for fetcher in broker.queues.fetchers)
        return f"serving: {queues} queues active, {per_second:.1f} requests/s"

    return line


def _auto_choice(flag: str, choices: tuple[str, ...], envvar: str, text: str) -> Callable[[Any], Any]:
    """A ``click.option`` of a choice among ``choices`` whose default is ``auto``, also set by ``envvar``."""
    return click.option(
        flag, type=click.Choice(choices), default="auto", envvar=envvar, show_envvar=True, show_default=True, help=text
    )


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
    help="Threads of each kind, started as work needs them: up to N savers and N fetchers (SoftLayer MQ's pairs).",
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
    help="Default seconds a received message stays invisible (0-43200; a queue's attribute overrides it).",
)
@click.option(
    "--max-message-size",
    type=int,
    default=DEFAULT_MAX_MESSAGE_BYTES,
    envvar="MQ_MAX_MESSAGE_SIZE",
    show_envvar=True,
    show_default=True,
    help="Largest body in bytes (caps every queue's max_message_bytes).",
)
@click.option(
    "--max-batch-messages",
    type=int,
    default=DEFAULT_MAX_BATCH_MESSAGES,
    envvar="MQ_MAX_BATCH_MESSAGES",
    show_envvar=True,
    show_default=True,
    help="Most entries of a batch send (1-1000; SQS: 10).",
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
@click.option(
    "--metrics-max-queues",
    type=int,
    default=DEFAULT_MAX_QUEUES,
    envvar="MQ_METRICS_MAX_QUEUES",
    show_envvar=True,
    show_default=True,
    help='Queues named in /metrics labels; the others are summed under queue="_other".',
)
@click.option(
    "--min-free-bytes",
    type=int,
    default=0,
    envvar="MQ_MIN_FREE_BYTES",
    show_envvar=True,
    show_default=True,
    help="Free bytes of the root's filesystem below which sends get 507 and /readyz 503 (0 = off).",
)
@click.option(
    "--processes",
    type=_processes.ProcessCount(),
    default=1,
    envvar="MQ_PROCESSES",
    show_envvar=True,
    show_default=True,
    help="mq processes serving the port (SO_REUSEPORT), or auto = one per usable CPU (docs/api.md).",
)
@_runtime.log_level_option
@_runtime.stop_timeout_option(DEFAULT_STOP_TIMEOUT_SECONDS)
@click.option(
    "--access-log/--no-access-log",
    default=False,
    envvar="MQ_ACCESS_LOG",
    show_envvar=True,
    show_default=True,
    help="Log one line per HTTP request (logger mq.access).",
)
@click.option(
    "--sqs-account-id",
    default="000000000000",
    envvar="MQ_SQS_ACCOUNT_ID",
    show_envvar=True,
    show_default=True,
    help="Account id in SQS queue URLs and ARNs (12 digits).",
)
@click.option(
    "--sqs-region",
    default="us-east-1",
    envvar="MQ_SQS_REGION",
    show_envvar=True,
    show_default=True,
    help="Region in SQS ARNs.",
)
@click.option(
    "--sqs-credentials",
    default="",
    envvar="MQ_SQS_CREDENTIALS",
    show_envvar=True,
    show_default=True,
    help="JSON file of access key id -> secret key; SQS requests must then be SigV4-signed with one.",
)
@_auto_choice(
    "--inline-io",
    INLINE_IO_MODES,
    "MQ_INLINE_IO",
    "auto: a lone send, receive or delete does its file work on the event loop, on a local filesystem "
    "only (never on FUSE, NFS, CIFS); never: always on the worker threads.",
)
@_auto_choice(
    "--file-sync",
    FILE_SYNC_MODES,
    "MQ_FILE_SYNC",
    "How a send's message files are made durable before their rename: fsync = each file; syncfs = one "
    "syncfs(2) per group of files, local filesystems only (FUSE, NFS, CIFS: fsync); auto = syncfs while more "
    "sends are in flight than --workers and under 32 MiB of the machine's dirty data is not mq's (docs/api.md).",
)
@_listen.security_options
@click.pass_context
def cli(ctx: click.Context, /, **values: Any) -> int:
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
        max_batch_messages=values["max_batch_messages"],
        rescan_interval_seconds=values["rescan_interval"],
        log_level=values["log_level"],
        access_log=values["access_log"],
        sqs_account_id=values["sqs_account_id"],
        sqs_region=values["sqs_region"],
        sqs_credentials=values["sqs_credentials"],
        auth_file=values["auth_file"],
        insecure_listen=values["insecure_listen"],
        tls_cert=values["tls_cert"],
        tls_key=values["tls_key"],
        max_connections=values["max_connections"],
        idle_timeout_seconds=values["idle_timeout"],
        body_timeout_seconds=values["body_timeout"],
        max_waiters=values["max_waiters"],
        metrics_max_queues=values["metrics_max_queues"],
        min_free_bytes=values["min_free_bytes"],
        processes=values["processes"],
        inline_io=values["inline_io"],
        file_sync=values["file_sync"],
        stop_timeout_seconds=values["stop_timeout"],
    )
    if settings.processes > 1:  # the supervisor waits for its workers' own bound, then its margin
        bound = settings.stop_timeout_seconds + _processes.STOP_MARGIN_SECONDS
        return _runtime.run(lambda: _processes.supervise(settings), stop_timeout_seconds=bound, root=settings.root)
    return _runtime.run(lambda: serve(settings), stop_timeout_seconds=settings.stop_timeout_seconds, root=settings.root)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mq`` console script (and of its ``--processes`` workers); returns the exit code."""
    worker = _processes.worker_from_environment()
    if worker is not None:
        return _processes.run_worker(serve, *worker)
    return _runtime.run_command(cli, argv, "mq")


if __name__ == "__main__":
    sys.exit(main())
