"""AWS Signature Version 4 verification for the SQS protocol (``--sqs-credentials FILE``; docs/sqs.md).

The signature is recomputed with botocore's own signer (``botocore.auth.SigV4Auth``) over the
headers the client says it signed, with the secret key of the client's access key id from the
credentials file (or of the ``[[access_keys]]`` of the auth file, ``--auth-file``: see
:mod:`daemons._sqs_auth`), and compared in constant time. A request dated more than 5 minutes from this
host's clock is refused, as AWS does.
"""

from __future__ import annotations

import datetime
import functools
import hmac
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from mqcore.errors import ConfigError
from mqcore.sqs import SqsError

#: Largest difference between a request's X-Amz-Date and this host's clock, in seconds (AWS: 5 minutes).
MAX_SKEW_SECONDS = 300

_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<key>[^/\s,]+)/(?P<date>[0-9]{8})/(?P<region>[^/\s,]+)/(?P<service>[^/\s,]+)"
    r"/aws4_request,\s*SignedHeaders=(?P<headers>[a-z0-9;_.-]+),\s*Signature=(?P<signature>[0-9a-f]{64})"
)


@functools.lru_cache(maxsize=4)
def load_credentials(path: str) -> dict[str, str]:
    """The credentials file: a JSON object of access key id -> secret access key.

    Raises:
        ConfigError: Unreadable, not JSON, not an object of non-empty strings, or empty.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"sqs-credentials: cannot read {path!r}: {exc}", key="sqs_credentials") from None
    if (
        not isinstance(data, dict)
        or not data
        or not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in data.items())
    ):
        raise ConfigError(
            f"sqs-credentials: {path!r} must be a JSON object of access key id -> secret access key",
            key="sqs_credentials",
        )
    return dict(data)


def verify(
    credentials: Mapping[str, str] | Callable[[str], str | None],
    method: str,
    url: str,
    headers: Any,
    body: bytes,
    now: datetime.datetime,
) -> str:
    """Check the request's SigV4 ``Authorization`` header; return the access key id that signed it.

    Args:
        credentials: Access key id -> secret access key (a mapping, or a function returning None for
            an unknown id).
        method: The HTTP method.
        url: The URL as the client addressed it (scheme, Host header, raw path and query).
        headers: The request headers (a case-insensitive mapping).
        body: The request body bytes.
        now: This host's time (UTC).
    Raises:
        SqsError: InvalidClientTokenId (no or unknown access key id, or a malformed header),
            SignatureDoesNotMatch (a wrong signature, or a date more than 5 minutes off).
    """
    match = _AUTH_RE.fullmatch((headers.get("Authorization") or "").strip())
    if match is None:
        raise SqsError("InvalidClientTokenId", "The request must be signed with AWS Signature Version 4.")
    secret = credentials(match["key"]) if callable(credentials) else credentials.get(match["key"])
    if secret is None:
        raise SqsError("InvalidClientTokenId", "The security token included in the request is invalid.")
    amz_date = headers.get("X-Amz-Date") or ""
    try:
        when = datetime.datetime.strptime(amz_date, SIGV4_TIMESTAMP).replace(tzinfo=datetime.UTC)
    except ValueError:
        raise SqsError("SignatureDoesNotMatch", "The request has no valid X-Amz-Date.") from None
    if abs((now - when).total_seconds()) > MAX_SKEW_SECONDS or amz_date[:8] != match["date"]:
        raise SqsError("SignatureDoesNotMatch", "Signature expired: the request's date is more than 5 minutes off.")
    signed = match["headers"].split(";")
    request = AWSRequest(method=method, url=url, data=body, headers={h: headers.get(h, "") for h in signed})
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(match["key"], secret), match["service"], match["region"])
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    if not hmac.compare_digest(expected, match["signature"]):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )
    return match["key"]
