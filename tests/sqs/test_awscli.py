"""The AWS CLI (``awscli`` from PyPI) as a subprocess against a live mq stack (docs/sqs.md)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

AWS = Path(sys.executable).with_name("aws")


@pytest.fixture(scope="module")
def stack(module_daemons: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return module_daemons.stack(tmp_path_factory.mktemp("sqs-cli") / "root", reaper=False)


@pytest.fixture(scope="module")
def aws(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = tmp_path_factory.mktemp("aws-home")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "AWS_ACCESS_KEY_ID": "any",
        "AWS_SECRET_ACCESS_KEY": "any",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
    }

    def run(*args: str) -> dict[str, Any]:
        command = [str(AWS), "--endpoint-url", stack.url, "--output", "json", "sqs", *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"{command} exited {done.returncode}: {done.stderr}"
        return json.loads(done.stdout) if done.stdout.strip() else {}

    return run


def test_aws_cli_create_send_receive_delete_attributes(aws: Any, stack: Any) -> None:
    url = aws("create-queue", "--queue-name", "cli-jobs", "--attributes", "VisibilityTimeout=40")["QueueUrl"]
    assert url == f"{stack.url}/000000000000/cli-jobs"

    body = "hello from the AWS CLI ✓"
    sent = aws(
        "send-message",
        "--queue-url",
        url,
        "--message-body",
        body,
        "--message-attributes",
        '{"n": {"DataType": "Number", "StringValue": "3"}}',
    )
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()

    got = aws(
        "receive-message",
        "--queue-url",
        url,
        "--wait-time-seconds",
        "5",
        "--message-attribute-names",
        "All",
        "--message-system-attribute-names",
        "ApproximateReceiveCount",
    )["Messages"]
    assert [m["Body"] for m in got] == [body]
    assert got[0]["MessageId"] == sent["MessageId"]
    assert got[0]["MessageAttributes"] == {"n": {"DataType": "Number", "StringValue": "3"}}
    assert got[0]["Attributes"] == {"ApproximateReceiveCount": "1"}

    aws("delete-message", "--queue-url", url, "--receipt-handle", got[0]["ReceiptHandle"])
    attrs = aws(
        "get-queue-attributes",
        "--queue-url",
        url,
        "--attribute-names",
        "VisibilityTimeout",
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
    )["Attributes"]
    assert attrs == {
        "VisibilityTimeout": "40",
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }
