"""boto3 against a live mq stack over SQS's own wire protocol (AWS JSON 1.0 on ``POST /``; docs/sqs.md).

One stack (mq, mq-mover, mq-reaper) serves the whole module; each test uses queues of its own.
The MD5s SQS clients check are recomputed here from AWS's documented algorithm, independently of
mq's code. Errors are checked as a boto3 user sees them: the modeled exception classes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError

ACCOUNT = "000000000000"


@pytest.fixture(scope="module")
def stack(module_daemons: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return module_daemons.stack(tmp_path_factory.mktemp("sqs-boto3") / "root")


@pytest.fixture(scope="module")
def sqs(stack: Any) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=stack.url,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
        config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=60),
    )


@pytest.fixture
def queue(sqs: Any) -> Iterator[str]:
    """A fresh queue's URL."""
    url = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    yield url


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """MD5OfMessageAttributes exactly as the SQS developer guide describes it (test's own copy)."""
    data = b""
    for name in sorted(attributes):
        attr = attributes[name]
        data += struct.pack(">I", len(name.encode())) + name.encode()
        data += struct.pack(">I", len(attr["DataType"].encode())) + attr["DataType"].encode()
        if "BinaryValue" in attr:
            value = attr["BinaryValue"]
            data += b"\x02" + struct.pack(">I", len(value)) + value
        else:
            value = attr["StringValue"].encode()
            data += b"\x01" + struct.pack(">I", len(value)) + value
    return hashlib.md5(data).hexdigest()


def error_code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def wait_until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def test_queue_lifecycle_urls_arns_attributes_and_tags(sqs: Any, stack: Any) -> None:
    name = f"life-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"}, tags={"team": "a"})["QueueUrl"]
    assert url == f"{stack.url}/{ACCOUNT}/{name}"
    # Idempotent with the same attributes; other attributes: QueueNameExists.
    assert sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=f"missing-{uuid.uuid4().hex[:8]}")

    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["DelaySeconds"] == "0"
    assert attrs["MessageRetentionPeriod"] == "345600"
    assert attrs["MaximumMessageSize"] == "1048576"
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "0"
    assert attrs["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"
    assert abs(int(attrs["CreatedTimestamp"]) - time.time()) < 300
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert "RedrivePolicy" not in attrs
    one = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds"])["Attributes"]
    assert one == {"DelaySeconds": "0"}

    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={"DelaySeconds": "2", "ReceiveMessageWaitTimeSeconds": "3", "RedriveAllowPolicy": '{"x":1}'},
    )
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["DelaySeconds"], attrs["ReceiveMessageWaitTimeSeconds"]) == ("2", "3")
    assert attrs["RedriveAllowPolicy"] == '{"x":1}'
    with pytest.raises(sqs.exceptions.InvalidAttributeName):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"NoSuchAttribute": "1"})
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "43201"})
    assert error_code(info.value) == "InvalidAttributeValue"

    sqs.tag_queue(QueueUrl=url, Tags={"env": "test", "team": "b"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "b", "env": "test"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}

    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url, MessageBody="x")


def test_list_queues_prefix_and_pagination(sqs: Any) -> None:
    prefix = f"page{uuid.uuid4().hex[:6]}"
    names = sorted(f"{prefix}-{i}" for i in range(5))
    for name in names:
        sqs.create_queue(QueueName=name)
    listed = sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]
    assert [u.rsplit("/", 1)[1] for u in listed] == names
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        kwargs = {"QueueNamePrefix": prefix, "MaxResults": 2, **({"NextToken": token} if token else {})}
        answer = sqs.list_queues(**kwargs)
        seen += [u.rsplit("/", 1)[1] for u in answer["QueueUrls"]]
        pages += 1
        token = answer.get("NextToken")
        if not token:
            break
    assert seen == names
    assert pages == 3
    paginator = sqs.get_paginator("list_queues")
    urls = [
        u for p in paginator.paginate(QueueNamePrefix=prefix, PaginationConfig={"PageSize": 2}) for u in p["QueueUrls"]
    ]
    assert len(urls) == 5


def test_send_receive_typed_attributes_and_md5s(sqs: Any, queue: str) -> None:
    body = "héllo ✓ 𝄞\n\ttabs"
    attributes = {
        "text": {"DataType": "String", "StringValue": "v ✓"},
        "count": {"DataType": "Number", "StringValue": "-12.5e3"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xffbinary"},
        "custom": {"DataType": "String.json", "StringValue": '{"a":1}'},
        "custombin": {"DataType": "Binary.gzip", "BinaryValue": b"\x1f\x8b"},
    }
    sent = sqs.send_message(QueueUrl=queue, MessageBody=body, MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attributes)

    got = sqs.receive_message(
        QueueUrl=queue, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"], WaitTimeSeconds=5
    )["Messages"]
    assert len(got) == 1
    message = got[0]
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == body
    assert message["MD5OfBody"] == hashlib.md5(body.encode()).hexdigest()
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    system = message["Attributes"]
    assert system["ApproximateReceiveCount"] == "1"
    assert abs(int(system["SentTimestamp"]) - time.time() * 1000) < 300_000
    assert int(system["ApproximateFirstReceiveTimestamp"]) >= int(system["SentTimestamp"])
    assert system["SenderId"] == ACCOUNT
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])

    # Only the asked-for attributes come back, and the MD5 covers exactly those.
    sqs.send_message(QueueUrl=queue, MessageBody="b", MessageAttributes=attributes)
    got = sqs.receive_message(QueueUrl=queue, MessageAttributeNames=["custom.*", "count"], WaitTimeSeconds=5)
    message = got["Messages"][0]
    chosen = {k: attributes[k] for k in ("count",)}
    assert message["MessageAttributes"] == chosen
    assert message["MD5OfMessageAttributes"] == md5_of_attributes(chosen)
    assert "Attributes" not in message
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])

    with pytest.raises(ClientError) as info:
        sqs.send_message(
            QueueUrl=queue, MessageBody="x", MessageAttributes={"n": {"DataType": "Number", "StringValue": "abc"}}
        )
    assert error_code(info.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=queue, MessageBody="bad \x01 char")
    assert error_code(info.value) == "InvalidMessageContents"


def test_batches_and_their_errors(sqs: Any, queue: str) -> None:
    entries = [
        {
            "Id": f"e{i}",
            "MessageBody": f"body {i}",
            "MessageAttributes": {"i": {"DataType": "Number", "StringValue": str(i)}},
        }
        for i in range(10)
    ]
    answer = sqs.send_message_batch(QueueUrl=queue, Entries=entries)
    assert answer["Failed"] == []
    by_id = {e["Id"]: e for e in answer["Successful"]}
    for entry in entries:
        ok = by_id[entry["Id"]]
        assert ok["MD5OfMessageBody"] == hashlib.md5(entry["MessageBody"].encode()).hexdigest()
        assert ok["MD5OfMessageAttributes"] == md5_of_attributes(entry["MessageAttributes"])
    # One bad entry fails alone.
    answer = sqs.send_message_batch(
        QueueUrl=queue,
        Entries=[{"Id": "good", "MessageBody": "g"}, {"Id": "bad", "MessageBody": "x", "DelaySeconds": 901}],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["good"]
    assert answer["Failed"][0]["Id"] == "bad"
    assert answer["Failed"][0]["Code"] == "InvalidParameterValue"
    assert answer["Failed"][0]["SenderFault"] is True

    received: list[dict[str, Any]] = []
    while len(received) < 11:
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=2).get("Messages", [])
        assert got, "messages went missing"
        assert len(got) <= 10
        received += got
    assert sorted(m["Body"] for m in received) == sorted([f"body {i}" for i in range(10)] + ["g"])
    handles = [{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(received[:10])]
    answer = sqs.delete_message_batch(QueueUrl=queue, Entries=handles)
    assert len(answer["Successful"]) == 10 and answer["Failed"] == []
    answer = sqs.delete_message_batch(
        QueueUrl=queue,
        Entries=[{"Id": "ok", "ReceiptHandle": received[10]["ReceiptHandle"]}, {"Id": "bad", "ReceiptHandle": "nope"}],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["ok"]
    assert answer["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"

    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.send_message_batch(QueueUrl=queue, Entries=[])
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.send_message_batch(QueueUrl=queue, Entries=[{"Id": f"i{i}", "MessageBody": "x"} for i in range(11)])
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.delete_message_batch(QueueUrl=queue, Entries=[{"Id": "a", "ReceiptHandle": "h"}] * 2)
    with pytest.raises(sqs.exceptions.InvalidBatchEntryId):
        sqs.change_message_visibility_batch(
            QueueUrl=queue, Entries=[{"Id": "no spaces", "ReceiptHandle": "h", "VisibilityTimeout": 1}]
        )
    with pytest.raises(sqs.exceptions.BatchRequestTooLong):
        sqs.send_message_batch(
            QueueUrl=queue, Entries=[{"Id": f"b{i}", "MessageBody": "x" * 200_000} for i in range(6)]
        )


def test_receipt_handles_visibility_and_redelivery(sqs: Any, queue: str) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="once")
    first = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=30, WaitTimeSeconds=5)["Messages"][0]
    # Back to visible at once, received again: a new handle, receive count 2.
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    second = sqs.receive_message(
        QueueUrl=queue, VisibilityTimeout=30, WaitTimeSeconds=5, MessageSystemAttributeNames=["ApproximateReceiveCount"]
    )["Messages"][0]
    assert second["MessageId"] == first["MessageId"]
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    # The outdated handle: DeleteMessage succeeds without deleting; ChangeMessageVisibility: MessageNotInflight.
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"])
    answer = sqs.delete_message_batch(QueueUrl=queue, Entries=[{"Id": "old", "ReceiptHandle": first["ReceiptHandle"]}])
    assert [e["Id"] for e in answer["Successful"]] == ["old"] and answer["Failed"] == []  # the same in a batch
    with pytest.raises(sqs.exceptions.MessageNotInflight):
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5)
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
    assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "1"
    # Malformed handles.
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=queue, ReceiptHandle="not-a-handle")
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle="not-a-handle", VisibilityTimeout=5)
    # A short visibility timeout: the message comes back by itself (mq-mover), count 3.
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=1)
    third = sqs.receive_message(
        QueueUrl=queue, WaitTimeSeconds=10, VisibilityTimeout=30, AttributeNames=["ApproximateReceiveCount"]
    )["Messages"][0]
    assert third["Attributes"]["ApproximateReceiveCount"] == "3"
    answer = sqs.change_message_visibility_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "cur", "ReceiptHandle": third["ReceiptHandle"], "VisibilityTimeout": 60},
            {"Id": "old", "ReceiptHandle": second["ReceiptHandle"], "VisibilityTimeout": 60},
        ],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["cur"]
    assert answer["Failed"][0]["Code"] == "MessageNotInflight"
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=third["ReceiptHandle"])
    # Deleted: the old handle's delete still succeeds; nothing is left.
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=third["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_long_polling(sqs: Any, queue: str) -> None:
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)
    assert time.monotonic() - started >= 0.9
    sender = threading.Timer(1.0, lambda: sqs.send_message(QueueUrl=queue, MessageBody="late"))
    started = time.monotonic()
    sender.start()
    try:
        got = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=20)
    finally:
        sender.join()
    elapsed = time.monotonic() - started
    assert [m["Body"] for m in got["Messages"]] == ["late"]
    assert 0.9 <= elapsed < 15, "a long poll returns when a message arrives, not at the end of its wait"
    # The queue's ReceiveMessageWaitTimeSeconds is the default wait.
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"ReceiveMessageWaitTimeSeconds": "1"})
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)
    assert time.monotonic() - started >= 0.9


def test_delay_purge_and_errors(sqs: Any, queue: str, stack: Any) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="later", DelaySeconds=2)
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert attrs["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=queue)
    assert sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=10)["Messages"][0]["Body"] == "later"

    sqs.send_message(QueueUrl=queue, MessageBody="gone")
    sqs.purge_queue(QueueUrl=queue)
    with pytest.raises(sqs.exceptions.PurgeQueueInProgress):
        sqs.purge_queue(QueueUrl=queue)
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)

    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"MaximumMessageSize": "1024"})
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=queue, MessageBody="x" * 1025)
    assert error_code(info.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as info:
        sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=11)
    assert error_code(info.value) == "InvalidParameterValue"
    with pytest.raises(sqs.exceptions.UnsupportedOperation):
        sqs.add_permission(QueueUrl=queue, Label="l", AWSAccountIds=["1"], Actions=["SendMessage"])
    with pytest.raises(ClientError) as info:  # a .fifo name is a FIFO queue: FifoQueue=true is required (SQS)
        sqs.create_queue(QueueName="jobs.fifo")
    assert error_code(info.value) == "InvalidParameterValue"

    # An unknown action, sent by hand: SQS's JSON error shape, never a 500.
    request = urllib.request.Request(
        stack.url + "/",
        data=b"{}",
        method="POST",
        headers={"X-Amz-Target": "AmazonSQS.NoSuchAction", "Content-Type": "application/x-amz-json-1.0"},
    )
    with pytest.raises(urllib.error.HTTPError) as http_info:
        urllib.request.urlopen(request, timeout=10)
    assert http_info.value.code == 400
    assert json.loads(http_info.value.read())["__type"] == "com.amazonaws.sqs#InvalidAction"
    assert http_info.value.headers["x-amzn-query-error"] == "InvalidAction;Sender"


def test_dead_letter_queue_then_message_move_task_back(sqs: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    dlq = sqs.create_queue(QueueName=f"dlq-{tag}")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    source = sqs.create_queue(QueueName=f"src-{tag}", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    got = json.loads(
        sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"]
    )
    assert got == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]

    sqs.send_message(QueueUrl=source, MessageBody="poison")
    for _ in range(2):  # received maxReceiveCount times, never deleted
        message = sqs.receive_message(QueueUrl=source, WaitTimeSeconds=10, VisibilityTimeout=30)["Messages"][0]
        sqs.change_message_visibility(QueueUrl=source, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    assert "Messages" not in sqs.receive_message(QueueUrl=source, WaitTimeSeconds=1)

    def dlq_count() -> bool:
        attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
        return attrs["Attributes"]["ApproximateNumberOfMessages"] == "1"

    wait_until(dlq_count)
    assert sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"] == []
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    back = sqs.receive_message(QueueUrl=source, WaitTimeSeconds=20, MessageSystemAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in back] == ["poison"]
    sqs.delete_message(QueueUrl=source, ReceiptHandle=back[0]["ReceiptHandle"])

    def task_done() -> dict[str, Any] | None:
        results = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        return results[0] if results and results[0]["Status"] == "COMPLETED" else None

    task = wait_until(task_done)
    assert task["SourceArn"] == dlq_arn
    assert task["ApproximateNumberOfMessagesMoved"] == 1
    with pytest.raises(sqs.exceptions.ResourceNotFoundException):
        sqs.cancel_message_move_task(TaskHandle=handle)
    with pytest.raises(sqs.exceptions.ResourceNotFoundException):
        sqs.cancel_message_move_task(TaskHandle="garbage")


def test_the_same_queue_from_boto3_and_the_native_api(sqs: Any, queue: str, stack: Any) -> None:
    name = queue.rsplit("/", 1)[1]
    attributes = {
        "kind": {"DataType": "String", "StringValue": "k"},
        "n": {"DataType": "Number", "StringValue": "7"},
        "b": {"DataType": "Binary", "BinaryValue": b"\x00\xfe"},
    }
    sent = sqs.send_message(QueueUrl=queue, MessageBody="from boto3", MessageAttributes=attributes)
    with urllib.request.urlopen(f"{stack.url}/{name}/messages?max_messages=1&wait_time_seconds=5", timeout=30) as r:
        native = json.loads(r.read())["messages"][0]
    assert native["message_id"] == sent["MessageId"]
    assert base64.b64decode(native["body_base64"]) == b"from boto3"
    assert native["attributes"] == {"kind": "k", "n": "7", "b": base64.b64encode(b"\x00\xfe").decode()}
    assert native["attribute_types"] == {"n": "Number", "b": "Binary"}
    delete = urllib.request.Request(
        f"{stack.url}/{name}/messages/{native['message_id']}?receipt_handle={native['receipt_handle']}", method="DELETE"
    )
    with urllib.request.urlopen(delete, timeout=10) as r:
        assert r.status == 200

    post = urllib.request.Request(
        f"{stack.url}/{name}/messages",
        data="from the native API ✓".encode(),
        method="POST",
        headers={"Content-Type": "text/plain", "X-Message-Attributes": '{"origin":"native"}'},
    )
    with urllib.request.urlopen(post, timeout=10) as r:
        message_id = r.headers["X-Message-Id"]
    got = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=5, MessageAttributeNames=["All"])["Messages"][0]
    assert got["MessageId"] == message_id
    assert got["Body"] == "from the native API ✓"
    assert got["MessageAttributes"] == {"origin": {"DataType": "String", "StringValue": "native"}}
    assert got["MD5OfMessageAttributes"] == md5_of_attributes(got["MessageAttributes"])
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=got["ReceiptHandle"])


def test_boto3_finds_mq_through_aws_endpoint_url_sqs(stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", stack.url)
    client = boto3.client("sqs", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    url = client.create_queue(QueueName=f"env-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    assert url.startswith(stack.url + "/000000000000/")


def test_receive_request_attempt_id_and_a_request_posted_to_the_queue_url(sqs: Any, queue: str) -> None:
    sqs.send_message_batch(QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(3)])
    first = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1")["Messages"]
    # A retry with the same attempt id gets the same messages again (fresh handles), not new ones.
    again = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1")["Messages"]
    assert [m["MessageId"] for m in again] == [m["MessageId"] for m in first]
    assert {m["ReceiptHandle"] for m in again}.isdisjoint(m["ReceiptHandle"] for m in first)
    # Some SDKs post to the queue URL itself: the same endpoint answers there.
    request = urllib.request.Request(
        queue,
        data=json.dumps({"QueueUrl": queue, "AttributeNames": ["ApproximateNumberOfMessagesNotVisible"]}).encode(),
        method="POST",
        headers={"X-Amz-Target": "AmazonSQS.GetQueueAttributes", "Content-Type": "application/x-amz-json-1.0"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read()) == {"Attributes": {"ApproximateNumberOfMessagesNotVisible": "2"}}
