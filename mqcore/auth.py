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
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from mqcore.errors import ConfigError

#: The actions a token may be granted.
ACTIONS = ("send", "receive", "admin")
#: Any action on the queue (what reading a queue's counts and attributes needs).
ANY_ACTION = "any_action"

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
    """Read and check the auth file at ``path``.

    Raises:
        ConfigError: Unreadable, not TOML, or an entry without a name, a valid hash,
            a non-empty list of queue patterns and of actions (each one of ACTIONS),
            an unknown key, or two entries with the same name.
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"auth file {path}: {exc.strerror}", path=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"auth file {path} is not valid TOML: {exc}", path=path) from exc
    if set(data) - {"tokens"}:
        raise ConfigError(f"auth file {path}: unknown key(s) {sorted(set(data) - {'tokens'})}; only [[tokens]]")
    tokens = data.get("tokens", [])
    if not isinstance(tokens, list):
        raise ConfigError(f"auth file {path}: tokens must be an array of tables [[tokens]]")
    entries: list[Entry] = []
    names: set[str] = set()
    for i, item in enumerate(tokens):
        where = f"auth file {path}: tokens[{i}]"
        if not isinstance(item, dict) or set(item) - {"name", "hash", "queues", "actions"}:
            raise ConfigError(f"{where} must have only name, hash, queues and actions")
        name = item.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise ConfigError(f"{where}.name must be a non-empty string, unique in the file")
        names.add(name)
        queues, actions = item.get("queues"), item.get("actions")
        if not isinstance(queues, list) or not queues or not all(isinstance(q, str) and q for q in queues):
            raise ConfigError(f'{where}.queues must be a non-empty list of glob patterns, e.g. ["orders-*"]')
        if not isinstance(actions, list) or not actions or not all(a in ACTIONS for a in actions):
            raise ConfigError(f"{where}.actions must be a non-empty list of {', '.join(ACTIONS)}")
        n, r, p, salt, key = _parse_hash(item.get("hash"), where)
        entries.append(Entry(Grant(name, tuple(queues), frozenset(actions)), n, r, p, salt, key))
    return entries


def verify(entries: Iterable[Entry], token: bytes) -> Grant | None:
    """Check ``token`` against every entry (no early exit, so the time does not tell which matched)."""
    found = None
    for entry in entries:
        if entry.check(token) and found is None:
            found = entry.grant
    return found


def entry_toml(name: str, token: str, queues: list[str], actions: list[str]) -> str:
    """An auth file entry (TOML text) for ``token``, hashed."""

    def array(items: list[str]) -> str:
        return "[" + ", ".join(f'"{i}"' for i in items) + "]"

    return (
        f'[[tokens]]\nname = "{name}"\nhash = "{hash_token(token)}"\n'
        f"queues = {array(queues)}\nactions = {array(actions)}\n"
    )
