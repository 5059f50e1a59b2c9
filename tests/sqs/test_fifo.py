"""SQS FIFO queues with boto3 against a live stack (docs/sqs.md "FIFO queues", docs/protocol.md 19).

One stack serves the module (each test has queues of its own); the restart test starts its own
mq on a root of its own. Order, group blocking and deduplication are checked as a boto3 user sees
them: message ids, bodies, SequenceNumbers and the system attributes of received messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError

from mqcore.client import AsyncClient, AsyncLocalClient, Client, LocalClient
from mqcore.client.types import BatchEntry
from mqcore.errors import InvalidRequest

FIFO = {"FifoQueue": "true"}


def client(url: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
        config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=60),
    )


@pytest.fixture(scope="module")
def stack(module_daemons: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return module_daemons.stack(tmp_path_factory.mktemp("sqs-fifo") / "root")


@pytest.fixture(scope="module")
def sqs(stack: Any) -> Any:
    return client(stack.url)


def new_fifo(sqs: Any, **attributes: str) -> str:
    return sqs.create_queue(QueueName=f"f-{uuid.uuid4().hex[:12]}.fifo", Attributes={**FIFO, **attributes})["QueueUrl"]


def error_code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def receive(sqs: Any, url: str, n: int = 1, wait: int = 0, **kw: Any) -> list[dict[str, Any]]:
    reply = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=n, WaitTimeSeconds=wait, MessageSystemAttributeNames=["All"], **kw
    )
    return reply.get("Messages", [])


def receive_until(sqs: Any, url: str, timeout: float = 20.0, **kw: Any) -> list[dict[str, Any]]:
    """Receive until something comes (a message made ready again reaches mq's index by inotify)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = receive(sqs, url, wait=1, **kw)
        if got:
            return got
    raise AssertionError("nothing received in time")


def test_create_fifo_queue_and_its_attributes(sqs: Any) -> None:
    name = f"jobs-{uuid.uuid4().hex[:8]}.fifo"
    url = sqs.create_queue(QueueName=name, Attributes={**FIFO, "ContentBasedDeduplication": "true"})["QueueUrl"]
    assert url.endswith(f"/000000000000/{name}")
    again = sqs.create_queue(QueueName=name, Attributes={**FIFO, "ContentBasedDeduplication": "true"})
    assert again["QueueUrl"] == url  # idempotent with the same attributes
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=name, Attributes={**FIFO, "ContentBasedDeduplication": "false"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["FifoQueue"] == "true" and attrs["ContentBasedDeduplication"] == "true"
    assert attrs["DeduplicationScope"] == "messageQueue" and attrs["FifoThroughputLimit"] == "perQueue"
    assert attrs["QueueArn"].endswith(f":{name}")
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=name[:-3])["QueueUrls"]  # a prefix may end inside ".fifo"

    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ContentBasedDeduplication": "false"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ContentBasedDeduplication"])["Attributes"]
    assert attrs == {"ContentBasedDeduplication": "false"}
    with pytest.raises(ClientError) as info:  # set only at creation
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "false"})
    assert error_code(info.value) == "InvalidAttributeName"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "5"})  # a queue delay, as SQS
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds"])["Attributes"]["DelaySeconds"] == "5"

    for bad_name, attributes in (
        (f"plain-{uuid.uuid4().hex[:8]}", FIFO),  # FifoQueue=true needs a .fifo name
        (f"x-{uuid.uuid4().hex[:8]}.fifo", {}),  # a .fifo name needs FifoQueue=true
        ("a" * 76 + ".fifo", FIFO),  # 81 characters
        ("a.b.fifo", FIFO),
    ):
        with pytest.raises(ClientError) as info:
            sqs.create_queue(QueueName=bad_name, Attributes=attributes)
        assert error_code(info.value) == "InvalidParameterValue", bad_name
    assert sqs.create_queue(QueueName="a" * 75 + ".fifo", Attributes=FIFO)["QueueUrl"].endswith("a.fifo")

    standard = sqs.create_queue(QueueName=f"std-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=["All"])["Attributes"]
    assert "FifoQueue" not in attrs
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=standard, Attributes={"ContentBasedDeduplication": "true"})
    assert error_code(info.value) == "InvalidAttributeValue"
    for extra in ({"MessageGroupId": "g"}, {"MessageDeduplicationId": "d"}):
        with pytest.raises(ClientError) as info:
            sqs.send_message(QueueUrl=standard, MessageBody="x", **extra)
        assert error_code(info.value) == "InvalidParameterValue"


def test_send_errors_on_a_fifo_queue(sqs: Any) -> None:
    url = new_fifo(sqs)
    with pytest.raises(sqs.exceptions.ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert error_code(info.value) == "MissingParameter"  # MessageGroupId is required
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d", DelaySeconds=5)
    assert error_code(info.value) == "InvalidParameterValue"  # no per-message delay on FIFO queues
    with pytest.raises(ClientError) as info:  # no deduplication id, and no content-based deduplication
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert error_code(info.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="a b")
    assert error_code(info.value) == "InvalidParameterValue"  # ids are printable ASCII without spaces
    reply = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "1"},
            {"Id": "nogroup", "MessageBody": "y", "MessageDeduplicationId": "2"},
            {
                "Id": "delay",
                "MessageBody": "z",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "3",
                "DelaySeconds": 1,
            },
        ],
    )
    assert [e["Id"] for e in reply["Successful"]] == ["ok"]
    assert {e["Id"]: e["Code"] for e in reply["Failed"]} == {
        "nogroup": "MissingParameter",
        "delay": "InvalidParameterValue",
    }
    assert [m["Body"] for m in receive(sqs, url, 10)] == ["x"]


def test_groups_in_order_a_group_in_flight_blocks_only_itself(sqs: Any) -> None:
    url = new_fifo(sqs, ContentBasedDeduplication="true")
    sent = []
    for body, group in (("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B"), ("a3", "A")):
        reply = sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
        sent.append(int(reply["SequenceNumber"]))
    assert sent == sorted(sent) and len(set(sent)) == 5  # SequenceNumber increases per queue
    assert all(len(str(n)) <= 39 for n in sent)  # a 128-bit number

    first = receive(sqs, url)
    assert [m["Body"] for m in first] == ["a1"]
    attributes = first[0]["Attributes"]
    assert attributes["MessageGroupId"] == "A"
    assert attributes["MessageDeduplicationId"] == hashlib.sha256(b"a1").hexdigest()
    assert int(attributes["SequenceNumber"]) == sent[0]
    assert [m["Body"] for m in receive(sqs, url)] == ["b1"]  # A is in flight: B flows
    assert receive(sqs, url, 10) == []  # both groups are in flight

    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    second = receive(sqs, url, 10)
    assert [m["Body"] for m in second] == ["a2", "a3"]  # A's next ones, in order; B still blocked
    for message in second:  # end the leases: A's messages come back first, in order
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    again = receive_until(sqs, url, n=10)
    assert [m["Body"] for m in again][:1] == ["a2"]
    assert [m["Body"] for m in again] in (["a2"], ["a2", "a3"])  # a3 may not be indexed yet: never before a2


@pytest.mark.parametrize("deleter", ["mq", "another process"])
def test_a_delete_that_frees_a_group_wakes_a_long_poll(stack: Any, sqs: Any, deleter: str) -> None:
    url = new_fifo(sqs, ContentBasedDeduplication="true")
    for body in ("first", "second"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
    first = receive(sqs, url)
    got: list[list[dict[str, Any]]] = []
    poll = threading.Thread(target=lambda: got.append(receive(client(sqs.meta.endpoint_url), url, wait=20)))
    started = time.monotonic()
    poll.start()
    time.sleep(0.5)  # the poll is waiting: "second" is blocked behind "first"
    if deleter == "mq":
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    else:
        with LocalClient(stack.root) as local:  # this process, not mq: mq sees only delay/ change
            local.delete(url.rsplit("/", 1)[1], first[0]["ReceiptHandle"])
    poll.join()
    assert [m["Body"] for m in got[0]] == ["second"]
    assert time.monotonic() - started < 15, "the long poll waited for its whole WaitTimeSeconds"


def test_queue_delay_of_a_fifo_queue_holds_each_message_and_a_change_holds_for_sent_ones(sqs: Any) -> None:
    url = new_fifo(sqs, ContentBasedDeduplication="true", DelaySeconds="2")
    started = time.monotonic()
    for body, group in (("a1", "a"), ("b1", "b")):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
    assert receive(sqs, url, 10) == []  # neither is 2 s old
    got: list[dict[str, Any]] = []
    while len(got) < 2 and time.monotonic() - started < 15:
        got += receive(sqs, url, 10, wait=10)  # a waiting poll is woken when the delay ends
    assert [m["Body"] for m in got] == ["a1", "b1"]
    assert 1.9 <= time.monotonic() - started < 10
    for message in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    # SQS: a FIFO queue's delay is retroactive. A message sent under 600 s goes as soon as it is 0.
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "600"})
    sqs.send_message(QueueUrl=url, MessageBody="a2", MessageGroupId="a")
    assert receive(sqs, url, 10, wait=1) == []
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0"})
    assert [m["Body"] for m in receive(sqs, url, 10)] == ["a2"]
    with pytest.raises(ClientError) as info:  # a message's own delay stays refused (SQS)
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="a", DelaySeconds=5)
    assert error_code(info.value) == "InvalidParameterValue"


def test_high_throughput_settings_and_deduplication_per_message_group(stack: Any, sqs: Any) -> None:
    high = {"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    url = new_fifo(sqs, **high)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: attrs[k] for k in high} == high
    with urllib.request.urlopen(f"{stack.url}/{url.rsplit('/', 1)[1]}/attributes", timeout=10) as reply:
        native = json.load(reply)["attributes"]
    assert (native["deduplication_scope"], native["fifo_throughput_limit"]) == ("message_group", "per_message_group_id")

    def send(body: str, group: str, dedup: str) -> str:
        reply = sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=dedup)
        return str(reply["MessageId"])

    a, b = send("x", "a", "d1"), send("y", "b", "d1")  # one deduplication id, two groups: two messages
    assert a != b and send("x again", "a", "d1") == a  # within group a: a duplicate
    assert [m["Body"] for m in receive(sqs, url, 10)] == ["x", "y"]

    # perMessageGroupId needs the messageGroup scope (SQS): refused alone, accepted with perQueue.
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"DeduplicationScope": "messageQueue"})
    assert error_code(info.value) == "InvalidAttributeValue"
    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"DeduplicationScope": "messageQueue", "FifoThroughputLimit": "perQueue"}
    )
    c = send("z", "c", "d2")
    assert send("z", "d", "d2") == c  # back to one scope for the queue
    for bad in ({"DeduplicationScope": "queue"}, {"FifoThroughputLimit": "perGroup"}):
        with pytest.raises(ClientError) as info:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=bad)
        assert error_code(info.value) == "InvalidAttributeValue", bad
    with pytest.raises(ClientError) as info:
        new_fifo(sqs, FifoThroughputLimit="perMessageGroupId")
    assert error_code(info.value) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as info:  # FIFO queues only
        sqs.create_queue(QueueName=f"std-{uuid.uuid4().hex[:8]}", Attributes={"DeduplicationScope": "messageGroup"})
    assert error_code(info.value) == "InvalidAttributeValue"


def test_many_groups_in_one_receive_each_in_order(sqs: Any) -> None:
    url = new_fifo(sqs)
    entries = [
        {
            "Id": f"e{i}",
            "MessageBody": f"{'xyz'[i % 3]}{i}",
            "MessageGroupId": "xyz"[i % 3],
            "MessageDeduplicationId": str(i),
        }
        for i in range(9)
    ]
    reply = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert len(reply["Successful"]) == 9
    numbers = [int(e["SequenceNumber"]) for e in reply["Successful"]]
    assert numbers == sorted(numbers)
    got = receive(sqs, url, 10)
    assert [m["Body"] for m in got] == [e["MessageBody"] for e in entries]
    assert [m["Attributes"]["MessageGroupId"] for m in got] == ["x", "y", "z"] * 3


def test_deduplication_by_id_and_by_content(sqs: Any) -> None:
    url = new_fifo(sqs)
    one = sqs.send_message(QueueUrl=url, MessageBody="pay 10", MessageGroupId="g", MessageDeduplicationId="order-1")
    two = sqs.send_message(QueueUrl=url, MessageBody="pay 10", MessageGroupId="g", MessageDeduplicationId="order-1")
    assert two["MessageId"] == one["MessageId"] and two["SequenceNumber"] == one["SequenceNumber"]
    other = sqs.send_message(QueueUrl=url, MessageBody="pay 10", MessageGroupId="g", MessageDeduplicationId="order-2")
    assert other["MessageId"] != one["MessageId"]
    got = receive(sqs, url, 10)
    assert [m["MessageId"] for m in got] == [one["MessageId"], other["MessageId"]]
    for message in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    # Still a duplicate after the first was received and deleted: the window is 5 minutes from the send.
    late = sqs.send_message(QueueUrl=url, MessageBody="pay 10", MessageGroupId="g", MessageDeduplicationId="order-1")
    assert late["MessageId"] == one["MessageId"]
    assert receive(sqs, url, 10) == []

    content = new_fifo(sqs, ContentBasedDeduplication="true")
    a = sqs.send_message(QueueUrl=content, MessageBody="same", MessageGroupId="g")
    b = sqs.send_message(QueueUrl=content, MessageBody="same", MessageGroupId="h")  # the group does not matter
    c = sqs.send_message(QueueUrl=content, MessageBody="different", MessageGroupId="g")
    d = sqs.send_message(QueueUrl=content, MessageBody="same", MessageGroupId="g", MessageDeduplicationId="own")
    assert a["MessageId"] == b["MessageId"] != c["MessageId"] != d["MessageId"]
    batch = sqs.send_message_batch(
        QueueUrl=content, Entries=[{"Id": "1", "MessageBody": "same", "MessageGroupId": "g"}]
    )
    assert batch["Successful"][0]["MessageId"] == a["MessageId"]
    assert [m["Body"] for m in receive(sqs, content, 10)] == ["same", "different", "same"]


def test_receive_request_attempt_id_returns_the_same_messages(sqs: Any) -> None:
    url = new_fifo(sqs, ContentBasedDeduplication="true")
    for body in ("m1", "m2"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
    first = receive(sqs, url, 10, ReceiveRequestAttemptId="attempt-1")
    again = receive(sqs, url, 10, ReceiveRequestAttemptId="attempt-1")  # a retry after a lost answer
    assert [m["Body"] for m in first] == ["m1", "m2"]
    assert [m["MessageId"] for m in again] == [m["MessageId"] for m in first]
    assert [m["Attributes"]["MessageGroupId"] for m in again] == ["g", "g"]
    assert [m["Attributes"]["SequenceNumber"] for m in again] == [m["Attributes"]["SequenceNumber"] for m in first]


def test_deduplication_holds_across_a_restart_of_mq(daemons: Any, tmp_path: Path) -> None:
    stack = daemons.stack(tmp_path / "root", mover=False, reaper=False)
    before = client(stack.url)
    url = new_fifo(before)
    queue = url.rsplit("/", 1)[1]
    first = before.send_message(QueueUrl=url, MessageBody="once", MessageGroupId="g", MessageDeduplicationId="k")
    stack.mq.restart()
    after = client(stack.url)
    url = after.get_queue_url(QueueName=queue)["QueueUrl"]
    second = after.send_message(QueueUrl=url, MessageBody="once", MessageGroupId="g", MessageDeduplicationId="k")
    assert second["MessageId"] == first["MessageId"]
    got = receive(after, url, 10)
    assert [m["MessageId"] for m in got] == [first["MessageId"]]
    # On disk: the queue directory is queues/<name>.fifo, its record a "." file that is never a message.
    names = sorted((tmp_path / "root" / "queues" / queue).iterdir())
    assert any(p.name.startswith(".dedup.") for p in names)


def test_two_daemons_on_one_root_share_groups_and_deduplication(stack: Any, sqs: Any, module_daemons: Any) -> None:
    other = module_daemons.start("mq", "--root", stack.root, "--port", "0")
    try:
        second = client(other.url)
        url = new_fifo(sqs)
        url2 = second.get_queue_url(QueueName=url.rsplit("/", 1)[1])["QueueUrl"]
        one = sqs.send_message(QueueUrl=url, MessageBody="g1", MessageGroupId="g", MessageDeduplicationId="k1")
        two = second.send_message(QueueUrl=url2, MessageBody="g1", MessageGroupId="g", MessageDeduplicationId="k1")
        assert two["MessageId"] == one["MessageId"]  # the record on disk holds for the other daemon
        second.send_message(QueueUrl=url2, MessageBody="g2", MessageGroupId="g", MessageDeduplicationId="k2")
        second.send_message(QueueUrl=url2, MessageBody="h1", MessageGroupId="h", MessageDeduplicationId="k3")
        first = receive_until(sqs, url)
        assert [m["Body"] for m in first] == ["g1"]
        got = receive_until(second, url2, n=10)  # g is in flight through the first daemon: only h
        assert [m["Body"] for m in got] == ["h1"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
        assert [m["Body"] for m in receive_until(second, url2, n=10)] == ["g2"]
    finally:
        other.stop()


def test_fifo_name_on_the_native_api(stack: Any) -> None:
    queue = f"native-{uuid.uuid4().hex[:8]}.fifo"

    def call(method: str, path: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        request = urllib.request.Request(stack.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.headers, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()

    status, _, _ = call("PUT", f"/{queue}", json.dumps({"content_based_deduplication": True}).encode())
    assert status == 201
    status, _, body = call("GET", f"/{queue}/attributes")
    assert status == 200 and json.loads(body)["attributes"]["content_based_deduplication"] is True
    status, _, body = call("GET", "/")
    assert queue in json.loads(body)["queues"]

    status, _, body = call("POST", f"/{queue}/messages", b"no group")
    assert status == 400 and json.loads(body)["details"]["parameter"] == "group_id"
    status, _, body = call("POST", f"/{queue}/messages", b"first", {"X-Message-Group-Id": "g"})
    assert status == 201
    first = json.loads(body)["message_id"]
    status, _, body = call("POST", f"/{queue}/messages", b"first", {"X-Message-Group-Id": "g"})
    assert json.loads(body)["message_id"] == first  # content-based duplicate
    batch = {
        "entries": [
            {"id": "a", "body": "second", "group_id": "g", "deduplication_id": "two"},
            {"id": "b", "body": "other", "group_id": "h"},
            {"id": "c", "body": "x", "group_id": 7},
        ]
    }
    status, _, body = call("POST", f"/{queue}/messages/batch", json.dumps(batch).encode())
    answer = json.loads(body)
    assert status == 200 and [e["id"] for e in answer["successful"]] == ["a", "b"]
    assert [e["id"] for e in answer["failed"]] == ["c"]

    status, headers, body = call("GET", f"/{queue}/messages")
    assert status == 200 and body == b"first" and headers["X-Message-Id"] == first
    assert headers["X-Message-Group-Id"] == "g"
    assert headers["X-Message-Deduplication-Id"] == hashlib.sha256(b"first").hexdigest()
    assert int(headers["X-Sequence-Number"]) == int(first.replace("-", ""), 16)
    status, _, body = call("GET", f"/{queue}/messages?max_messages=10")
    got = json.loads(body)["messages"]
    assert [(m["group_id"], m.get("deduplication_id")) for m in got] == [("h", hashlib.sha256(b"other").hexdigest())]
    status, _, body = call("GET", f"/{queue}/peek")
    peeked = [(m["message_id"] == first, m["state"], m["group_id"]) for m in json.loads(body)["messages"]]
    assert peeked == [(True, "in_flight", "g"), (False, "ready", "g"), (False, "in_flight", "h")]

    plain = f"plain-{uuid.uuid4().hex[:8]}"
    status, _, body = call("PUT", f"/{plain}", json.dumps({"content_based_deduplication": True}).encode())
    assert status == 400 and json.loads(body)["error"] == "invalid_attribute"
    call("PUT", f"/{plain}")
    status, _, body = call("POST", f"/{plain}/messages", b"x", {"X-Message-Group-Id": "g"})
    assert status == 400 and json.loads(body)["error"] == "invalid_request"  # FIFO parameters on a standard queue
    status, headers, _ = call("GET", f"/{plain}/messages")
    assert status == 204
    call("POST", f"/{plain}/messages", b"standard")
    status, _, body = call("GET", f"/{plain}/peek")
    assert [("group_id" in m, m["state"]) for m in json.loads(body)["messages"]] == [(False, "ready")]


def test_brokerless_client_shares_groups_and_deduplication_with_mq(stack: Any, sqs: Any) -> None:
    url = new_fifo(sqs)
    queue = url.rsplit("/", 1)[1]
    sent = sqs.send_message(QueueUrl=url, MessageBody="via mq", MessageGroupId="g", MessageDeduplicationId="k1")
    with LocalClient(stack.root) as local:
        results = local.send_batch(
            queue,
            [
                BatchEntry("via mq", group_id="g", deduplication_id="k1"),  # a duplicate of mq's send
                BatchEntry("local 1", group_id="g", deduplication_id="k2"),
                BatchEntry("local other", group_id="o", deduplication_id="k3"),
                BatchEntry("no group", deduplication_id="k4"),
            ],
        )
        assert results[0] == sent["MessageId"]
        assert isinstance(results[3], InvalidRequest)
        first = local.receive(queue, max_messages=1)
        assert [(m.body, m.group_id, m.deduplication_id) for m in first] == [(b"via mq", "g", "k1")]
        assert first[0].sequence_number == sent["SequenceNumber"]
        # Group g is in flight (leased brokerless): mq hands out only the other group.
        assert [m["Body"] for m in receive(sqs, url, 10)] == ["local other"]
        assert local.receive(queue, max_messages=10) == []
        local.delete(queue, first[0].receipt_handle)
        assert [m.body for m in local.receive(queue, max_messages=10)] == [b"local 1"]


def test_send_of_every_client_takes_a_group_and_a_deduplication_id(stack: Any, sqs: Any) -> None:
    url = new_fifo(sqs)
    queue = url.rsplit("/", 1)[1]
    plain = "std-" + uuid.uuid4().hex[:12]
    sqs.create_queue(QueueName=plain)

    async def send_async(client: Any, body: str, **kw: Any) -> str:
        async with client:
            return str(await client.send(queue, body, **kw))

    with Client(stack.url) as http, LocalClient(stack.root) as local:
        sent = [
            http.send(queue, "http", group_id="g", deduplication_id="d1"),
            local.send(queue, "local", group_id="g", deduplication_id="d2"),
            asyncio.run(send_async(AsyncClient(stack.url), "async http", group_id="g", deduplication_id="d3")),
            asyncio.run(send_async(AsyncLocalClient(stack.root), "async local", group_id="h", deduplication_id="d4")),
        ]
        # A resend of a deduplication id, by any client, stores nothing and answers the first id.
        assert http.send(queue, "again", group_id="g", deduplication_id="d2") == sent[1]
        assert local.send(queue, "again", group_id="g", deduplication_id="d1") == sent[0]
        for client in (http, local):
            with pytest.raises(InvalidRequest):
                client.send(queue, "no group", deduplication_id="d5")
            with pytest.raises(InvalidRequest):
                client.send(queue, "no dedup id, no content-based deduplication", group_id="g")
            with pytest.raises(InvalidRequest):
                client.send(plain, "FIFO arguments on a standard queue", group_id="g")
            with pytest.raises(InvalidRequest):
                client.send(queue, "group id not printable ASCII", group_id="gr\u00fc\u00df", deduplication_id="d6")
        got = http.receive(queue, max_messages=10)
        assert [(m.message_id, m.body, m.group_id, m.deduplication_id) for m in got] == [
            (sent[0], b"http", "g", "d1"),
            (sent[1], b"local", "g", "d2"),
            (sent[2], b"async http", "g", "d3"),
            (sent[3], b"async local", "h", "d4"),
        ]  # each stored once, in send order
        assert receive(sqs, url, 10) == []  # both groups in flight


def test_mqctl_sends_to_a_fifo_queue(stack: Any, sqs: Any) -> None:
    url = new_fifo(sqs, ContentBasedDeduplication="true")
    queue = url.rsplit("/", 1)[1]
    mqctl = [str(Path(sys.executable).with_name("mqctl")), "--url", stack.url, "send", queue]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}

    def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*mqctl, *args], input=stdin, capture_output=True, env=env, timeout=60, check=False)

    first = run("pay 10", "--group-id", "c7", "--dedup-id", "order-1")
    again = run("pay 10 again", "--group-id", "c7", "--dedup-id", "order-1")
    assert first.returncode == again.returncode == 0 and first.stdout == again.stdout  # a duplicate
    lines = run("--file", "-", "--group-id", "c8", "--ids", stdin=b"a\nb\na\n")
    ids = lines.stdout.decode().split()
    assert lines.returncode == 0 and ids[0] == ids[2] != ids[1]  # content-based, line by line
    assert run("no group").returncode != 0
    got = receive(sqs, url, 10)
    assert [(m["Body"], m["Attributes"]["MessageGroupId"]) for m in got] == [("pay 10", "c7"), ("a", "c8"), ("b", "c8")]


def test_concurrent_consumers_on_two_daemons_never_hold_one_group_twice(
    stack: Any, sqs: Any, module_daemons: Any
) -> None:
    other = module_daemons.start("mq", "--root", stack.root, "--port", "0")
    try:
        url = new_fifo(sqs, ContentBasedDeduplication="true")
        urls = [url, client(other.url).get_queue_url(QueueName=url.rsplit("/", 1)[1])["QueueUrl"]]
        groups, per_group = ("a", "b", "c"), 8
        for i in range(per_group):
            entries = [{"Id": g, "MessageBody": f"{g}{i}", "MessageGroupId": g} for g in groups]
            assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 3
        lock = threading.Lock()
        held: set[str] = set()
        seen: dict[str, list[int]] = {g: [] for g in groups}
        overlaps: list[str] = []

        def consume(index: int) -> None:
            me = client(stack.url if index % 2 == 0 else other.url)
            target = urls[index % 2]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sum(map(len, seen.values())) < len(groups) * per_group:
                for message in receive(me, target, 1, wait=1):
                    group = message["Attributes"]["MessageGroupId"]
                    with lock:
                        if group in held:
                            overlaps.append(group)
                        held.add(group)
                        seen[group].append(int(message["Body"][1:]))
                    time.sleep(0.02)
                    with lock:  # released before the delete: a later receive of the group cannot come earlier
                        held.discard(group)
                    me.delete_message(QueueUrl=target, ReceiptHandle=message["ReceiptHandle"])

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert overlaps == []
        assert seen == {g: list(range(per_group)) for g in groups}  # each group whole, in order, once
    finally:
        other.stop()


def test_a_message_given_back_on_another_daemon_is_not_overtaken_by_a_later_one_of_its_group(
    stack: Any, sqs: Any, module_daemons: Any
) -> None:
    """docs/protocol.md 19.3, step 4 (a group delivered 0, 2, 1 once in CI before it).

    Daemon B leases message 0 and daemon A's index drops it. B gives it back while A is stopped
    (SIGSTOP), so its arrival waits in A's inotify queue, as within one of A's 5-ms windows. A's
    next receive pops message 1 first and leases it (nothing of the group is in flight); step 4 must
    give it back and deliver message 0 first.
    """
    other = module_daemons.start("mq", "--root", stack.root, "--port", "0")
    try:
        url = new_fifo(sqs)
        b = client(other.url)
        b_url = b.get_queue_url(QueueName=url.rsplit("/", 1)[1])["QueueUrl"]
        for i in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g", MessageDeduplicationId=f"d{i}")
        (held,) = receive_until(b, b_url)
        assert held["Body"] == "m0"

        def ready_on_a() -> str:
            attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            return str(attrs["Attributes"]["ApproximateNumberOfMessages"])

        deadline = time.monotonic() + 10
        while ready_on_a() != "2" and time.monotonic() < deadline:  # A has read message 0's departure
            time.sleep(0.02)
        assert ready_on_a() == "2"
        got: list[list[dict[str, Any]]] = []
        os.kill(stack.mq.pid, signal.SIGSTOP)
        try:
            b.change_message_visibility(QueueUrl=b_url, ReceiptHandle=held["ReceiptHandle"], VisibilityTimeout=0)
            asker = threading.Thread(target=lambda: got.append(receive(sqs, url, 1)))
            asker.start()
            time.sleep(0.3)  # the request waits in A's socket beside the inotify event
        finally:
            os.kill(stack.mq.pid, signal.SIGCONT)
        asker.join(30)
        assert [m["Body"] for m in got[0]] == ["m0"]
        order = [got[0][0]]
        while len(order) < 3:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=order[-1]["ReceiptHandle"])
            order += receive_until(sqs, url)
        assert [m["Body"] for m in order] == ["m0", "m1", "m2"]
    finally:
        other.stop()


def test_dead_letter_queue_of_a_fifo_queue_is_fifo_and_a_redrive_keeps_the_group(stack: Any, sqs: Any) -> None:
    dlq = new_fifo(sqs)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    standard = sqs.create_queue(QueueName=f"std-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    standard_arn = sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    # SQS: a dead-letter queue is of the same type as its source, on CreateQueue and SetQueueAttributes.
    to_standard = {"RedrivePolicy": json.dumps({"deadLetterTargetArn": standard_arn, "maxReceiveCount": 2})}
    with pytest.raises(ClientError) as info:
        new_fifo(sqs, **to_standard)
    assert error_code(info.value) == "InvalidParameterValue"
    source = new_fifo(sqs)
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=source, Attributes=to_standard)
    assert error_code(info.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as info:
        policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
        sqs.set_queue_attributes(QueueUrl=standard, Attributes={"RedrivePolicy": policy})
    assert error_code(info.value) == "InvalidParameterValue"
    with LocalClient(stack.root) as local, pytest.raises(InvalidRequest):  # the rule is the core's
        local.set_attributes(source.rsplit("/", 1)[1], {"dead_letter_queue": standard.rsplit("/", 1)[1]})

    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    sqs.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": policy})
    sent = sqs.send_message(QueueUrl=source, MessageBody="poison", MessageGroupId="g", MessageDeduplicationId="p")
    for _ in range(2):  # received maxReceiveCount times, never deleted
        message = receive_until(sqs, source, VisibilityTimeout=30)[0]
        sqs.change_message_visibility(QueueUrl=source, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    assert receive(sqs, source, wait=1) == []
    dead = receive_until(sqs, dlq)
    assert [(m["MessageId"], m["Body"], m["Attributes"]["MessageGroupId"]) for m in dead] == [
        (sent["MessageId"], "poison", "g")
    ]
    sqs.change_message_visibility(QueueUrl=dlq, ReceiptHandle=dead[0]["ReceiptHandle"], VisibilityTimeout=0)

    # A move task goes between queues of one type (SQS): FIFO to standard and back are refused.
    standard_dlq = sqs.create_queue(QueueName=f"std-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    standard_dlq_arn = sqs.get_queue_attributes(QueueUrl=standard_dlq, AttributeNames=["QueueArn"])["Attributes"]
    for source_arn, destination_arn in ((dlq_arn, standard_arn), (standard_dlq_arn["QueueArn"], dlq_arn)):
        with pytest.raises(ClientError) as info:
            sqs.start_message_move_task(SourceArn=source_arn, DestinationArn=destination_arn)
        assert error_code(info.value) == "InvalidParameterValue"
    assert sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"] == []  # nothing started
    sqs.start_message_move_task(SourceArn=dlq_arn)  # SQS redrives FIFO dead-letter queues too (since 2023)
    back = receive_until(sqs, source)
    assert [(m["Body"], m["Attributes"]["MessageGroupId"]) for m in back] == [("poison", "g")]
