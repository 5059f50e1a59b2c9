"""Requests aiohttp refuses before any route sees them, answered like every other mq error.

aiohttp's HTTP parser rejects a request line or header over its limits (``max_line_size``,
``max_field_size``: "Got more than 8190 bytes ..."), a malformed request line or header, and a bad
chunked body before the application runs, so :func:`daemons._http.errors_middleware` never sees
them. aiohttp then answers a ``text/plain`` 400 and logs the parser's exception at ERROR with a
traceback. A client's malformed request is not a server error: :class:`JsonErrorsRequestHandler`
answers the documented JSON body instead (``400 invalid_request``, ``docs/api.md`` "Errors") and
logs one INFO line without a traceback. Errors of the server itself (500) keep aiohttp's handling.

:class:`JsonErrorsAppRunner` is an ``AppRunner`` whose server creates these handlers (mq's runner,
``daemons._fastpath.FastPathRunner``, is one).
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from mqcore.errors import cap

logger = logging.getLogger("mq.front")


class JsonErrorsRequestHandler(RequestHandler):
    """aiohttp's connection handler, with the parser's 4xx answers as mq JSON error bodies."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Answer a request the parser refused: ``{"error": "invalid_request", "message", "details"}``.

        Args:
            request: The (partial) request.
            status: The status aiohttp chose (400 for parser errors).
            exc: The parser's exception (an ``HttpProcessingError``).
            message: aiohttp's text, e.g. ``Got more than 8190 bytes (60000) when reading Status line is too long.``
        Returns:
            The JSON response; the connection is closed after it (as aiohttp does).
        Raises:
            ConnectionError: Part of a response was already sent (from aiohttp's own handling).
        """
        if status >= 500 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        text = cap(" ".join(str(message or exc.message or "bad request").split()), 200)  # one line
        if isinstance(exc, BadHttpMethod):
            logger.debug("bad HTTP request from %s: %s", request.remote, text)
        else:
            logger.info("bad HTTP request from %s: %s", request.remote, text)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; cannot send the error")
        body = {
            "error": "invalid_request",
            "message": f"the request could not be read: {text}",
            "details": {"status": status},
        }
        response = web.json_response(body, status=status)
        response.force_close()
        return response


class _JsonErrorsServer(web.Server):
    """aiohttp's low-level server creating :class:`JsonErrorsRequestHandler` connection handlers."""

    def __call__(self) -> RequestHandler:
        return JsonErrorsRequestHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorsAppRunner(web.AppRunner):
    """An ``AppRunner`` whose connections answer parser errors as JSON (:class:`JsonErrorsRequestHandler`).

    Takes the arguments of ``aiohttp.web.AppRunner``.
    """

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The application's server, unchanged except for the class of the handlers it creates.
        server.__class__ = _JsonErrorsServer
        return server
