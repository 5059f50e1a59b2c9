"""Authentication and authorization of HTTP requests to ``mq`` (``--auth-file``; docs/security.md).

The tokens, their scrypt hashes and their grants are :mod:`mqcore.auth`; this
module checks requests against them. Make an entry with ``mqctl auth hash``.

Per route (:data:`ROUTE_ACTIONS`): ``send`` (send, batch send), ``receive``
(receive, delete, change of visibility, peek), ``admin`` (create and delete a
queue, set attributes, purge, redrive; a redrive to an explicit destination
also needs ``send`` there). Every known token may list queues (the answer
shows only the queues its patterns match) and read the counts and attributes
of a queue it holds any action on. ``/healthz`` and ``/readyz`` are open;
``/metrics`` needs ``admin`` on the pattern ``*``; the console's static files
(``/ui...``) are open, its API calls are checked like any other.

The decision is this one table (method and route -> what it needs), read by
the middleware of :func:`make_auth_middleware`: a new route is classified by
adding one line (tests/unit/test_auth_rules.py fails for a route left out). The
principal is a :class:`mqcore.auth.Grant`, whatever proved it: a bearer token
here, or an SQS access key's SigV4 signature (``[[access_keys]]`` of the same
file), which :mod:`daemons._sqs_auth` checks on the SQS endpoint with the same
grants (that endpoint answers in SQS's error shapes, so this middleware only
hands it the authenticator).

Speed: a request's token is hashed once with SHA-256 and looked up in a cache
of verified tokens (the key is the digest, so the cache holds no token); only
a token not seen since the last load costs the scrypt checks (one at a time,
in a thread). Without ``--auth-file`` the middleware is not installed at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from mqcore.auth import ANY_ACTION, AccessKey, AuthFile, Entry, Grant, load_auth, verify
from mqcore.errors import ConfigError, Forbidden, Unauthorized

logger = logging.getLogger("mq.auth")

#: What a route needs besides an action: no token at all, or any known token.
OPEN = "open"
ANY_TOKEN = "any_token"
#: The SQS endpoint: signed with SigV4 by an access key (or a bearer token), checked per SQS action by
#: daemons._sqs_auth, refused in SQS's error shapes.
SQS = "sqs"

#: (method, canonical route) -> OPEN, ANY_TOKEN, ANY_ACTION or an action of mqcore.auth.ACTIONS.
#: Routes without ``{queue}`` that need an action need it on every queue (pattern ``*``).
#: HEAD is checked as GET.
ROUTE_ACTIONS: dict[tuple[str, str], str] = {
    ("POST", "/{queue}/messages"): "send",
    ("POST", "/{queue}/messages/batch"): "send",
    ("GET", "/{queue}/messages"): "receive",
    ("DELETE", "/{queue}/messages/{message_id}"): "receive",
    ("POST", "/{queue}/messages/delete"): "receive",
    ("POST", "/{queue}/messages/visibility"): "receive",
    ("POST", "/{queue}/messages/{message_id}/visibility"): "receive",
    ("GET", "/{queue}/peek"): "receive",
    ("POST", "/{queue}/peek"): "receive",
    ("POST", "/{queue}/leases/{key}"): "receive",  # issue 17: bulk leases
    ("DELETE", "/{queue}/leases/{key}"): "receive",
    ("GET", "/"): ANY_TOKEN,
    ("GET", "/{queue}"): ANY_ACTION,
    ("GET", "/{queue}/attributes"): ANY_ACTION,
    ("PUT", "/{queue}"): "admin",
    ("DELETE", "/{queue}"): "admin",
    ("PUT", "/{queue}/attributes"): "admin",
    ("POST", "/{queue}/purge"): "admin",
    ("POST", "/{queue}/redrive"): "admin",
    ("GET", "/{queue}/redrive"): "admin",
    ("DELETE", "/{queue}/redrive"): "admin",
    # Issue 15's operational routes: probes are open (they say only up or down), metrics name every queue.
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/metrics"): "admin",
    # Issue 13's SQS endpoint: SDKs sign with SigV4; the access keys of the auth file carry grants, checked
    # per SQS action (mqcore.auth.SQS_ACTIONS) by daemons._sqs_auth.
    ("POST", "/"): SQS,
    ("POST", "/{account}/{queue}"): SQS,
}
#: Canonical routes starting with this are the web console's static files: open (they hold no data; the API
#: calls the console makes are checked as above).
CONSOLE_PREFIX = "/ui"

#: Longest token accepted, in characters (a longer Authorization header is a 401 without any hashing).
MAX_TOKEN_CHARS = 512
#: Most verified (or refused) tokens remembered between loads; the cache starts over when full.
CACHE_ENTRIES = 10_000

GRANT_KEY = web.RequestKey("mq_grant", object)
#: On SQS requests: the Authenticator and the refusal counter, for daemons._sqs_auth.
SQS_AUTH_KEY = web.RequestKey("mq_sqs_auth", object)


def requirement(method: str, canonical: str) -> str:
    """What a request with ``method`` on the route ``canonical`` needs (``ANY_TOKEN`` for an unmatched path).

    Raises:
        KeyError: The route is not classified (a bug: every served route must be in ROUTE_ACTIONS).
    """
    if method == "HEAD":
        method = "GET"
    if canonical.startswith(CONSOLE_PREFIX):
        return OPEN
    return ROUTE_ACTIONS[(method, canonical)]


class Authenticator:
    """The tokens and SQS access keys of one auth file, the tokens' verification cache, and reload on SIGHUP.

    Args:
        path: The auth file (TOML, see the module docstring).

    Raises:
        ConfigError: The file is invalid (see :func:`mqcore.auth.load_auth`).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        loaded = _load(path)
        self._entries: list[Entry] = loaded.entries
        self._keys: dict[str, AccessKey] = loaded.access_keys
        self._cache: dict[bytes, Grant | None] = {}
        self._lock = asyncio.Lock()
        self._generation = 0

    @property
    def count(self) -> int:
        """Number of token entries loaded."""
        return len(self._entries)

    @property
    def has_access_keys(self) -> bool:
        """True if the file has SQS access keys."""
        return bool(self._keys)

    def access_key(self, key_id: str) -> AccessKey | None:
        """The SQS access key ``key_id`` of the file (its secret and grant), or None if there is none."""
        return self._keys.get(key_id)

    def reload(self) -> None:
        """Read the file again (SIGHUP); on error keep the tokens in force and log why.

        Open connections are untouched; the next request of each is checked against the new tokens.
        """
        try:
            loaded = _load(self.path)
        except ConfigError as exc:
            logger.error("auth file not reloaded, the previous tokens stay in force: %s", exc.message)
            return
        self._entries, self._keys = loaded.entries, loaded.access_keys
        self._cache = {}
        self._generation += 1
        logger.info(
            "auth file reloaded path=%s tokens=%d access_keys=%d", self.path, len(self._entries), len(self._keys)
        )

    async def authenticate(self, token: str) -> Grant | None:
        """The grant of ``token``, or None if no entry's hash matches (each check constant-time)."""
        raw = token.encode("utf-8", "surrogateescape")
        digest = hashlib.sha256(raw).digest()
        try:
            return self._cache[digest]
        except KeyError:
            pass
        async with self._lock:  # one scrypt at a time: unknown tokens cannot take every core
            generation, entries = self._generation, self._entries
            if digest in self._cache:
                return self._cache[digest]
            grant = await asyncio.to_thread(verify, entries, raw)
            if generation == self._generation:
                if len(self._cache) >= CACHE_ENTRIES:
                    self._cache = {}
                self._cache[digest] = grant
        return grant


def _load(path: str) -> AuthFile:
    """:func:`mqcore.auth.load_auth`, and botocore present if the file has access keys (SigV4 needs it).

    Raises:
        ConfigError: The file is invalid, or has access keys and botocore is not installed.
    """
    loaded = load_auth(path)
    if loaded.access_keys and importlib.util.find_spec("botocore") is None:
        raise ConfigError("the auth file's access_keys (SigV4) need botocore: pip install 'mq[sqs]'", key="auth_file")
    return loaded


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 section 2.1), or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return token


def _unauthorized(message: str, error: str | None) -> web.Response:
    challenge = 'Bearer realm="mq"' + (f', error="{error}"' if error else "")
    return web.json_response(
        Unauthorized(message).to_json(), status=Unauthorized.status, headers={"WWW-Authenticate": challenge}
    )


def make_auth_middleware(
    auth: Authenticator, refusals: Counter[str] | None = None
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The aiohttp middleware that enforces ``auth`` (put it first: it answers 401/403 before any handler).

    ``refusals["unauthorized"]`` and ``refusals["forbidden"]`` count the refusals, if given.

    A request's grant is stored as ``request[GRANT_KEY]`` (see :func:`grant_of`).
    """

    counts: Counter[str] = refusals if refusals is not None else Counter()

    @web.middleware
    async def auth_middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        match = request.match_info
        route = match.route.resource
        if match.http_exception is not None or route is None:
            needed = ANY_TOKEN  # no such route: say so only to a known token
        else:
            needed = requirement(request.method, route.canonical)
        if needed == OPEN:
            return await handler(request)
        if needed == SQS:
            request[SQS_AUTH_KEY] = (auth, counts)
            return await handler(request)
        refused = await admit(auth, counts, request, needed, match.get("queue"))
        return refused if refused is not None else await handler(request)

    return auth_middleware


async def admit(
    auth: Authenticator, counts: Counter[str], request: web.BaseRequest, needed: str, queue: str | None
) -> web.Response | None:
    """Check the request's bearer token for ``needed`` on ``queue``: None to go on, or the 401/403 answer.

    What :func:`make_auth_middleware` does for a route that needs a token (``needed`` is ``ANY_TOKEN``,
    ``ANY_ACTION`` or an action), shared with the hot routes of ``daemons._fastpath``
    (:func:`admit_token`). On success the grant is stored as ``request[GRANT_KEY]``.

    Args:
        auth: The tokens.
        counts: The refusal counters.
        request: The request (its ``Authorization`` header).
        needed: What the route needs (:func:`requirement`).
        queue: The route's ``{queue}`` as matched (not yet checked as a name), or None.
    """
    where = (request.method, request.path, request.remote)
    grant, refused = await admit_token(auth, counts, request.headers.get("Authorization"), needed, queue, where)
    if grant is not None:
        request[GRANT_KEY] = grant
    return refused


async def admit_token(
    auth: Authenticator,
    counts: Counter[str],
    authorization: str | None,
    needed: str,
    queue: str | None,
    where: tuple[str, str, str | None],
) -> tuple[Grant | None, web.Response | None]:
    """The token check of :func:`admit` on an ``Authorization`` header (also ``daemons._wire``'s).

    Args:
        auth: The tokens.
        counts: The refusal counters: a refusal adds to ``counts["unauthorized"]`` or ``counts["forbidden"]``.
        authorization: The request's ``Authorization`` header, or None.
        needed: What the route needs (:func:`requirement`).
        queue: The route's ``{queue}`` as matched (not yet checked as a name), or None.
        where: The request's method, path and peer address (for the log line of an unknown token).
    Returns:
        (the token's grant or None, None to go on or the 401/403 answer).
    """
    token = bearer(authorization)
    if token is None:
        counts["unauthorized"] += 1
        return None, _unauthorized("a token is required: Authorization: Bearer <token>", None)
    grant = await auth.authenticate(token)
    if grant is None:
        counts["unauthorized"] += 1
        logger.warning("unknown token method=%s path=%s peer=%s", *where)
        return None, _unauthorized("the token is not valid", "invalid_token")
    if needed != ANY_TOKEN and not grant.allows(needed, queue):
        counts["forbidden"] += 1
        return grant, _forbidden(grant, needed, queue)
    return grant, None


def _forbidden(grant: Grant, action: str, queue: str | None) -> web.Response:
    logger.warning("forbidden token=%s action=%s queue=%s", grant.name, action, queue)
    what = "any action" if action == ANY_ACTION else action
    exc = Forbidden(
        f"the token {grant.name!r} may not do {what} on " + (f"queue {queue!r}" if queue else "every queue (*)"),
        action=action,
        queue=queue,
    )
    challenge = 'Bearer realm="mq", error="insufficient_scope"'
    return web.json_response(exc.to_json(), status=exc.status, headers={"WWW-Authenticate": challenge})


def grant_of(request: web.Request) -> Grant | None:
    """The request's grant; None when mq runs without ``--auth-file`` (everything is allowed)."""
    return request.get(GRANT_KEY)


def visible(request: web.Request, queues: Sequence[str]) -> list[str]:
    """The names of ``queues`` the request's token matches (all of them without ``--auth-file``)."""
    grant = grant_of(request)
    return list(queues) if grant is None else [q for q in queues if grant.matches(q)]


def require(request: web.Request, action: str, queue: str) -> None:
    """Raise Forbidden unless the request's token may do ``action`` on ``queue`` (a second queue of one request).

    Raises:
        Forbidden: Not granted (403).
    """
    grant = grant_of(request)
    if grant is not None and not grant.allows(action, queue):
        logger.warning("forbidden token=%s action=%s queue=%s", grant.name, action, queue)
        raise Forbidden(f"the token {grant.name!r} may not do {action} on queue {queue!r}", action=action, queue=queue)
