"""SQS's query protocol (form-encoded ``Action=``, XML answers) of older SDKs, by hand over real HTTP.

Current SDKs no longer speak it (botocore speaks only AWS JSON 1.0 to SQS), so the requests are
built here as the SQS API reference's query examples show them, and the XML answers are parsed
with ElementTree.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any

import pytest

NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}


@pytest.fixture(scope="module")
def stack(module_daemons: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return module_daemons.stack(tmp_path_factory.mktemp("sqs-query") / "root", reaper=False)


def call(url: str, params: dict[str, str]) -> tuple[int, ET.Element]:
    data = urllib.parse.urlencode({**params, "Version": "2012-11-05"}).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, ET.fromstring(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, ET.fromstring(exc.read())


def text(element: ET.Element, path: str) -> str:
    found = element.find(path, NS)
    assert found is not None, f"{path} not in {ET.tostring(element)!r}"
    return found.text or ""


def test_query_protocol_round_trip(stack: Any) -> None:
    status, root = call(
        stack.url + "/",
        {
            "Action": "CreateQueue",
            "QueueName": "legacy",
            "Attribute.1.Name": "VisibilityTimeout",
            "Attribute.1.Value": "40",
        },
    )
    assert status == 200, ET.tostring(root)
    url = text(root, "q:CreateQueueResult/q:QueueUrl")
    assert url == f"{stack.url}/000000000000/legacy"

    status, root = call(
        stack.url + "/",
        {
            "Action": "SendMessage",
            "QueueUrl": url,
            "MessageBody": "query <body> & ✓",
            "MessageAttribute.1.Name": "n",
            "MessageAttribute.1.Value.DataType": "Number",
            "MessageAttribute.1.Value.StringValue": "5",
            "MessageAttribute.2.Name": "b",
            "MessageAttribute.2.Value.DataType": "Binary",
            "MessageAttribute.2.Value.BinaryValue": base64.b64encode(b"\x01\x02").decode(),
        },
    )
    assert status == 200, ET.tostring(root)
    assert text(root, "q:SendMessageResult/q:MD5OfMessageBody") == hashlib.md5("query <body> & ✓".encode()).hexdigest()
    expected_md5 = hashlib.md5(
        struct.pack(">I", 1)
        + b"b"
        + struct.pack(">I", 6)
        + b"Binary"
        + b"\x02"
        + struct.pack(">I", 2)
        + b"\x01\x02"
        + struct.pack(">I", 1)
        + b"n"
        + struct.pack(">I", 6)
        + b"Number"
        + b"\x01"
        + struct.pack(">I", 1)
        + b"5"
    ).hexdigest()
    assert text(root, "q:SendMessageResult/q:MD5OfMessageAttributes") == expected_md5

    # Posted to the queue URL itself, without QueueUrl (as older SDKs do).
    status, root = call(
        url,
        {
            "Action": "ReceiveMessage",
            "WaitTimeSeconds": "5",
            "AttributeName.1": "All",
            "MessageAttributeName.1": "All",
        },
    )
    assert status == 200, ET.tostring(root)
    message = root.find("q:ReceiveMessageResult/q:Message", NS)
    assert message is not None
    assert text(message, "q:Body") == "query <body> & ✓"
    assert text(message, "q:MD5OfMessageAttributes") == expected_md5
    attrs = {text(a, "q:Name"): text(a, "q:Value") for a in message.findall("q:Attribute", NS)}
    assert attrs["ApproximateReceiveCount"] == "1"
    user = {text(a, "q:Name"): text(a, "q:Value/q:DataType") for a in message.findall("q:MessageAttribute", NS)}
    assert user == {"n": "Number", "b": "Binary"}

    status, root = call(
        stack.url + "/",
        {
            "Action": "DeleteMessageBatch",
            "QueueUrl": url,
            "DeleteMessageBatchRequestEntry.1.Id": "ok",
            "DeleteMessageBatchRequestEntry.1.ReceiptHandle": text(message, "q:ReceiptHandle"),
            "DeleteMessageBatchRequestEntry.2.Id": "bad",
            "DeleteMessageBatchRequestEntry.2.ReceiptHandle": "garbage",
        },
    )
    assert status == 200, ET.tostring(root)
    assert text(root, "q:DeleteMessageBatchResult/q:DeleteMessageBatchResultEntry/q:Id") == "ok"
    assert text(root, "q:DeleteMessageBatchResult/q:BatchResultErrorEntry/q:Code") == "ReceiptHandleIsInvalid"

    status, root = call(
        stack.url + "/",
        {
            "Action": "GetQueueAttributes",
            "QueueUrl": url,
            "AttributeName.1": "VisibilityTimeout",
            "AttributeName.2": "ApproximateNumberOfMessages",
        },
    )
    attrs = {text(a, "q:Name"): text(a, "q:Value") for a in root.findall("q:GetQueueAttributesResult/q:Attribute", NS)}
    assert attrs == {"VisibilityTimeout": "40", "ApproximateNumberOfMessages": "0"}

    status, root = call(stack.url + "/", {"Action": "GetQueueUrl", "QueueName": "no-such-queue"})
    assert status == 400
    assert text(root, "q:Error/q:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert text(root, "q:Error/q:Type") == "Sender"
    status, root = call(stack.url + "/", {"Action": "NoSuchAction"})
    assert status == 400
    assert text(root, "q:Error/q:Code") == "InvalidAction"
