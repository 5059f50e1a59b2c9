"""Who may do which action of the SQS endpoint (docs/security.md): access keys on the same grants as tokens.

With ``--auth-file``, an SQS request is signed (AWS Signature Version 4) by one of
the file's ``[[access_keys]]``, whose grant (queue globs and actions, a
:class:`mqcore.auth.Grant` as a token's) then decides each action by
:data:`mqcore.auth.SQS_ACTIONS`; a bearer token of the file is accepted too.
Refusals are SQS's errors, which the SDKs raise as they would from AWS:
``InvalidClientTokenId`` (unknown key or token, unsigned), ``SignatureDoesNotMatch``
(wrong secret), ``AccessDenied`` (HTTP 403, an action not granted).

Without ``--auth-file``, ``--sqs-credentials`` (a JSON file of key id -> secret)
checks signatures and grants everything; without either, any request is served,
as ElasticMQ does. With ``--auth-file``, ``--sqs-credentials`` is not used.
"""

from __future__ import annotations

import datetime
import logging
from collections import Counter
from typing import Any

from aiohttp import web

from daemons import _auth
from daemons._http import BROKER
from mqcore import sqs
from mqcore.auth import ANY_ACTION, LIST, SQS_ACTIONS, Grant
from mqcore.names import QueueName

logger = logging.getLogger("mq.auth")

#: Logged at start when both are given (``{}``: the credentials file): the auth file's access keys win.
IGNORED_CREDENTIALS = (
    "--sqs-credentials {} is ignored: with --auth-file, SQS requests are checked against the auth file's "
    '[[access_keys]] (docs/sqs.md "Authentication"); move its keys there, or drop --sqs-credentials'
)


class AccessDenied(sqs.SqsError):
    """SQS's ``AccessDenied`` (HTTP 403; botocore raises it as ClientError with code AccessDenied)."""

    def __init__(self, message: str) -> None:
        super().__init__("AccessDenied", message)

    @property
    def http_status(self) -> int:
        """403, as SQS answers a request its policy does not allow."""
        return 403

    @property
    def query_error(self) -> str:
        """``AccessDenied;Sender`` (the code botocore reads from ``x-amzn-query-error``)."""
        return "AccessDenied;Sender"


async def authenticate(request: web.Request, raw: bytes) -> Grant | None:
    """The principal of an SQS request: its grant with ``--auth-file``, else None (every action allowed).

    Args:
        request: The SQS request (its headers, URL and the middleware's note of the Authenticator).
        raw: Its whole body (SigV4 signs its SHA-256).
    Raises:
        SqsError: InvalidClientTokenId (unsigned, an unknown access key or bearer token),
            SignatureDoesNotMatch (a wrong secret, a date more than 5 minutes off).
    """
    noted = request.get(_auth.SQS_AUTH_KEY)
    if noted is None:  # no --auth-file
        credentials_file = request.app[BROKER].settings.sqs_credentials
        if credentials_file:
            from daemons import _sigv4  # botocore, imported only when signatures are checked

            _sigv4.verify(_sigv4.load_credentials(credentials_file), request.method, _url(request),
                          request.headers, raw, datetime.datetime.now(datetime.UTC))  # fmt: skip
        return None
    auth, counts = noted
    assert isinstance(auth, _auth.Authenticator) and isinstance(counts, Counter)
    token = _auth.bearer(request.headers.get("Authorization"))
    try:
        if token is not None:
            grant = await auth.authenticate(token)
            if grant is None:
                raise sqs.SqsError("InvalidClientTokenId", "The security token included in the request is invalid.")
        elif not auth.has_access_keys:  # nothing could verify (and botocore may be absent): no key is known
            raise sqs.SqsError("InvalidClientTokenId", "The security token included in the request is invalid.")
        else:
            from daemons import _sigv4

            def secret(key_id: str) -> str | None:
                key = auth.access_key(key_id)
                return None if key is None else key.secret_key

            key_id = _sigv4.verify(secret, request.method, _url(request), request.headers, raw,
                                   datetime.datetime.now(datetime.UTC))  # fmt: skip
            found = auth.access_key(key_id)
            if found is None:  # removed by a reload during the check
                raise sqs.SqsError("InvalidClientTokenId", "The security token included in the request is invalid.")
            grant = found.grant
    except sqs.SqsError as exc:
        counts["unauthorized"] += 1
        logger.warning("sqs request refused (%s) peer=%s", exc.sqs_code, request.remote)
        raise
    request[_auth.GRANT_KEY] = grant
    return grant


def _url(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}{request.raw_path}"


def authorize(request: web.Request, grant: Grant | None, action: str, body: dict[str, Any]) -> None:
    """Refuse the SQS ``action`` with ``body`` unless ``grant`` allows it (None: no --auth-file, all allowed).

    The queue is the one the action names (QueueName, QueueUrl, SourceArn, TaskHandle); a
    request whose queue cannot be read is allowed only to a grant on ``*`` (the action then
    answers its own validation error). StartMessageMoveTask with a DestinationArn also needs
    ``send`` on the destination, as the native redrive does.

    Raises:
        AccessDenied: Not granted (HTTP 403), counted as ``forbidden``.
    """
    if grant is None:
        return
    needed = SQS_ACTIONS.get(action)
    if needed == LIST:
        return
    checks: list[tuple[str, QueueName | None]] = [(needed or "", _queue_of(action, body))]
    if action == "StartMessageMoveTask" and body.get("DestinationArn") is not None:
        checks.append(("send", _or_none(sqs.queue_from_arn, body.get("DestinationArn"), "DestinationArn")))
    for what, queue in checks:
        if not _allows(grant, what, queue):
            noted = request.get(_auth.SQS_AUTH_KEY)
            if noted is not None:
                noted[1]["forbidden"] += 1
            logger.warning("forbidden access_key=%s sqs_action=%s queue=%s", grant.name, action, queue)
            where = f"queue {queue}" if queue else "every queue (*)"
            raise AccessDenied(f"{grant.name} is not authorized to perform {action} ({what or 'unknown'}) on {where}.")


def _allows(grant: Grant, needed: str, queue: QueueName | None) -> bool:
    if needed not in (*grant.actions, ANY_ACTION):  # also an action missing from SQS_ACTIONS: fail closed
        return False
    if queue is None:
        return "*" in grant.queues and bool(grant.actions)
    return grant.allows(needed, queue)


def _queue_of(action: str, body: dict[str, Any]) -> QueueName | None:
    """The queue the SQS request names, or None if it names none that can be read."""
    if action == "CreateQueue":
        return _or_none(sqs.check_new_queue_name, body.get("QueueName"))
    if action == "GetQueueUrl":
        name = body.get("QueueName")
        queue = _or_none(sqs.queue_from_url, name) if isinstance(name, str) else None
        return queue if queue == name else None
    if action in ("StartMessageMoveTask", "ListMessageMoveTasks"):
        return _or_none(sqs.queue_from_arn, body.get("SourceArn"), "SourceArn")
    if action == "CancelMessageMoveTask":
        try:
            return sqs.parse_task_handle(body.get("TaskHandle"))[1]
        except sqs.SqsError:
            return None
    return _or_none(sqs.queue_from_url, body.get("QueueUrl"))


def _or_none(parse: Any, *args: Any) -> QueueName | None:
    try:
        queue: QueueName = parse(*args)
    except sqs.SqsError:
        return None
    return queue
