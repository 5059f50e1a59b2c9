"""SQS access keys on the grants of ``--auth-file`` (docs/security.md): boto3 against a real mq.

A key granted ``send`` on ``orders-*`` sends there, and gets SQS's AccessDenied (HTTP 403) on
another queue and for a receive; a wrong secret is SignatureDoesNotMatch; SIGHUP reloads keys;
a file holding secrets that others can read stops mq at start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError

from tests.conftest import Daemon, Daemons

KEYS = {
    "AKIDADMIN": ("sqs-admin", "admin-secret-0123456789", ["*"], ["send", "receive", "admin"]),
    "AKIDSENDER": ("orders-sender", "sender-secret-0123456789", ["orders-*"], ["send"]),
    "AKIDWORKER": ("orders-worker", "worker-secret-0123456789", ["orders-*"], ["receive"]),
}


def _auth_text(keys: dict[str, tuple[str, str, list[str], list[str]]]) -> str:
    return "".join(
        f'[[access_keys]]\nname = "{name}"\naccess_key = "{key}"\nsecret_key = "{secret}"\n'
        f"queues = {json.dumps(queues)}\nactions = {json.dumps(actions)}\n\n"
        for key, (name, secret, queues, actions) in keys.items()
    )


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    base = tmp_path_factory.mktemp("auth-sqs")
    auth = base / "auth.toml"
    _write(auth, _auth_text(KEYS))
    started = Daemons()
    try:
        yield started.start("mq", "--root", base / "root", "--port", "0", "--auth-file", auth), auth
    finally:
        started.stop_all()


def sqs(mq: Daemon, key: str, secret: str | None = None) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=mq.url,
        region_name="eu-west-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret if secret is not None else KEYS[key][1],
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def _refused(call: Any, code: str, **kwargs: Any) -> None:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    assert info.value.response["Error"]["Code"] == code, info.value.response
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_an_access_key_has_the_grants_of_its_entry(secured: tuple[Daemon, Path]) -> None:
    mq, _ = secured
    admin, sender, worker = sqs(mq, "AKIDADMIN"), sqs(mq, "AKIDSENDER"), sqs(mq, "AKIDWORKER")
    orders = admin.create_queue(QueueName="orders-eu")["QueueUrl"]
    billing = admin.create_queue(QueueName="billing")["QueueUrl"]

    assert sender.get_queue_url(QueueName="orders-eu")["QueueUrl"] == orders
    sender.send_message(QueueUrl=orders, MessageBody="order 1")
    sender.send_message_batch(QueueUrl=orders, Entries=[{"Id": "a", "MessageBody": "order 2"}])
    _refused(sender.send_message, "AccessDenied", QueueUrl=billing, MessageBody="x")
    _refused(sender.get_queue_url, "AccessDenied", QueueName="billing")
    _refused(sender.receive_message, "AccessDenied", QueueUrl=orders)
    _refused(sender.purge_queue, "AccessDenied", QueueUrl=orders)
    _refused(sender.create_queue, "AccessDenied", QueueName="orders-new")
    assert sender.list_queues()["QueueUrls"] == [orders]  # only the queues its patterns match

    received = worker.receive_message(QueueUrl=orders, MaxNumberOfMessages=10, WaitTimeSeconds=5)["Messages"]
    assert {m["Body"] for m in received} <= {"order 1", "order 2"} and received
    for message in received:
        worker.delete_message(QueueUrl=orders, ReceiptHandle=message["ReceiptHandle"])
    _refused(worker.send_message, "AccessDenied", QueueUrl=orders, MessageBody="x")
    _refused(worker.receive_message, "AccessDenied", QueueUrl=billing)
    assert admin.get_queue_attributes(QueueUrl=billing, AttributeNames=["All"])["Attributes"]


def test_a_wrong_secret_an_unknown_key_and_no_signature_are_refused(secured: tuple[Daemon, Path]) -> None:
    mq, _ = secured
    _refused(sqs(mq, "AKIDSENDER", "not-the-secret-0000").list_queues, "SignatureDoesNotMatch")
    _refused(sqs(mq, "AKIDNOBODY", "whatever-secret-0000").list_queues, "InvalidClientTokenId")
    unsigned = urllib.request.Request(
        mq.url + "/", data=b"{}", method="POST", headers={"X-Amz-Target": "AmazonSQS.ListQueues"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(unsigned, timeout=10)
    assert info.value.code == 403
    assert json.loads(info.value.read())["__type"] == "com.amazonaws.sqs#InvalidClientTokenId"
    assert "sender-secret" not in mq.log and "not-the-secret" not in mq.log


def test_sighup_reloads_the_access_keys(secured: tuple[Daemon, Path]) -> None:
    mq, auth = secured
    original = auth.read_text()
    sender = sqs(mq, "AKIDSENDER")
    url = sqs(mq, "AKIDADMIN").create_queue(QueueName="orders-reload")["QueueUrl"]
    _refused(sender.receive_message, "AccessDenied", QueueUrl=url)
    changed = dict(KEYS)
    changed["AKIDSENDER"] = ("orders-sender", KEYS["AKIDSENDER"][1], ["orders-*"], ["send", "receive"])
    del changed["AKIDWORKER"]
    made = subprocess.run(
        [sys.executable, "-m", "mqcore.ctl", "auth", "key", "--name", "new", "--queue", "orders-*", "--action", "send"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    new = tomllib.loads(made.stdout)["access_keys"][0]
    try:
        _write(auth, _auth_text(changed) + made.stdout)
        reloads = mq.log.count("auth file reloaded")
        os.kill(mq.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while mq.log.count("auth file reloaded") == reloads:
            assert time.monotonic() < deadline, mq.log_tail()
            time.sleep(0.02)
        assert sender.receive_message(QueueUrl=url).get("Messages", []) == []
        _refused(sqs(mq, "AKIDWORKER").receive_message, "InvalidClientTokenId", QueueUrl=url)
        sqs(mq, new["access_key"], new["secret_key"]).send_message(QueueUrl=url, MessageBody="from a new key")
    finally:
        _write(auth, original)
        os.kill(mq.pid, signal.SIGHUP)


def test_a_file_with_secrets_others_can_read_stops_mq(daemons: Daemons, tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text(_auth_text(KEYS))
    auth.chmod(0o644)
    mq = daemons.spawn("mq", "--root", tmp_path / "root", "--port", "0", "--auth-file", auth)
    assert mq.proc.wait(timeout=30) == 78
    assert "chmod 0600" in mq.log and "admin-secret" not in mq.log
