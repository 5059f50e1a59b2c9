"""Tokens and grants of mq's authorization (docs/security.md): the auth file, scrypt hashes, glob grants.

No HTTP here: ``daemons._auth`` checks requests against these rules, ``mqctl auth hash``
makes entries, and an SQS access key (issue 13) can map to the same :class:`Grant`.

The auth file (TOML) lists tokens, each stored only as a salted scrypt hash (RFC 7914),
with the queue name patterns (shell globs, ``fnmatch.fnmatchcase``) it may use and the
actions it may do there::

    [[tokens]]
    name = "orders-producer"          # shown in logs, never the token
    hash = "scrypt$16384$8$1$<salt base64>$<key base64>"
    queues = ["orders-*"]
    actions = ["send"]

Actions (:data:`ACTIONS`): ``send`` (send, batch send), ``receive`` (receive,
delete, change of visibility, peek: everything that reads or settles messages),
``admin`` (create and delete a queue, set attributes, purge, redrive).

SQS access keys (the SQS-compatible endpoint, docs/sqs.md) carry the same grants::

    [[access_keys]]
    name = "orders-producer-sqs"
    access_key = "AKIDORDERSPRODUCER"
    secret_key = "<at least 16 characters>"   # in clear: SigV4 needs the secret itself
    queues = ["orders-*"]
    actions = ["send"]

A SigV4 signature is an HMAC keyed by (a key derived from) the secret, so the
server must hold the secret itself, not a hash of it: a file with access keys
must not be readable or writable by others (:func:`load_auth` refuses it, as
ssh refuses a private key others can read). :data:`SQS_ACTIONS` says which
action each SQS action needs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import stat
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from mqcore.errors import ConfigError

#: The actions a token may be granted.
ACTIONS = ("send", "receive", "admin")
#: Any action on the queue (what reading a queue's counts and attributes needs).
ANY_ACTION = "any_action"

#: What each action of SQS's API needs (docs/security.md): send, receive, admin, ANY_ACTION on the queue
#: (read-only facts of one queue, as the native GET /{queue} and /{queue}/attributes), or LIST (any known
#: principal; the answer lists only the queues its patterns match, as the native GET /). An action not in
#: this table is refused (fail closed). A move task with a DestinationArn also needs send on the destination.
LIST = "list"
SQS_ACTIONS: dict[str, str] = {
    "SendMessage": "send",
    "SendMessageBatch": "send",
    "ReceiveMessage": "receive",
    "DeleteMessage": "receive",
    "DeleteMessageBatch": "receive",
    "ChangeMessageVisibility": "receive",
    "ChangeMessageVisibilityBatch": "receive",
    "CreateQueue": "admin",
    "DeleteQueue": "admin",
    "PurgeQueue": "admin",
    "SetQueueAttributes": "admin",
    "TagQueue": "admin",
    "UntagQueue": "admin",
    "StartMessageMoveTask": "admin",
    "CancelMessageMoveTask": "admin",
    "ListMessageMoveTasks": "admin",
    "GetQueueUrl": ANY_ACTION,
    "GetQueueAttributes": ANY_ACTION,
    "ListQueueTags": ANY_ACTION,
    "ListDeadLetterSourceQueues": ANY_ACTION,
    "ListQueues": LIST,
}

#: An access key id: what SigV4's Credential= can carry (AWS's own ids are 16-128 of [A-Z0-9]).
ACCESS_KEY_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
#: Shortest secret access key accepted, in characters (AWS's are 40).
MIN_SECRET_CHARS = 16

#: scrypt cost of new entries (RFC 7914; n=2**14, r=8, p=1: ~16 MiB and ~50 ms per check).
SCRYPT_N = 16384
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class Grant:
    """What one token may do: ``actions`` on the queues matching ``queues`` (globs)."""

    name: str
    queues: tuple[str, ...]
    actions: frozenset[str]

    def matches(self, queue: str) -> bool:
        """True if ``queue`` matches one of the patterns (case-sensitive ``fnmatch``)."""
        return any(fnmatchcase(queue, pattern) for pattern in self.queues)

    def allows(self, action: str, queue: str | None) -> bool:
        """True if the token may do ``action`` (or ANY_ACTION) on ``queue``; None = every queue (pattern ``*``)."""
        if action == ANY_ACTION:
            return queue is not None and bool(self.actions) and self.matches(queue)
        if action not in self.actions:
            return False
        return "*" in self.queues if queue is None else self.matches(queue)


@dataclass(frozen=True, slots=True)
class Entry:
    grant: Grant
    n: int
    r: int
    p: int
    salt: bytes
    key: bytes

    def check(self, token: bytes) -> bool:
        derived = hashlib.scrypt(token, salt=self.salt, n=self.n, r=self.r, p=self.p, dklen=len(self.key),
                                 maxmem=256 * self.r * self.n + (1 << 20))  # fmt: skip
        return hmac.compare_digest(derived, self.key)


@dataclass(frozen=True, slots=True)
class AccessKey:
    """An SQS access key of the auth file: its id, its secret (in clear, for SigV4) and its grant."""

    access_key: str
    secret_key: str = field(repr=False)
    grant: Grant


@dataclass(frozen=True, slots=True)
class AuthFile:
    """The contents of an auth file: token entries (hashed) and SQS access keys by id."""

    entries: list[Entry]
    access_keys: dict[str, AccessKey]


def hash_token(token: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """The ``hash`` value of an auth file entry for ``token``: ``scrypt$n$r$p$salt$key`` (base64, random salt)."""
    salt = os.urandom(SALT_BYTES)
    key = hashlib.scrypt(token.encode(), salt=salt, n=n, r=r, p=p, dklen=KEY_BYTES, maxmem=256 * r * n + (1 << 20))
    return "$".join(["scrypt", str(n), str(r), str(p), base64.b64encode(salt).decode(), base64.b64encode(key).decode()])


def _parse_hash(text: Any, where: str) -> tuple[int, int, int, bytes, bytes]:
    parts = text.split("$") if isinstance(text, str) else []
    try:
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, key = base64.b64decode(parts[4], validate=True), base64.b64decode(parts[5], validate=True)
        if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or n * r > 1 << 24 or len(key) < 16:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"{where}.hash must be scrypt$N$r$p$salt$key as printed by `python -m daemons._auth hash`", key="hash"
        ) from None
    return n, r, p, salt, key


def load_auth_file(path: str) -> list[Entry]:
    """The token entries of the auth file at ``path`` (see :func:`load_auth`).

    Raises:
        ConfigError: As :func:`load_auth`.
    """
    return load_auth(path).entries


def _grant(item: dict[str, Any], where: str) -> Grant:
    queues, actions = item.get("queues"), item.get("actions")
    if not isinstance(queues, list) or not queues or not all(isinstance(q, str) and q for q in queues):
        raise ConfigError(f'{where}.queues must be a non-empty list of glob patterns, e.g. ["orders-*"]')
    if not isinstance(actions, list) or not actions or not all(a in ACTIONS for a in actions):
        raise ConfigError(f"{where}.actions must be a non-empty list of {', '.join(ACTIONS)}")
    return Grant(item["name"], tuple(queues), frozenset(actions))


def _check_private(path: str, mode: int) -> None:
    """Refuse a file holding secrets that others may read, or that the group or others may write."""
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        raise ConfigError(
            f"auth file {path} holds SQS secret keys in clear and its mode is {stat.S_IMODE(mode):04o}: "
            "others must not read or write it, nor the group write it (chmod 0600, or 0640 root:mq)",
            path=path,
        )


def load_auth(path: str) -> AuthFile:
    """Read and check the auth file at ``path``: ``[[tokens]]`` and ``[[access_keys]]``.

    Raises:
        ConfigError: Unreadable, not TOML, an unknown key, or an entry without a name
            (unique over the file), a non-empty list of queue patterns and of actions
            (each one of ACTIONS); a token without a valid hash; an access key whose id
            is not ACCESS_KEY_RE or is given twice, or whose secret is shorter than
            MIN_SECRET_CHARS; or access keys in a file others may read or write
            (mode & 0o027: the secrets are in clear, see the module docstring).
    """
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"auth file {path}: {exc.strerror}", path=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"auth file {path} is not valid TOML: {exc}", path=path) from exc
    if set(data) - {"tokens", "access_keys"}:
        raise ConfigError(
            f"auth file {path}: unknown key(s) {sorted(set(data) - {'tokens', 'access_keys'})}; "
            "only [[tokens]] and [[access_keys]]"
        )
    entries: list[Entry] = []
    keys: dict[str, AccessKey] = {}
    names: set[str] = set()
    for table, allowed in (("tokens", {"hash"}), ("access_keys", {"access_key", "secret_key"})):
        items = data.get(table, [])
        if not isinstance(items, list):
            raise ConfigError(f"auth file {path}: {table} must be an array of tables [[{table}]]")
        for i, item in enumerate(items):
            where = f"auth file {path}: {table}[{i}]"
            allowed_keys = {"name", "queues", "actions"} | allowed
            if not isinstance(item, dict) or set(item) - allowed_keys:
                raise ConfigError(f"{where} must have only {', '.join(sorted(allowed_keys))}")
            name = item.get("name")
            if not isinstance(name, str) or not name or name in names:
                raise ConfigError(f"{where}.name must be a non-empty string, unique in the file")
            names.add(name)
            grant = _grant(item, where)
            if table == "tokens":
                n, r, p, salt, key = _parse_hash(item.get("hash"), where)
                entries.append(Entry(grant, n, r, p, salt, key))
                continue
            key_id, secret = item.get("access_key"), item.get("secret_key")
            if not isinstance(key_id, str) or not ACCESS_KEY_RE.fullmatch(key_id) or key_id in keys:
                raise ConfigError(f"{where}.access_key must be 1-128 of [A-Za-z0-9_.-], unique in the file")
            if not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS:
                raise ConfigError(f"{where}.secret_key must be a string of at least {MIN_SECRET_CHARS} characters")
            keys[key_id] = AccessKey(key_id, secret, grant)
    if keys:
        _check_private(path, mode)
    return AuthFile(entries, keys)


def verify(entries: Iterable[Entry], token: bytes) -> Grant | None:
    """Check ``token`` against every entry (no early exit, so the time does not tell which matched)."""
    found = None
    for entry in entries:
        if entry.check(token) and found is None:
            found = entry.grant
    return found


def entry_toml(name: str, token: str, queues: list[str], actions: list[str]) -> str:
    """An auth file entry (TOML text) for ``token``, hashed."""
    return (
        f'[[tokens]]\nname = "{name}"\nhash = "{hash_token(token)}"\n'
        f"queues = {_array(queues)}\nactions = {_array(actions)}\n"
    )


def _array(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def access_key_toml(name: str, access_key: str, secret_key: str, queues: list[str], actions: list[str]) -> str:
    """An ``[[access_keys]]`` entry (TOML text): the secret in clear (SigV4 needs it; keep the file private)."""
    return (
        f'[[access_keys]]\nname = "{name}"\naccess_key = "{access_key}"\nsecret_key = "{secret_key}"\n'
        f"queues = {_array(queues)}\nactions = {_array(actions)}\n"
    )
