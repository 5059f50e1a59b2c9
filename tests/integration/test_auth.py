"""Bearer tokens on a real mq (``--auth-file``): 401/403 as JSON, grants by queue glob and action,
SIGHUP reload on a kept-alive connection, the clients and mqctl with a token, no token in the log,
and the refusal to listen openly without authentication (docs/security.md)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqcore.auth import hash_token
from mqcore.client import Client, Worker
from mqcore.errors import Forbidden, QueueNotFound, Unauthorized
from tests.conftest import REPO, Daemon, Daemons

#: Cheap scrypt for the tests (the file format allows any cost; production entries use n=16384).
FAST = {"n": 1024, "r": 8, "p": 1}
TOKENS = {"admin": "admin-token-0123456789", "producer": "producer-token-abc", "consumer": "consumer-token-xyz"}


def _entry(name: str, queues: list[str], actions: list[str]) -> str:
    return (
        f'[[tokens]]\nname = "{name}"\nhash = "{hash_token(TOKENS[name], **FAST)}"\n'
        f"queues = {json.dumps(queues)}\nactions = {json.dumps(actions)}\n\n"
    )


def _write_auth(path: Path, *entries: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(entries))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    """One mq with an auth file: admin (all on *), producer (send on orders-*), consumer (receive on orders-*)."""
    base = tmp_path_factory.mktemp("auth")
    auth = base / "auth.toml"
    _write_auth(
        auth,
        _entry("admin", ["*"], ["send", "receive", "admin"]),
        _entry("producer", ["orders-*"], ["send"]),
        _entry("consumer", ["orders-*"], ["receive"]),
    )
    started = Daemons()
    try:
        mq = started.start("mq", "--root", str(base / "root"), "--port", "0", "--auth-file", str(auth))
        yield mq, auth
    finally:
        started.stop_all()


def _request(url: str, method: str, path: str, token: str | None = None, body: bytes | None = None):
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), data


def test_no_token_and_bad_token_get_401_with_a_challenge(secured: tuple[Daemon, Path]) -> None:
    mq, _ = secured
    for path in ("/", "/orders-1/messages", "/no/such/route/at/all"):
        status, headers, body = _request(mq.url, "GET", path)
        assert status == 401, (path, body)
        assert headers["WWW-Authenticate"] == 'Bearer realm="mq"'
        assert json.loads(body)["error"] == "unauthorized"
    status, headers, body = _request(mq.url, "GET", "/", token="not-a-token")
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Bearer realm="mq", error="invalid_token"'
    assert json.loads(body)["error"] == "unauthorized"
    status, _, _ = _request(mq.url, "GET", "/", token="x" * 600)  # over MAX_TOKEN_CHARS: refused unhashed
    assert status == 401


def test_grants_follow_queue_globs_and_actions(secured: tuple[Daemon, Path]) -> None:
    mq, _ = secured
    admin, producer, consumer = TOKENS["admin"], TOKENS["producer"], TOKENS["consumer"]
    for queue in ("orders-eu", "billing"):
        assert _request(mq.url, "PUT", f"/{queue}", admin)[0] == 201
    status, headers, body = _request(mq.url, "PUT", "/orders-us", producer)
    assert status == 403
    error = json.loads(body)
    assert error["error"] == "forbidden"
    assert error["details"] == {"action": "admin", "queue": "orders-us"}
    assert 'error="insufficient_scope"' in headers["WWW-Authenticate"]

    assert _request(mq.url, "POST", "/orders-eu/messages", producer, b"hello")[0] == 201
    assert _request(mq.url, "POST", "/billing/messages", producer, b"nope")[0] == 403
    assert _request(mq.url, "GET", "/orders-eu/messages", producer)[0] == 403
    assert _request(mq.url, "GET", "/orders-eu/peek", producer)[0] == 403
    status, headers, body = _request(mq.url, "GET", "/orders-eu/messages", consumer)
    assert (status, body) == (200, b"hello")
    assert _request(mq.url, "DELETE", f"/orders-eu/messages/{headers['X-Message-Id']}", consumer)[0] == 200
    assert _request(mq.url, "POST", "/orders-eu/messages", consumer, b"x")[0] == 403
    assert _request(mq.url, "POST", "/orders-eu/purge", consumer)[0] == 403
    # Counts and attributes: any action on the queue; listing: only the queues the token matches.
    assert _request(mq.url, "GET", "/orders-eu", producer)[0] == 200
    assert _request(mq.url, "GET", "/billing/attributes", producer)[0] == 403
    assert json.loads(_request(mq.url, "GET", "/", producer)[2])["queues"] == ["orders-eu"]
    assert json.loads(_request(mq.url, "GET", "/", admin)[2])["queues"] == ["billing", "orders-eu"]
    # A redrive to an explicit destination also needs send there.
    status, _, body = _request(mq.url, "POST", "/billing/redrive", admin, b'{"destination": "orders-eu"}')
    assert status != 403, body
    assert _request(mq.url, "POST", "/billing/purge", admin)[0] == 200


def test_the_clients_and_mqctl_send_the_token(secured: tuple[Daemon, Path]) -> None:
    mq, _ = secured
    with Client(mq.url, token=TOKENS["admin"], max_retries=0) as client:
        client.create_queue("orders-client")
    with Client(mq.url, max_retries=0) as client, pytest.raises(Unauthorized):
        client.list_queues()
    with Client(mq.url, token=TOKENS["producer"], max_retries=0) as client:
        client.send("orders-client", b"one")
        with pytest.raises(Forbidden):
            client.purge("orders-client")
        with pytest.raises(QueueNotFound):
            client.send("orders-missing", b"x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env.update(MQ_URL=mq.url, MQ_TOKEN=TOKENS["consumer"])
    ctl = [sys.executable, "-m", "mqcore.ctl"]
    done = subprocess.run([*ctl, "queues", "list"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "orders-client" in done.stdout.split()
    env.pop("MQ_TOKEN")
    done = subprocess.run(
        [*ctl, "--token", "wrong", "queues", "list"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "not valid" in done.stderr


def test_worker_and_the_spark_options_take_the_token(secured: tuple[Daemon, Path]) -> None:
    from mqcore.spark._options import parse  # no pyspark needed: only the option parsing

    mq, _ = secured
    with Client(mq.url, token=TOKENS["admin"], max_retries=0) as client:
        client.create_queue("orders-worker")
        client.send("orders-worker", b"job")
    seen: list[bytes] = []
    worker = Worker(
        "orders-worker", lambda m: seen.append(m.body), client=mq.url, token=TOKENS["consumer"],
        wait_time_seconds=0, install_signal_handlers=False,
    )  # fmt: skip
    assert worker.run(until_empty=True).acked == 1
    assert seen == [b"job"]
    options = parse({"url": mq.url, "queue": "orders-worker", "token": TOKENS["consumer"]}, "read")
    assert TOKENS["consumer"] not in repr(options)
    with options.connect() as client:
        assert "orders-worker" in client.list_queues()
    with parse({"url": mq.url, "queue": "orders-worker"}, "read").connect() as client, pytest.raises(Unauthorized):
        client.list_queues()


def test_sighup_reloads_the_file_without_dropping_a_kept_alive_connection(
    secured: tuple[Daemon, Path],
) -> None:
    mq, auth = secured
    conn = http.client.HTTPConnection(mq.url.removeprefix("http://"), timeout=10)

    def get(token: str) -> int:
        conn.request("GET", "/", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status

    try:
        assert get(TOKENS["producer"]) == 200
        sock = conn.sock
        original = auth.read_text()
        # Rotate: the producer's entry goes, an entry for a new token comes.
        TOKENS["rotated"] = "rotated-token-000"
        _write_auth(auth, original.split('[[tokens]]\nname = "producer"')[0], _entry("rotated", ["*"], ["send"]))
        os.kill(mq.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "auth file reloaded" not in mq.log:
            assert time.monotonic() < deadline, mq.log_tail()
            time.sleep(0.02)
        assert get(TOKENS["producer"]) == 401
        assert get(TOKENS["rotated"]) == 200
        assert conn.sock is sock, "the connection was dropped"
        # A broken file is refused; the tokens in force stay.
        auth.write_text("[[tokens]]\nname = 1\n")
        os.kill(mq.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "auth file not reloaded" not in mq.log:
            assert time.monotonic() < deadline, mq.log_tail()
            time.sleep(0.02)
        assert get(TOKENS["rotated"]) == 200
        assert mq.running
    finally:
        conn.close()
        _write_auth(auth, original)
        os.kill(mq.pid, signal.SIGHUP)


def test_no_token_is_ever_logged(secured: tuple[Daemon, Path]) -> None:
    mq, _ = secured
    _request(mq.url, "GET", "/", token="secret-guess-that-must-not-be-logged")
    _request(mq.url, "PUT", "/orders-logged", TOKENS["producer"])  # a 403 names the entry, not the token
    logged = time.monotonic() + 10
    while "forbidden token=producer" not in mq.log and time.monotonic() < logged:  # stderr is read by a thread
        time.sleep(0.05)
    log = mq.log
    assert "forbidden token=producer" in log
    assert "secret-guess-that-must-not-be-logged" not in log
    for token in TOKENS.values():
        assert token not in log


def test_without_auth_file_a_non_loopback_address_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    done = subprocess.run(
        [sys.executable, "-m", "daemons.front", "--root", str(tmp_path), "--address", "0.0.0.0", "--port", "0"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 78, done.stderr
    assert "not loopback" in done.stderr and "--auth-file" in done.stderr


def test_without_auth_file_loopback_is_said_at_start(daemons: Daemons, tmp_path: Path) -> None:
    mq = daemons.start("mq", "--root", tmp_path / "root", "--address", "127.0.0.2", "--port", "0")
    assert "auth: none (no --auth-file): listening on loopback 127.0.0.2 only" in mq.log
    os.kill(mq.pid, signal.SIGHUP)  # systemctl reload: nothing to reload, and mq goes on
    deadline = time.monotonic() + 10
    while "nothing to reload" not in mq.log:
        assert time.monotonic() < deadline and mq.running, mq.log_tail()
        time.sleep(0.02)
    assert _request(mq.url, "GET", "/")[0] == 200
