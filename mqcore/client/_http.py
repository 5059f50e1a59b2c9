"""HTTP clients for the mq daemon: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

One implementation of the API, two drivers. Every API method is written once,
as an operation in :mod:`mqcore.client._operations` (a function with the
method's parameters returning a generator that yields the HTTP requests it
needs and returns the method's result); its docstring is written once too, in
:class:`mqcore.client.api.QueueClient`. :class:`Client` drives operations over
one ``httpx.Client`` and :class:`AsyncClient` over one ``httpx.AsyncClient``
(so every call reuses the pool's keep-alive connections); the drivers only
perform requests and retry them, and run the operations with
:func:`mqcore.service.plans.run_sync` / :func:`~mqcore.service.plans.run_async`
(an error is thrown into the operation, which may handle it). The methods are listed once, in
:class:`mqcore.client._table.Operations` (shared with ``AsyncLocalClient``);
each class makes them from the operations by one typed wrapper
(:func:`_blocking`, :func:`_awaited`): a new method is an operation there and
one line in the table.

Retries (tenacity): a request that fails with :class:`~mqcore.errors.ConnectionFailed`
(no complete answer: refused, reset, timed out) or with an error whose class
is ``retriable`` (``503 storage_unavailable``, ``429 queue_full``) is sent
again, at most ``max_retries`` more times, after an exponential backoff with
full jitter ("Full Jitter", AWS Architecture Blog) that is at least the
server's ``Retry-After``. When the retries are used up, the last error is
raised. Errors answered by the server are rebuilt with
:func:`mqcore.errors.error_from_json`, so callers catch the same classes as
the daemons raise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from mqcore.client._methods import derive
from mqcore.client._operations import Op, Request, Response
from mqcore.client._table import Operations
from mqcore.client.api import DEFAULT_URL, AsyncQueueClient, QueueClient, documented_by
from mqcore.errors import ConnectionFailed, MQError, error_from_json
from mqcore.service.plans import run_async, run_sync

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")


# -- what both drivers share -------------------------------------------------------------------


def _retry_after_header(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delta form; an HTTP date is ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _answer(response: httpx.Response) -> Response:
    """The answer if it is 2xx.

    Raises:
        MQError: The typed error of any other status, rebuilt from the JSON error body.
    """
    if 200 <= response.status_code < 300:
        return Response(response.status_code, response.headers, response.content)
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    raise error_from_json(body, response.status_code, _retry_after_header(response.headers.get("Retry-After")))


def _connection_failed(request: Request, exc: httpx.TransportError) -> ConnectionFailed:
    """The ConnectionFailed for a transport error (refused, reset, timeout, protocol error)."""
    reason = str(exc) or type(exc).__name__
    return ConnectionFailed(
        f"{request.describe()}: no answer from the server ({type(exc).__name__}: {reason})",
        request=request.describe(),
        reason=type(exc).__name__,
    )


def _security(
    url: str, token: str | None, ca_bundle: str | None, verify: bool
) -> tuple[dict[str, str], ssl.SSLContext | bool]:
    """The headers (Authorization) and the httpx ``verify`` value from the arguments or MQ_TOKEN/MQ_CA_BUNDLE.

    Raises:
        FileNotFoundError, ssl.SSLError: The CA bundle cannot be read.
    """
    token = token if token is not None else os.environ.get("MQ_TOKEN") or None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if verify and url.startswith("http:"):
        # Plain HTTP: the client only sends to its base URL and follows no redirect, so no TLS context is ever
        # used. One that trusts no CA costs nothing; httpx's default one loads certifi's bundle (~35 ms of CPU
        # per client: per mqctl command). Were it ever used, it would refuse every certificate.
        return headers, ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not verify or not url.startswith("https:"):
        return headers, verify  # verification off, or a scheme httpx rejects itself
    bundle = ca_bundle if ca_bundle is not None else os.environ.get("MQ_CA_BUNDLE") or None
    context = ssl.create_default_context(cafile=bundle) if bundle else ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return headers, context


def _is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, MQError) and exc.retriable


class _Base(Operations):
    """Settings, connection pool and retry policy common to :class:`Client` and :class:`AsyncClient`."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout_seconds: float = 30.0,
        max_retries: int = 3,
        backoff_seconds: float = 0.1,
        max_backoff_seconds: float = 10.0,
        token: str | None = None,
        ca_bundle: str | None = None,
        verify: bool = True,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff_seconds < 0 or max_backoff_seconds < 0:
            raise ValueError("backoff_seconds and max_backoff_seconds must be >= 0")
        self.url = url
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._backoff = wait_random_exponential(multiplier=backoff_seconds, max=max_backoff_seconds)
        headers, tls = _security(url, token, ca_bundle, verify)
        self._open(headers, tls)

    def _open(self, headers: dict[str, str], tls: ssl.SSLContext | bool) -> None:
        """Make the httpx client of this driver (``self._http``)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _request_options(self, request: Request) -> dict[str, Any]:
        """The arguments of ``httpx.Client.request`` (and the async one's) for ``request``."""
        return {
            "method": request.method,
            "url": request.path,
            "params": request.params,
            "json": request.json,
            "content": request.content,
            "headers": request.headers,
            "timeout": httpx.Timeout(self.timeout_seconds, read=self.timeout_seconds + request.extra_read_seconds),
        }

    def _retry_sleep_seconds(self, state: RetryCallState) -> float:
        """Full-jitter exponential backoff, but at least the error's ``retry_after_seconds``."""
        seconds = self._backoff(state)
        exc = state.outcome.exception() if state.outcome is not None else None
        after = getattr(exc, "retry_after_seconds", None)
        if isinstance(after, int | float) and not isinstance(after, bool):
            seconds = max(seconds, float(after))
        return seconds

    def _retry_options(self, request: Request) -> dict[str, Any]:
        attempts = self.max_retries + 1

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            sleep = state.next_action.sleep if state.next_action is not None else 0.0
            logger.warning(
                "retrying %s in %.2f s after %s (attempt %d of %d): %s",
                request.describe(),
                sleep,
                getattr(exc, "code", type(exc).__name__),
                state.attempt_number + 1,
                attempts,
                exc,
            )

        return {
            "stop": stop_after_attempt(attempts),
            "wait": self._retry_sleep_seconds,
            "retry": retry_if_exception(_is_retriable),
            "before_sleep": log_retry,
            "reraise": True,
        }


_CLIENT_ARGS_DOC = """
    Args:
        url: Base URL of the mq daemon, e.g. ``http://127.0.0.1:8080`` (a path prefix is kept).
        timeout_seconds: Connect, read, write and pool timeout of each request, in seconds. A
            receive's read timeout is raised by its long-poll wait (``wait_time_seconds``, or 20
            when the queue's ``receive_wait_seconds`` applies) and a send's by 20 (the longest
            ``capacity_wait_seconds`` a full queue may make it wait).
        max_retries: How many more times a request is sent after a ConnectionFailed or a
            retriable error (StorageUnavailable 503, QueueFull 429); 0 = never retry.
        backoff_seconds: Base of the exponential backoff, in seconds: before retry n the client
            sleeps a random time in [0, min(max_backoff_seconds, backoff_seconds * 2 ** (n - 1))]
            (full jitter), and at least the server's Retry-After.
        max_backoff_seconds: Cap of the backoff window, in seconds (a longer Retry-After is honoured).
        token: Bearer token for a server started with ``--auth-file`` (docs/security.md); None =
            ``MQ_TOKEN`` from the environment, if set. Sent as ``Authorization: Bearer``.
        ca_bundle: PEM file of the CAs that sign the server's certificate (``https://`` URLs);
            None = ``MQ_CA_BUNDLE`` if set, else the system's CAs. The server is always verified
            unless ``verify`` is False.
        verify: False disables certificate verification (testing only: anyone on the path can
            read the token and the messages).

    Raises:
        ValueError: A negative count or duration, or ``timeout_seconds`` <= 0.
"""


# -- the blocking client -----------------------------------------------------------------------


def _blocking(op: Callable[P, Op[T]]) -> Callable[Concatenate[Client, P], T]:
    """The :class:`Client` method of operation ``op``: its parameters, run by :meth:`Client._run`."""

    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(*args, **kwargs))

    return derive(method, op, add_self=True, operation=True)


@documented_by(QueueClient)
class Client(_Base, QueueClient):
    """Blocking client of the mq HTTP API (docs/api.md), over one ``httpx.Client``.

    A :class:`~mqcore.client.api.QueueClient`: the methods, their arguments, results and errors
    are documented there. Thread-safe: one client (and its pool of keep-alive connections) can
    serve many threads. Use it as a context manager, or call :meth:`close`.
    """

    __doc__ = (__doc__ or "") + _CLIENT_ARGS_DOC

    def _open(self, headers: dict[str, str], tls: ssl.SSLContext | bool) -> None:
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout_seconds, headers=headers, verify=tls)

    # -- driver --

    def _once(self, request: Request) -> Response:
        try:
            response = self._http.request(**self._request_options(request))
        except httpx.TransportError as exc:
            raise _connection_failed(request, exc) from exc
        return _answer(response)

    def _send(self, request: Request) -> Response:
        """``request``'s answer, retried as the module docstring says."""
        response: Response = Retrying(**self._retry_options(request))(self._once, request)
        return response

    def _run(self, op: Op[T]) -> T:
        return run_sync(op, self._send)

    def close(self) -> None:
        self._http.close()

    # -- the API (docstrings: mqcore.client.api.QueueClient; operations: mqcore.client._operations) --

    @classmethod
    def _make_method(cls, name: str, op: Callable[..., Op[Any]]) -> Callable[..., Any]:
        return _blocking(op)


# -- the asyncio client ------------------------------------------------------------------------


def _awaited(op: Callable[P, Op[T]]) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """The :class:`AsyncClient` method of operation ``op``: its parameters, run by :meth:`AsyncClient._run`."""

    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(*args, **kwargs))

    return derive(method, op, add_self=True, operation=True)


@documented_by(AsyncQueueClient)
class AsyncClient(_Base, AsyncQueueClient):
    """Asyncio client of the mq HTTP API, over one ``httpx.AsyncClient``.

    An :class:`~mqcore.client.api.AsyncQueueClient`: the methods of :class:`Client`, as
    coroutines (``iter_peek`` returns an async iterator), documented in
    :class:`~mqcore.client.api.QueueClient`. Use it with ``async with``, or await :meth:`close`.
    """

    __doc__ = (__doc__ or "") + _CLIENT_ARGS_DOC

    def _open(self, headers: dict[str, str], tls: ssl.SSLContext | bool) -> None:
        self._http = httpx.AsyncClient(base_url=self.url, timeout=self.timeout_seconds, headers=headers, verify=tls)

    # -- driver --

    async def _once(self, request: Request) -> Response:
        try:
            response = await self._http.request(**self._request_options(request))
        except httpx.TransportError as exc:
            raise _connection_failed(request, exc) from exc
        return _answer(response)

    async def _send(self, request: Request) -> Response:
        """``request``'s answer, retried as the module docstring says."""
        response: Response = await AsyncRetrying(**self._retry_options(request))(self._once, request)
        return response

    async def _run(self, op: Op[T]) -> T:
        return await run_async(op, asyncio.to_thread, self._send)  # the operations yield only requests

    async def close(self) -> None:
        await self._http.aclose()

    # -- the API (docstrings: mqcore.client.api.QueueClient; operations: mqcore.client._operations) --

    @classmethod
    def _make_method(cls, name: str, op: Callable[..., Op[Any]]) -> Callable[..., Any]:
        return _awaited(op)
