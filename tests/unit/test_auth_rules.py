"""The auth rules without a server: every served route is classified, globs and actions, the file's checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemons import _auth, _listen
from daemons._broker import Broker
from daemons._settings import Settings
from daemons._sqs import ACTIONS as SQS_HANDLERS
from daemons.front import make_app
from mqcore.auth import ACTIONS, ANY_ACTION, LIST, SQS_ACTIONS, Grant, hash_token, load_auth, load_auth_file, verify
from mqcore.errors import ConfigError


def test_every_served_route_is_classified(tmp_path: Path) -> None:
    app = make_app(Broker(Settings(root=str(tmp_path))))
    for route in app.router.routes():
        canonical = route.resource.canonical if route.resource is not None else ""
        needed = _auth.requirement(route.method, canonical)  # KeyError = a route the auth table forgot
        assert needed in {_auth.OPEN, _auth.ANY_TOKEN, _auth.SQS, ANY_ACTION, *ACTIONS}, (route.method, canonical)


def test_grant_globs_and_actions() -> None:
    grant = Grant("p", ("orders-*", "audit"), frozenset({"send"}))
    assert grant.allows("send", "orders-eu") and grant.allows("send", "audit")
    assert not grant.allows("send", "Orders-eu")  # case-sensitive, as queue names
    assert not grant.allows("send", "auditx") and not grant.allows("receive", "orders-eu")
    assert grant.allows(ANY_ACTION, "orders-1") and not grant.allows(ANY_ACTION, "billing")
    assert not grant.allows("send", None)  # every queue needs the pattern *
    assert Grant("a", ("*",), frozenset({"admin"})).allows("admin", None)


def test_hash_and_verify(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(
        f'[[tokens]]\nname = "a"\nhash = "{hash_token("s3cret", n=1024)}"\nqueues = ["*"]\nactions = ["send"]\n'
    )
    entries = load_auth_file(str(path))
    assert verify(entries, b"s3cret") == Grant("a", ("*",), frozenset({"send"}))
    assert verify(entries, b"s3cres") is None
    assert verify(entries, b"") is None
    assert hash_token("same", n=1024) != hash_token("same", n=1024)  # salted


@pytest.mark.parametrize(
    "text",
    [
        "tokens = 1",
        "[[tokens]]\nname = 'a'\nhash = 'plain'\nqueues = ['*']\nactions = ['send']",
        "[[tokens]]\nname = 'a'\nhash = 'scrypt$3$8$1$AAAA$AAAA'\nqueues = ['*']\nactions = ['send']",
        "[[tokens]]\nname = 'a'\nqueues = ['*']\nactions = ['fly']",
        "[[tokens]]\nname = 'a'\nqueues = []\nactions = ['send']",
        "[[tokens]]\nname = 'a'\nqueues = ['*']\nactions = ['send']\nextra = 1",
        "[[tokens]]\nqueues = ['*']\nactions = ['send']",
        "other = 1",
        "not toml [",
    ],
)
def test_a_bad_auth_file_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_auth_file(str(path))


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    entry = f'[[tokens]]\nname = "a"\nhash = "{hash_token("t", n=1024)}"\nqueues = ["*"]\nactions = ["send"]\n'
    path = tmp_path / "auth.toml"
    path.write_text(entry + entry)
    with pytest.raises(ConfigError, match="unique"):
        load_auth_file(str(path))


def test_every_sqs_action_is_classified() -> None:
    assert set(SQS_HANDLERS) <= set(SQS_ACTIONS), set(SQS_HANDLERS) - set(SQS_ACTIONS)
    assert set(SQS_ACTIONS.values()) <= {*ACTIONS, ANY_ACTION, LIST}


KEY = (
    "[[access_keys]]\nname = 'k'\naccess_key = 'AKIDK'\nsecret_key = 'sixteen-chars-ok'\n"
    "queues = ['q-*']\nactions = ['send']\n"
)


def test_access_keys_carry_grants_and_need_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(KEY)
    path.chmod(0o640)
    key = load_auth(str(path)).access_keys["AKIDK"]
    assert key.grant == Grant("k", ("q-*",), frozenset({"send"})) and key.secret_key == "sixteen-chars-ok"
    assert "sixteen" not in repr(key)  # never printed by accident
    for mode in (0o644, 0o604, 0o660):
        path.chmod(mode)
        with pytest.raises(ConfigError, match="chmod 0600"):
            load_auth(str(path))
    path.write_text(f'[[tokens]]\nname = "t"\nhash = "{hash_token("t", n=1024)}"\nqueues = ["*"]\nactions = ["send"]\n')
    path.chmod(0o644)  # hashes only: readable as before
    assert len(load_auth(str(path)).entries) == 1


@pytest.mark.parametrize(
    "text",
    [
        KEY.replace("'AKIDK'", "'AK/ID'"),
        KEY.replace("'sixteen-chars-ok'", "'short'"),
        KEY + KEY.replace("name = 'k'", "name = 'k2'"),  # the same key id twice
        KEY + KEY,  # the same name twice
        KEY.replace("access_key = 'AKIDK'\n", ""),
        KEY + "hash = 'x'\n",
        "access_keys = 1",
    ],
)
def test_a_bad_access_key_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError):
        load_auth(str(path))


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("10.1.2.3", False), ("", False)],
)  # fmt: skip
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert _listen.is_loopback(address) is loopback


def test_exposure_needs_auth_or_insecure_listen_off_loopback() -> None:
    assert "loopback" in _listen.check_exposure("127.0.0.1", auth=False, insecure_listen=False)
    assert "tokens required" in _listen.check_exposure("0.0.0.0", auth=True, insecure_listen=False)
    assert "--insecure-listen" in _listen.check_exposure("0.0.0.0", auth=False, insecure_listen=True)
    with pytest.raises(ConfigError, match="not loopback"):
        _listen.check_exposure("0.0.0.0", auth=False, insecure_listen=False)
