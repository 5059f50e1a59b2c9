"""SigV4 verification of the SQS protocol (``mq --sqs-credentials FILE``): boto3 with the right and wrong keys."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError


@pytest.fixture(scope="module")
def stack(module_daemons: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("sqs-sigv4")
    credentials = base / "credentials.json"
    credentials.write_text(json.dumps({"AKIDMQTEST": "right-secret"}))
    return module_daemons.stack(
        base / "root", mq_args=["--sqs-credentials", str(credentials)], mover=False, reaper=False
    )


def client(stack: Any, key: str, secret: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=stack.url,
        region_name="eu-west-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def test_signed_with_the_right_secret_is_served(stack: Any) -> None:
    sqs = client(stack, "AKIDMQTEST", "right-secret")
    url = sqs.create_queue(QueueName="signed")["QueueUrl"]
    body = "signed body ✓ " * 100
    sqs.send_message(QueueUrl=url, MessageBody=body)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["Body"] == body


def test_wrong_secret_unknown_key_and_unsigned_requests_are_refused(stack: Any) -> None:
    with pytest.raises(ClientError) as info:
        client(stack, "AKIDMQTEST", "wrong-secret").list_queues()
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as info:
        client(stack, "AKIDUNKNOWN", "right-secret").list_queues()
    assert info.value.response["Error"]["Code"] == "InvalidClientTokenId"
    request = urllib.request.Request(
        stack.url + "/", data=b"{}", method="POST", headers={"X-Amz-Target": "AmazonSQS.ListQueues"}
    )
    with pytest.raises(urllib.error.HTTPError) as http_info:
        urllib.request.urlopen(request, timeout=10)
    assert http_info.value.code == 403
    assert json.loads(http_info.value.read())["__type"] == "com.amazonaws.sqs#InvalidClientTokenId"


def test_a_bad_credentials_file_stops_mq_at_start(daemons: Any, tmp_path: Path) -> None:
    bad = tmp_path / "credentials.json"
    bad.write_text("[]")
    mq = daemons.spawn("mq", "--root", tmp_path / "root", "--port", "0", "--sqs-credentials", bad)
    assert mq.proc.wait(timeout=30) == 78
    assert "sqs-credentials" in mq.log


def test_sqs_credentials_next_to_an_auth_file_are_ignored_with_a_warning(daemons: Any, tmp_path: Path) -> None:
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps({"AKIDMQTEST": "right-secret"}))
    auth = tmp_path / "auth.toml"
    auth.write_text(
        '[[access_keys]]\nname = "admin"\naccess_key = "AKIDADMIN"\nsecret_key = "admin-secret-0123456789"\n'
        'queues = ["*"]\nactions = ["send", "receive", "admin"]\n'
    )
    auth.chmod(0o600)
    mq = daemons.start(
        "mq", "--root", tmp_path / "root", "--port", "0", "--auth-file", auth, "--sqs-credentials", credentials
    )
    assert f"--sqs-credentials {credentials} is ignored" in mq.log
    # What the warning says: the auth file's key is served, the credentials file's is unknown.
    client(mq, "AKIDADMIN", "admin-secret-0123456789").list_queues()
    with pytest.raises(ClientError) as info:
        client(mq, "AKIDMQTEST", "right-secret").list_queues()
    assert info.value.response["Error"]["Code"] == "InvalidClientTokenId"
