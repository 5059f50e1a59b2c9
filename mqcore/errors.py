"""One error tree for mq.

Every error the storage protocol or the daemons raise on purpose derives from
:class:`MQError`. Each class carries a stable snake_case ``code`` (sent in JSON
error bodies), the HTTP ``status`` the front end answers with, and whether a
client may simply retry (``retriable``). Only ``daemons/`` reads ``status``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

_BY_CODE: dict[str, type[MQError]] = {}
"""Error code -> the first class declaring it (what a client re-raises)."""

#: Most characters of a client's input an error message or ``details`` value repeats (then ``...``).
ECHO_LIMIT = 100


def cap(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` cut to ``limit`` characters followed by ``...`` when longer (a 5,000-character name is not
    sent back whole)."""
    return text if len(text) <= limit else text[:limit] + "..."


def echo(value: Any, limit: int = ECHO_LIMIT) -> str:
    """A client's input as it looked on the wire, for error messages: JSON spelling (``"jobs"``, ``true``,
    ``null``, ``1.5``; a Python spelling for values JSON cannot hold), capped by :func:`cap`."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
    return cap(text, limit)


class MQError(Exception):
    """Root of every mq error.

    Args:
        message: Human-readable explanation, sent as ``message`` in JSON bodies.
        **details: Facts about the failure (sizes, names), kept in ``details``.
    """

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    retriable: ClassVar[bool] = False

    def __init_subclass__(
        cls, code: str | None = None, status: int | None = None, retriable: bool | None = None, **kwargs: Any
    ) -> None:
        """Declare a subclass's ``code``, HTTP ``status`` and ``retriable`` as class keywords
        (``class QueueFull(MQError, code="queue_full", status=429, retriable=True)``); unset ones are inherited."""
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if status is not None:
            cls.status = status
        if retriable is not None:
            cls.retriable = retriable
        _BY_CODE.setdefault(cls.code, cls)

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        """Return the JSON error body ``{"error": code, "message": ..., "details": {...}}``."""
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class InvalidRequest(MQError, ValueError, code="invalid_request", status=400):
    """The request is malformed (HTTP 400)."""


class InvalidQueueName(InvalidRequest, code="invalid_queue_name"):
    """A queue name is not 1-80 characters of ``[A-Za-z0-9_-]`` (SQS's rule)."""


class InvalidMessageId(InvalidRequest, code="invalid_message_id"):
    """A message id is not a well-formed mq message id (a lowercase UUIDv7 string)."""


class MessageTooLarge(InvalidRequest, code="message_too_large", status=413):
    """A message body exceeds the configured maximum (HTTP 413).

    Args:
        size_bytes: Size of the rejected body in bytes (or of what was read so far).
        max_bytes: The configured limit in bytes.
    """

    def __init__(self, size_bytes: int, max_bytes: int) -> None:
        super().__init__(
            f"message body is larger than the limit of {max_bytes} bytes",
            size_bytes=size_bytes,
            max_bytes=max_bytes,
        )


class QueueNotFound(MQError, LookupError, code="queue_not_found", status=404):
    """The queue does not exist (HTTP 404)."""


class MessageNotFound(MQError, LookupError, code="message_not_found", status=404):
    """No message with that id is ready, in flight or being written (HTTP 404)."""


class StorageUnavailable(MQError, code="storage_unavailable", status=503, retriable=True):
    """The message cannot be guaranteed stored (HTTP 503 + Retry-After).

    Raised on ENOSPC, EDQUOT, EIO, EROFS and any failed fsync. The write is
    abandoned, never retried on the same file descriptor (an fsync that failed
    once may report success later while the data is gone: "fsyncgate").

    Args:
        message: What failed.
        retry_after_seconds: Suggested wait before retrying, in seconds.
    """

    def __init__(self, message: str, retry_after_seconds: int = 1, **details: Any) -> None:
        super().__init__(message, retry_after_seconds=retry_after_seconds, **details)
        self.retry_after_seconds = retry_after_seconds


class InsufficientStorage(StorageUnavailable, code="insufficient_storage", status=507):
    """Free space or inodes of the root's filesystem are below the daemon's floor (HTTP 507 + Retry-After).

    Refused before the disk is actually full (``--min-free-bytes``), so that
    receives, deletes and the daemons' renames keep working. Retriable once
    space is freed. Source: RFC 4918 section 11.5 (507 Insufficient Storage).
    """


class ConfigError(MQError, ValueError, code="config_error", status=500):
    """A setting is invalid; the message names the key, the value and the layer."""


class InvalidReceiptHandle(InvalidRequest, code="invalid_receipt_handle"):
    """A receipt handle is malformed, or names another queue or message (HTTP 400)."""


class StaleReceiptHandle(MQError, code="stale_receipt_handle", status=410):
    """The message was received again after this receipt handle was issued (HTTP 410).

    The newer lease is left untouched (SQS: a stale handle must never delete
    a message another consumer received since; ElasticMQ answers
    ReceiptHandleIsInvalid).
    """


class MessageNotInFlight(InvalidRequest, code="message_not_in_flight"):
    """Change of visibility of a message that is ready, not in flight (SQS: MessageNotInflight, HTTP 400)."""


class InvalidAttribute(InvalidRequest, code="invalid_attribute"):
    """A queue attribute or message attribute is unknown or out of range (HTTP 400; ``details["name"]``)."""


class QueueNameExists(MQError, code="queue_name_exists", status=409):
    """A queue exists with other attributes than the ones given to create it (SQS: QueueNameExists, HTTP 409)."""


class QueueFull(MQError, code="queue_full", status=429, retriable=True):
    """The queue holds ``capacity`` ready messages and no room was made in time (HTTP 429 + Retry-After).

    Args:
        message: What is full.
        retry_after_seconds: Suggested wait before retrying, in seconds.
    """

    def __init__(self, message: str, retry_after_seconds: int = 1, **details: Any) -> None:
        super().__init__(message, retry_after_seconds=retry_after_seconds, **details)
        self.retry_after_seconds = retry_after_seconds


class RedriveInProgress(MQError, code="redrive_in_progress", status=409):
    """A redrive out of this dead-letter queue is already running (HTTP 409; SQS allows one task per queue)."""


class RedriveNotRunning(MQError, code="redrive_not_running", status=404):
    """``DELETE /<queue>/redrive`` while no redrive out of that queue is running (HTTP 404).

    Running means a status "running" rewritten within the last 10 s by the
    daemon running the task; a finished, cancelled or stale task is not.
    """


class RouteNotFound(MQError, LookupError, code="not_found", status=404):
    """No such HTTP route (HTTP 404 ``not_found``): a wrong URL or an older server."""


class MethodNotAllowed(InvalidRequest, code="method_not_allowed", status=405):
    """The route exists but not with this HTTP method (HTTP 405)."""


class Unauthorized(MQError, code="unauthorized", status=401):
    """No token, or a token the server does not know (HTTP 401 ``unauthorized``, with
    ``WWW-Authenticate: Bearer``; RFC 6750). Not retriable: the same token fails again."""


class Forbidden(MQError, code="forbidden", status=403):
    """A known token without the action on this queue (HTTP 403 ``forbidden``; RFC 6750
    ``insufficient_scope``). ``details``: ``action`` and ``queue`` (null for a route of no queue)."""


class RequestTimeout(MQError, code="request_timeout", status=408, retriable=True):
    """The request's body did not arrive within the server's ``--body-timeout`` (HTTP 408
    ``request_timeout``); the server closes the connection. Retriable: nothing was stored."""


class ServerBusy(MQError, code="server_busy", status=503, retriable=True):
    """The server refused the request or connection to protect itself: too many connections or
    long-poll waiters (HTTP 503 ``server_busy``, ``Retry-After``). Retriable."""

    def __init__(self, message: str, retry_after_seconds: int = 1, **details: Any) -> None:
        super().__init__(message, retry_after_seconds=retry_after_seconds, **details)
        self.retry_after_seconds = retry_after_seconds


class HTTPError(MQError, code="http_error", status=400):
    """Any other HTTP-level error of the server (``http_error``; ``details["status"]``)."""


_BY_CODE[MQError.code] = MQError


def error_from_json(body: Any, status: int, retry_after_seconds: float | None = None) -> MQError:
    """Rebuild the typed error a server answered (what clients raise).

    Args:
        body: The decoded JSON error body ``{"error": code, "message": text, "details": {...}}``,
            or anything else for a non-JSON answer.
        status: The HTTP status of the answer.
        retry_after_seconds: The ``Retry-After`` header, in seconds, if there was one.
    Returns:
        An instance of the class registered for ``code`` (its ``message`` and
        ``details`` from the body, ``status`` the one received), or a plain
        :class:`MQError` (code ``internal_error`` for 5xx, ``http_error`` otherwise)
        when the code is unknown or the body is not an mq error.
    """
    code = body.get("error") if isinstance(body, dict) else None
    message = body.get("message") if isinstance(body, dict) else None
    details = body.get("details") if isinstance(body, dict) else None
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = MQError if status >= 500 else HTTPError
    exc = cls.__new__(cls)
    text = message if isinstance(message, str) else f"HTTP {status}: {code or 'unexpected answer'}"
    MQError.__init__(exc, text, **(details if isinstance(details, dict) else {}))
    if not isinstance(code, str) or code not in _BY_CODE:
        exc.details.setdefault("status", status)
        if isinstance(code, str):
            exc.details.setdefault("code", code)
    if cls.retriable or hasattr(cls, "retry_after_seconds"):
        after = exc.details.get("retry_after_seconds", retry_after_seconds)
        exc.retry_after_seconds = after if isinstance(after, int | float) else 1  # type: ignore[attr-defined]
    return exc


class ConnectionFailed(MQError, code="connection_failed", status=503, retriable=True):
    """A client got no complete answer: connection refused or reset, or a timeout (never sent by a server).

    Retriable. After a timeout a send may or may not have been stored (at
    least once: a retry can make a duplicate); a receive may have leased
    messages that come back after their visibility timeout.
    """
