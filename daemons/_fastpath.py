"""The three hot routes served without aiohttp's router and middleware chain (issue 12, "a leaner HTTP path").

A single send (``POST /<queue>/messages``), receive (``GET /<queue>/messages``)
and delete (``DELETE /<queue>/messages/<id>``) are most of what mq serves. Through
the ``web.Application`` each one resolved its route (a walk of the router's
index, a match object, the application frozen into it), then ran three
middlewares as nested coroutines (timing, tokens, errors) before its handler.
:class:`FastPath` is the handler of aiohttp's low-level server (``web.Server``,
the one the ``AppRunner`` builds): it looks at the raw request target once, and
for those three method and path shapes calls the handler's body
(:func:`daemons._http.send_to`, :func:`~daemons._http.receive_from`,
:func:`~daemons._http.delete_from`) itself, doing inline, in the same order, what
the middlewares did: the request's time into ``mq_http_request_duration_seconds``
(outermost; 499 when the client went away), the ``--auth-file`` token check
(:func:`daemons._auth.admit`), the JSON error answers
(:func:`daemons._http.error_answer`).

On mq's own connections (``daemons._wire``) these requests do not reach aiohttp at all;
:class:`FastPath` serves them on aiohttp's connections: with TLS or ``--access-log``, and on a
connection handed over to aiohttp after a request ``daemons._wire`` does not parse. Its
:meth:`FastPath.hot_parts` is the one rule of what a hot request's target is, for both.

Every other request goes to the application exactly as before (router,
middlewares, handlers): any other method or path, and, to keep the router's
answer the only one for anything unusual, a target with a ``%`` escape, a
``#``, an empty, ``.`` or ``..`` segment, an absolute-form target, an
``Expect`` header (the application answers ``100-continue``), and a path under
a route that does not start with ``/{`` (``/ui``, ``/metrics``: the router
tries those first). The access log, keep-alive, handler cancellation and the
parser's JSON errors (``daemons._badrequest``) belong to the connection
handler, not to the application, so they are the same on both paths.

aiohttp: :class:`FastPathRunner` sets the ``request_handler`` attribute of the
runner's ``web.Server`` (read by each new connection; tests/integration/test_fastpath.py
pins it) and keeps the application's own handler (``Application._handle``,
private) as the fallback.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from daemons import _auth
from daemons._badrequest import JsonErrorsAppRunner
from daemons._broker import Broker
from daemons._http import delete_from, error_answer, receive_from, send_to
from daemons._metrics import timed

if TYPE_CHECKING:
    from daemons._wire import Wire

__all__ = ["BATCH_ROUTES", "DELETE_ROUTE", "MESSAGES_ROUTE", "FastPath", "FastPathRunner"]

#: The canonical routes of the hot requests (their ``route`` label in ``mq_http_request_duration_seconds``).
MESSAGES_ROUTE = "/{queue}/messages"
DELETE_ROUTE = "/{queue}/messages/{message_id}"
#: The batch send's and batch delete's routes (served by ``daemons._wire`` on its own connections; by the
#: application on aiohttp's), by their last path segment.
BATCH_ROUTES = {"batch": "/{queue}/messages/batch", "delete": "/{queue}/messages/delete"}

_Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
_NOT_SEGMENTS = ("", ".", "..")


class FastPath:
    """The low-level server's request handler: the three hot routes inline, everything else to ``fallback``.

    Args:
        app: The application (its router's non-``/{...}`` paths are left to it).
        broker: The daemon's broker.
        auth: The tokens of ``--auth-file``, or None (no check, as without the auth middleware).
        fallback: The application's own request handler.
    """

    def __init__(
        self, app: web.Application, broker: Broker, auth: _auth.Authenticator | None, fallback: _Handler
    ) -> None:
        self._broker = broker
        self._times = broker.metrics.times
        self._auth = auth
        self._refusals: Counter[str] = broker.refusals
        self.fallback = fallback
        #: First path segments the router tries before ``/{queue}...`` (plain and static routes).
        self._shadowed = frozenset(
            r.canonical.split("/")[1] for r in app.router.resources() if not r.canonical.startswith("/{")
        )
        #: What each hot route's token must allow (``daemons._auth.requirement``), by (method, route).
        self.needs = {
            ("POST", MESSAGES_ROUTE): _auth.requirement("POST", MESSAGES_ROUTE),
            ("GET", MESSAGES_ROUTE): _auth.requirement("GET", MESSAGES_ROUTE),
            ("DELETE", DELETE_ROUTE): _auth.requirement("DELETE", DELETE_ROUTE),
            **{("POST", route): _auth.requirement("POST", route) for route in BATCH_ROUTES.values()},
        }

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        """Serve ``request``: inline when it is a hot route, else through the application."""
        method = request.method
        parts = self.hot_parts(method, request.raw_path)
        if parts is not None and "Expect" not in request.headers:
            assert isinstance(request, web.Request)  # made by the application's request factory
            return await self._serve(request, method, parts)
        return await self.fallback(request)

    def hot_parts(self, method: str, target: str) -> list[str] | None:
        """The path segments of a hot route's request (``["", queue, "messages"(, id)]``), else None.

        Args:
            method: The request's method.
            target: The request target as sent (origin form, query included).
        Returns:
            None for any other method or path, and for a target the router must see: a ``%``
            escape, a ``#``, an empty, ``.`` or ``..`` segment, a path under a route that is not
            ``/{...}`` (``/ui``, ``/metrics``).
        """
        if method != "POST" and method != "GET" and method != "DELETE":
            return None
        return self._parts(target, 4 if method == "DELETE" else 3)

    def batch_parts(self, method: str, target: str) -> list[str] | None:
        """The path segments of a batch send's or delete's request (``["", queue, "messages", "batch"|"delete"]``).

        The rule of :meth:`hot_parts` for ``POST /{queue}/messages/batch`` and ``.../delete`` (``daemons._wire``
        serves them on its own connections; through aiohttp they are the application's); None for anything else.
        """
        if method != "POST":
            return None
        parts = self._parts(target, 4)
        return parts if parts is not None and parts[3] in BATCH_ROUTES else None

    def _parts(self, target: str, n: int) -> list[str] | None:
        """``target``'s path segments when it is ``/{queue}/messages`` (n=3) or ``/{queue}/messages/{x}`` (n=4)."""
        path, _, _ = target.partition("?")
        parts = path.split("/")
        if (
            len(parts) == n
            and parts[2] == "messages"
            and not parts[0]
            and parts[1] not in _NOT_SEGMENTS
            and parts[1] not in self._shadowed
            and "%" not in target
            and "#" not in target
            and (n == 3 or parts[3] not in _NOT_SEGMENTS)
        ):
            return parts
        return None

    async def _serve(self, request: web.Request, method: str, parts: list[str]) -> web.StreamResponse:
        """What the metrics, auth and errors middlewares and the route's handler did, in that order."""
        route = MESSAGES_ROUTE if len(parts) == 3 else DELETE_ROUTE
        return await timed(self._times, route, method, self._answer(request, method, route, parts))

    async def _answer(self, request: web.Request, method: str, route: str, parts: list[str]) -> web.StreamResponse:
        """The auth check, then the handler with its errors as JSON answers."""
        if self._auth is not None:
            refused = await _auth.admit(self._auth, self._refusals, request, self.needs[method, route], parts[1])
            if refused is not None:
                return refused
        try:
            if method == "POST":
                return await send_to(request, self._broker, parts[1])
            if method == "GET":
                return await receive_from(request, self._broker, parts[1])
            return await delete_from(request, self._broker, parts[1], parts[3])
        except Exception as exc:  # noqa: BLE001 -- error_answer logs it or raises it again
            return await error_answer(request, exc)


class FastPathRunner(JsonErrorsAppRunner):
    """The ``AppRunner`` of mq: its server's request handler is a :class:`FastPath` over the application's.

    Args:
        app: The application (``daemons.front.make_app``).
        broker: The daemon's broker.
        auth: The tokens of ``--auth-file``, or None.
        **kwargs: The arguments of ``aiohttp.web.AppRunner``.
    """

    def __init__(self, app: web.Application, broker: Broker, auth: _auth.Authenticator | None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._broker = broker
        self._auth = auth
        self._own_connections = kwargs.get("access_log", True) is None  # an access log is aiohttp's
        #: The protocol factory of mq's own connections (``daemons._wire``) once set up; None with an access log.
        self.wire: Wire | None = None

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        fast = FastPath(self.app, self._broker, self._auth, server.request_handler)
        server.request_handler = fast
        if self._own_connections:
            from daemons._wire import Wire  # here: _wire imports this module

            self.wire = Wire(server, fast, self._broker, self._auth)
        return server
