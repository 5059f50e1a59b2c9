"""mq's own HTTP/1.1 connections for the three hot routes; aiohttp takes a connection over for anything else.

A single send (``POST /<queue>/messages``), receive (``GET /<queue>/messages``)
and delete (``DELETE /<queue>/messages/<id>``) are most of what mq serves, and
aiohttp's stack (its parser, ``BaseRequest``, ``StreamReader``, response
preparation and writer, a task per connection) cost several times the CPU of the
file work behind them (docs/performance.md, "Own HTTP/1.1 path for the hot
routes"). :class:`WireConnection` is an ``asyncio.BufferedProtocol`` (a body the
first read did not bring is read by the socket straight into one buffer of its
size) that parses those requests itself with a deliberately narrow, strict grammar and writes
preformatted answers, calling the same shared work as aiohttp's handlers
(:func:`daemons._http.send_of`, :func:`~daemons._http.receive_of`,
:func:`~daemons._http.delete_of`; errors by :func:`~daemons._http.error_response`,
tokens by :func:`daemons._auth.admit_token`, timing as :func:`daemons._metrics.timed` times).
The batch send and batch delete (``POST /<queue>/messages/batch`` and ``.../delete``,
:meth:`~daemons._fastpath.FastPath.batch_parts`) are served here too, by
:func:`daemons._batches.send_batch_of` and :func:`~daemons._batches.delete_batch_of`, with the
application's answers byte for byte (through aiohttp they are the application's routes).

The grammar: a request line ``GET|POST|DELETE SP /target SP HTTP/1.1|HTTP/1.0`` whose
target has only unreserved, sub-delim, ``/:@?`` characters (no ``%``, no ``#``, no
absolute form) and is one of the hot shapes (:meth:`daemons._fastpath.FastPath.hot_parts`) or a batch's;
ASCII header lines ``name: value`` (a token name, no obs-fold, no control characters),
each name at most once, a ``Host``, at most one ``Content-Length`` (digits; none or 0
for GET and DELETE), ``Connection`` absent, ``close`` or ``keep-alive``, and no
``Transfer-Encoding``, ``Expect`` or ``Upgrade``; the whole header block within
:data:`MAX_HEAD_BYTES`. A request outside it is not answered here: at a request
boundary (no earlier request still being answered) the connection is handed over
whole to aiohttp (a connection handler of the runner's ``web.Server``, given the
transport with ``set_protocol`` and every byte not yet consumed) and stays aiohttp's
until it closes. So every answer to odd input (400s, 405s, the router's 404s,
``100-continue``, chunked bodies) stays aiohttp's and the application's.

What the hot routes do through aiohttp holds here too: ``--auth-file`` tokens, the
request's time in ``mq_http_request_duration_seconds`` (499 for a client gone), the
queue's max_message_bytes (413 from Content-Length; a body over ``--max-body`` is never
kept, the rest of a refused body is read and dropped, the connection kept), ``--body-timeout`` (408 and
the connection cut), the idle timeout (``idle_timeout_seconds`` without a complete
request header closes the connection), ``--max-connections`` (these connections
count in the server's), a long poll cancelled when its client goes away, graceful
stop (the server's ``pre_shutdown``/``shutdown`` reach these connections), pipelined
requests answered in order, HTTP/1.0 and ``Connection: close``. With
``--access-log`` or TLS every connection is aiohttp's (``daemons._fastpath`` still
serves the hot routes inside it).

aiohttp: the hand-over uses ``web.Server.__call__`` (a ``RequestHandler``) and the
handler's ``connection_made``/``data_received``; a connection of this module is
registered in the server's private ``_connections`` (its ``connections``,
``pre_shutdown`` and ``shutdown`` read it). tests/integration/test_fastpath.py pins them,
tests/integration/test_wire.py checks the behaviour over raw sockets.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast

import yarl
from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.tcp_helpers import tcp_keepalive
from multidict import MultiMapping

from daemons import _auth
from daemons._batches import delete_batch_of, send_batch_of
from daemons._broker import Broker
from daemons._fastpath import BATCH_ROUTES, DELETE_ROUTE, MESSAGES_ROUTE, FastPath
from daemons._http import (
    body_timed_out,
    cut,
    delete_of,
    error_response,
    receive_of,
    received_headers,
    send_of,
    sent_body,
)
from daemons._metrics import failed_status
from mqcore.errors import MessageTooLarge, RequestTimeout
from mqcore.model import ReceivedMessage

__all__ = ["MAX_HEAD_BYTES", "Wire", "WireConnection"]

logger = logging.getLogger("mq.front")

#: Largest header block (request line and headers) parsed here; a larger one goes to aiohttp (its limits).
MAX_HEAD_BYTES = 8190
#: Bytes of pipelined requests kept while one is answered before the socket's reading pauses.
PAUSE_BYTES = 262_144
#: Bytes one socket read may take outside a body (uvloop's own read buffer is 256 KiB).
SCRATCH_BYTES = 262_144
#: A received body this large is written after its head instead of copied into one buffer with it.
SEPARATE_BODY_BYTES = 65_536

#: The whole header block of a request this module parses (the grammar above): request line, then each
#: header line after its CRLF; a block it does not match goes to aiohttp.
#: The grammar of a request's head, in two: its request line (which holds no CR) and its header lines, each CRLF-led.
_LINE = re.compile(rb"(GET|POST|DELETE) (/[-!$&'()*+,./0-9:;=?@A-Z_a-z~]*) HTTP/1\.([01])")
_FIELDS = re.compile(rb"(?:\r\n[-!#$&'*+.^_`|~0-9A-Za-z]+:[ \t]*(?:[\x21-\x7e][ \t\x21-\x7e]*)?)*")
#: One header line of a block :data:`_FIELDS` matched (name, value with its trailing blanks).
_FIELD = re.compile(r"\r\n([^:]+):[ \t]*([^\r]*)")
_SERVER = b"Server: " + SERVER_SOFTWARE.encode() + b"\r\n"
_STATUS = {
    (status.value, version): b"HTTP/1.%d %d %s\r\n" % (version, status.value, status.phrase.encode())
    for status in HTTPStatus
    for version in (0, 1)
}
_NO_BODY = frozenset((204, 304))
_JSON_UTF8 = b"Content-Type: application/json; charset=utf-8\r\n"


class _Reply:
    """One answer: its status (for the metrics), its bytes (a large body apart: ``tail``), whether the
    connection is cut after it (408), what to run right after it is written (a send's bookkeeping:
    :meth:`daemons._send.Sender.send`'s ``answered``)."""

    __slots__ = ("after", "cut", "data", "status", "tail")

    def __init__(
        self,
        status: int,
        data: bytes,
        cut: bool = False,
        tail: bytes | None = None,
        after: Callable[[], None] | None = None,
    ) -> None:
        self.status = status
        self.data = data
        self.cut = cut
        self.tail = tail
        self.after = after


class Wire:
    """The protocol factory of mq's listening socket: a :class:`WireConnection` per connection.

    Args:
        server: The runner's ``web.Server`` (the hand-over creates its connection handlers).
        fast: The server's :class:`~daemons._fastpath.FastPath` (hot shapes, token requirements).
        broker: The daemon's broker.
        auth: The tokens of ``--auth-file``, or None.
    """

    def __init__(self, server: web.Server, fast: FastPath, broker: Broker, auth: _auth.Authenticator | None) -> None:
        self.server = server
        self.fast = fast
        self.broker = broker
        self.auth = auth
        self.loop = asyncio.get_running_loop()
        self.idle_seconds = broker.settings.idle_timeout_seconds
        #: Where a connection's socket reads land outside a body (copied out at once: one for the loop).
        self.scratch = memoryview(bytearray(SCRATCH_BYTES))
        #: False: every new connection is aiohttp's (tests compare both paths with it).
        self.enabled = True

    def __call__(self) -> asyncio.BaseProtocol:
        """A new connection's protocol."""
        return WireConnection(self) if self.enabled else self.server()


#: Header blocks (the lines after the request line) already parsed: their headers, or None if refused.
#: A client sends the same block with every request of a kind (its DELETEs differ only in the target).
_BLOCKS: dict[bytes, tuple[dict[str, str], int] | None] = {}
#: Blocks kept (the cache is emptied when full), and the longest one kept.
_MAX_BLOCKS = 256
_MAX_BLOCK_BYTES = 1024


def _fields(block: bytes) -> tuple[dict[str, str], int] | None:
    """(headers by lower-case name, Content-Length) of a header block, or None outside the grammar.

    One regular expression checks the block (ASCII only, CRLF only, token names, no obs-fold, no
    control characters), a second one splits its lines; the answer is kept for the next request
    that sends the same block (the caller copies the headers).
    """
    if block in _BLOCKS:
        return _BLOCKS[block]
    got: tuple[dict[str, str], int] | None = None
    if _FIELDS.fullmatch(block) is not None:
        fields = _FIELD.findall(block.decode("ascii"))
        headers = {name.lower(): value.rstrip() for name, value in fields}  # values hold no blanks but space, tab
        text = headers.get("content-length")
        if (
            len(headers) == len(fields)  # no name given twice
            and "host" in headers
            and not ("transfer-encoding" in headers or "expect" in headers or "upgrade" in headers)
            and (text is None or (text.isdigit() and len(text) <= 18))
        ):
            got = headers, int(text) if text is not None else 0
    if len(block) <= _MAX_BLOCK_BYTES:
        if len(_BLOCKS) >= _MAX_BLOCKS:
            _BLOCKS.clear()
        _BLOCKS[block] = got
    return got


def _parse(head: bytes) -> tuple[str, str, int, bool, dict[str, str], int] | None:
    """(method, target, minor version, keep-alive, headers by lower-case name, Content-Length), or None.

    None for anything outside this module's grammar (:data:`_LINE`, :data:`_FIELDS`; the connection goes to aiohttp):
    the request line is checked here, the header lines by :func:`_fields`.
    """
    cr = head.find(b"\r")
    request = _LINE.fullmatch(head if cr < 0 else head[:cr])
    if request is None:
        return None
    parsed = _fields(head[cr:] if cr >= 0 else b"")
    if parsed is None:
        return None
    headers, length = dict(parsed[0]), parsed[1]
    method = request[1].decode()
    if length and method != "POST":
        return None
    minor = 1 if request[3] == b"1" else 0
    connection = headers.get("connection")
    if connection is None:
        keep_alive = minor == 1
    else:
        connection = connection.lower()
        if connection == "keep-alive":
            keep_alive = True
        elif connection == "close":
            keep_alive = False
        else:
            return None
    return method, request[2].decode(), minor, keep_alive, headers, length


class WireConnection(asyncio.BufferedProtocol):
    """One client connection: hot requests parsed and answered here, in order; else handed to aiohttp.

    Args:
        wire: The factory (server, broker, tokens).
    """

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._loop = wire.loop
        self._transport: asyncio.Transport | None = None
        self._buf = b""
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._reading_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._idle_at = 0.0
        self._idle: asyncio.TimerHandle | None = None
        # The body of the request being answered: its length, the bytes when complete, else a pre-sized buffer.
        self._length = 0
        self._body: bytes | bytearray | None = None
        self._view: memoryview | None = None
        self._filled = 0
        self._arrived: asyncio.Future[None] | None = None
        self._discard = 0  # bytes of a refused body still to read and drop
        # The HTTP version's minor digit of the request being answered, and its answer's Connection header.
        self._minor = 1
        self._conn = b""

    # -- asyncio.Protocol ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's TCPTransport is not a subclass
        tcp_keepalive(self._transport)
        self._wire.server._connections[self] = self._transport  # type: ignore[index]  # counted, shut down
        self._idle_from_now()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._wire.server._connections.pop(self, None)  # type: ignore[call-overload]
        self._transport = None
        if self._idle is not None:
            self._idle.cancel()
        if self._task is not None:
            self._task.cancel()  # a long poll must not lease messages for a consumer that is gone

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the socket's next bytes go: the rest of a body's pre-sized buffer, else the loop's scratch."""
        if self._view is not None and not self._discard:
            return self._view[self._filled :]
        return self._wire.scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._view is not None and not self._discard:  # read straight into the body: no copy
            self._filled += nbytes
            if self._filled == self._length:
                self._body_complete()
            return
        self.data_received(bytes(self._wire.scratch[:nbytes]))

    def data_received(self, data: bytes) -> None:
        """Bytes received (from the scratch buffer, or from a loop that copies them itself)."""
        if self._discard:
            n = min(self._discard, len(data))
            self._discard -= n
            data = data[n:]
        elif self._view is not None:  # the rest of a body, into its buffer
            n = min(self._length - self._filled, len(data))
            self._view[self._filled : self._filled + n] = memoryview(data)[:n]
            self._filled += n
            if self._filled == self._length:
                self._body_complete()
            data = data[n:]
        if not data:
            return
        self._buf = self._buf + data if self._buf else data
        if self._task is None:
            self._next()
        elif len(self._buf) > PAUSE_BYTES and not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def pause_writing(self) -> None:
        self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- web.Server's view of a connection (pre_shutdown, shutdown) -----------------------------------------------

    def close(self) -> None:
        """Stop after the request being answered (at once when idle): the server stops."""
        self._closing = True
        if self._task is None and self._transport is not None:
            self._transport.close()

    async def shutdown(self, timeout: float | None = 15.0) -> None:  # noqa: ASYNC109 -- RequestHandler's signature
        """Let the request being answered finish (up to ``timeout`` seconds, then cancel it); close."""
        self._closing = True
        task = self._task
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
        if self._transport is not None:
            self._transport.close()

    # -- requests -------------------------------------------------------------------------------------------------

    def _next(self) -> None:
        """Start answering the next complete request in the buffer, or hand the connection over."""
        buf = self._buf
        end = buf.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES or (buf[:1] and buf[:1] not in b"GPD"):
                self._hand_over()
            return
        parsed = _parse(buf[:end])
        if parsed is None or self._closing:
            if not self._closing:
                self._hand_over()
            return
        method, target, minor, keep_alive, headers, length = parsed
        settings = self._wire.broker.settings
        parts = self._wire.fast.hot_parts(method, target)
        limit = settings.max_message_bytes  # --max-body: the most any queue takes
        if parts is None:
            parts = self._wire.fast.batch_parts(method, target)
            if parts is None:
                self._hand_over()
                return
            limit = settings.batch_request_limit_bytes
        start = end + 4
        self._length = length
        if len(buf) - start >= length:
            self._body = buf[start : start + length]
            self._buf = buf[start + length :]
        else:
            self._buf = b""
            if length <= limit:
                self._body = bytearray(length)
                self._view = memoryview(self._body)
                self._filled = len(buf) - start
                self._view[: self._filled] = memoryview(buf)[start:]
            else:  # over the route's limit for every queue: 413 from Content-Length, the body dropped as it comes
                self._body = None
                self._discard = length - (len(buf) - start)
        self._minor = minor
        if keep_alive:
            self._conn = b"Connection: keep-alive\r\n" if not minor else b""
        else:
            self._conn = b"Connection: close\r\n" if minor else b""
        self._wire.server.requests_count += 1
        self._task = self._loop.create_task(self._serve(method, target, parts, keep_alive, headers))
        self._wire.broker.lone.arrived(self._loop)  # after create_task: see LoneOps.arrived

    def _hand_over(self) -> None:
        """Give the connection to aiohttp: a handler of the runner's server, with every byte not yet consumed."""
        transport = self._transport
        if transport is None:
            return
        server = self._wire.server
        server._connections.pop(self, None)  # type: ignore[call-overload]  # the handler registers itself
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        handler = server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        data, self._buf = self._buf, b""
        self._transport = None
        if data:
            handler.data_received(data)

    def _idle_from_now(self) -> None:
        """Close the connection if no complete request header arrives within ``idle_timeout_seconds``."""
        seconds = self._wire.idle_seconds
        if seconds <= 0:
            return
        self._idle_at = self._loop.time() + seconds
        if self._idle is None:
            self._idle = self._loop.call_at(self._idle_at, self._idle_check)

    def _idle_check(self) -> None:
        self._idle = None
        if self._task is not None or self._transport is None:  # answering: the timer restarts after the answer
            return
        if self._loop.time() < self._idle_at:  # a request came and went since: wait for the new deadline
            self._idle = self._loop.call_at(self._idle_at, self._idle_check)
            return
        self._transport.close()

    def _body_complete(self) -> None:
        assert self._view is not None
        self._view.release()
        self._view = None
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    async def _read(self, limit: int, method: str, path: str) -> bytes:
        """The body, at most ``limit`` bytes, within ``--body-timeout`` (what ``read_body`` is to aiohttp's)."""
        if self._length > limit:
            self._drop_body()
            raise MessageTooLarge(self._length, limit)
        body = self._body
        assert body is not None
        if self._view is not None:
            self._arrived = self._loop.create_future()
            seconds = self._wire.broker.settings.body_timeout_seconds
            try:
                async with asyncio.timeout(seconds):
                    await self._arrived
            except TimeoutError:
                peer = self._transport.get_extra_info("peername") if self._transport is not None else None
                raise body_timed_out(self._wire.broker, method, path, peer[0] if peer else None) from None
            finally:
                self._arrived = None
        self._body = None
        return body  # type: ignore[return-value]  # a bytearray of a large body: no copy to bytes

    def _drop_body(self) -> None:
        """Read the rest of the request's body and drop it (a body not wanted: 413, or an error answered first)."""
        if self._view is not None:
            self._discard = self._length - self._filled
            self._view.release()
            self._view = None
        self._body = None

    async def _serve(
        self, method: str, target: str, parts: list[str], keep_alive: bool, headers: dict[str, str]
    ) -> None:
        """Answer one request, then go on with the next one in the buffer.

        The request's time goes into ``mq_http_request_duration_seconds`` as
        :func:`daemons._metrics.timed` counts it (the answer's status, else
        :func:`~daemons._metrics.failed_status`), here without its wrapping coroutine: one layer
        less on every hot request.
        """
        started = time.perf_counter()
        times = self._wire.broker.metrics.times
        try:
            reply = await self._answer(method, target, parts, headers)
        except BaseException as exc:  # the client went away: cancelled (499), or a socket error re-raised
            times.observe((_route(method, parts), method, str(failed_status(exc))), time.perf_counter() - started)
            if not isinstance(exc, Exception):  # cancelled: the task ends with it
                raise
            self._task = None
            if self._transport is not None:
                self._transport.close()
            return
        seconds = time.perf_counter() - started
        self._drop_body()
        transport = self._transport
        try:
            if transport is not None:
                transport.write(reply.data)
                if reply.tail is not None:
                    transport.write(reply.tail)
        finally:  # the answer is on its way: now what it need not wait for (a send's index, counts, its time)
            if reply.after is not None:
                _run_after(reply.after)
            times.observe((_route(method, parts), method, str(reply.status)), seconds)
        if transport is None:
            return
        if reply.cut:  # 408: FIN now (the client reads the answer), the socket closed a moment later
            self._closing = True
            cut(transport)
            return
        if not keep_alive or self._closing:
            self._task = None
            transport.close()
            return
        if self._drain is not None:
            await self._drain
        self._task = None
        self._idle_from_now()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if self._buf:
            self._next()

    async def _answer(self, method: str, target: str, parts: list[str], headers: dict[str, str]) -> _Reply:
        """The token check, then the route's work with its errors as JSON answers."""
        wire = self._wire
        minor, conn = self._minor, self._conn
        path, _, query_string = target.partition("?")
        if wire.auth is not None:
            route = _route(method, parts)
            peer = self._transport.get_extra_info("peername") if self._transport is not None else None
            where = (method, path, peer[0] if peer else None)
            _, refused = await _auth.admit_token(
                wire.auth, wire.broker.refusals, headers.get("authorization"), wire.fast.needs[method, route],
                parts[1], where,
            )  # fmt: skip
            if refused is not None:
                return _response_reply(refused, minor, conn)
        query: MultiMapping[str] | None = yarl.URL.build(query_string=query_string).query if query_string else None
        try:
            if method == "POST":
                read = lambda limit: self._read(limit, method, path)  # noqa: E731
                if len(parts) == 4:  # a batch send or delete
                    batch = delete_batch_of if parts[3] == "delete" else send_batch_of
                    text = await batch(wire.broker, parts[1], query, read)
                    return _Reply(200, _head(200, minor, _JSON_UTF8, text.encode(), conn))
                answered: list[Callable[[], None]] = []
                message_id = await send_of(wire.broker, parts[1], headers, read, answered)
                return _Reply(
                    201,
                    _head(201, minor, b"X-Message-Id: %s\r\nContent-Type: application/json\r\n" % message_id.encode(),
                          sent_body(message_id), conn),
                    after=answered[0] if answered else None,
                )  # fmt: skip
            if method == "GET":
                messages, json_text = await receive_of(wire.broker, parts[1], query)
                if json_text is not None:
                    return _Reply(200, _head(200, minor, _JSON_UTF8, json_text.encode(), conn))
                if not messages:
                    return _Reply(204, _STATUS[204, minor] + _date_server(conn) + b"\r\n")
                fields = _received_fields(messages[0])
                body = messages[0].body
                if len(body) >= SEPARATE_BODY_BYTES:  # written after the head, not copied into it
                    return _Reply(200, _head(200, minor, fields, b"", conn, len(body)), tail=body)
                return _Reply(200, _head(200, minor, fields, body, conn))
            body = await delete_of(wire.broker, parts[1], parts[3], query)
            return _Reply(200, _head(200, minor, _JSON_UTF8, body, conn))
        except Exception as exc:  # noqa: BLE001 -- error_response logs it or raises it again
            response = error_response(exc, method, path)
            if isinstance(exc, RequestTimeout):  # the connection is cut after it
                return _response_reply(response, minor, b"Connection: close\r\n" if minor else b"", cut=True)
            return _response_reply(response, minor, conn)


def _run_after(after: Callable[[], None]) -> None:
    """Run a reply's ``after`` (a send's bookkeeping, once its ``201`` is written); a bug in it is logged,
    not raised into the connection's task (which must go on to its next request)."""
    try:
        after()
    except Exception:
        logger.exception("bookkeeping after an answer failed")


def _received_fields(message: ReceivedMessage) -> bytes:
    """The header lines of a raw receive's 200 (:func:`daemons._http.received_headers`, CRLF-ended), as bytes.

    A message of a standard queue without attributes (the usual one) is formatted in one step, without
    the header dict; any other goes through :func:`~daemons._http.received_headers`.
    """
    if message.attributes or message.group_id is not None:
        return "".join([f"{k}: {v}\r\n" for k, v in received_headers(message).items()]).encode()
    return (
        f"Content-Type: {message.content_type}\r\nX-Message-Id: {message.message_id}\r\n"
        f"X-Receive-Count: {message.receive_count}\r\nX-Sent-Timestamp: {message.sent_ms}\r\n"
        f"X-Receipt-Handle: {message.in_flight_name}\r\nX-First-Receive-Timestamp: {message.first_receive_ms}\r\n"
        f"X-Visibility-Deadline: {message.deadline_ms}\r\n"
    ).encode()


def _route(method: str, parts: list[str]) -> str:
    """The ``route`` label of a request this module serves (what aiohttp's router names its resource)."""
    if len(parts) == 3:
        return MESSAGES_ROUTE
    return BATCH_ROUTES[parts[3]] if method == "POST" else DELETE_ROUTE


#: [second, the Date and Server lines of that second]: made once a second.
_STAMP: list[Any] = [0, b""]


def _date_server(conn: bytes) -> bytes:
    """Date (aiohttp's text, made once a second), Server (aiohttp's) and ``conn`` (a Connection header or b"")."""
    now = int(time.time())
    if now != _STAMP[0]:
        _STAMP[1] = b"Date: %s\r\n%s" % (rfc822_formatted_time().encode(), _SERVER)
        _STAMP[0] = now
    return _STAMP[1] + conn if conn else _STAMP[1]  # type: ignore[no-any-return]


def _head(
    status: int, minor: int, fields: bytes, body: bytes | bytearray, conn: bytes, length: int | None = None
) -> bytes:
    """An answer: status line, ``fields`` (CRLF-ended), Content-Length (``length``, default the body's), Date,
    Server, ``conn``, ``body``."""
    size = len(body) if length is None else length
    return b"%s%sContent-Length: %d\r\n%s\r\n%s" % (_STATUS[status, minor], fields, size, _date_server(conn), body)


def _response_reply(response: web.Response, minor: int, conn: bytes, cut: bool = False) -> _Reply:
    """An aiohttp response (an error's, a token refusal's, a JSON receive's) as this module's answer."""
    body: Any = response.body
    fields = "".join([f"{k}: {v}\r\n" for k, v in response.headers.items()]).encode()
    if response.status in _NO_BODY:
        return _Reply(response.status, _STATUS[response.status, minor] + fields + _date_server(conn) + b"\r\n")
    return _Reply(response.status, _head(response.status, minor, fields, body if body is not None else b"", conn), cut)
