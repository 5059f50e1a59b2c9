"""What a new user meets first (issue 10): clean JSON errors for any bad request, echoed input capped
and in JSON spelling, SoftLayer's PUT /<queue> that ignores a non-JSON body, the change-visibility
call's form named in its error, one batch form (``entries``) on all three batch routes, and a
root whose parent is missing refused by every daemon.

Real daemons (one stack shared by the module, distinct queue names), real HTTP over real sockets.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from http_checks import assert_error

from mqcore.client import LocalClient
from mqcore.errors import QueueNameExists

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(shared_stack):
    return shared_stack


def raw_request(url: str, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (request line + headers, CRLF-terminated) on a new socket; return the parsed answer."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    header_bytes, _, body = raw.partition(b"\r\n\r\n")
    lines = header_bytes.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def assert_json_400(status: int, headers: dict[str, str], body: bytes) -> dict:
    assert status == 400, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), headers
    answer = json.loads(body)
    assert answer["error"] == "invalid_request" and answer["message"], answer
    assert len(answer["message"]) < 400, answer
    return answer


async def test_over_limit_request_line_and_header_answer_json_and_log_no_error(stack, queue, wait):
    long_url = f"/{queue}{'a' * 60_000}/messages"
    answer = assert_json_400(*raw_request(stack.url, f"GET {long_url} HTTP/1.1\r\nHost: x\r\n\r\n".encode()))
    assert "a" * 150 not in answer["message"]  # the 60,000 characters are not echoed back
    big_header = f"GET / HTTP/1.1\r\nHost: x\r\nX-Big: {'b' * 70_000}\r\n\r\n".encode()
    assert_json_400(*raw_request(stack.url, big_header))
    bad_line = b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"
    assert_json_400(*raw_request(stack.url, bad_line))
    # A client's bad request is not a server error: one INFO line, no ERROR, no traceback.
    await wait(lambda: "bad HTTP request" in stack.mq.log, message=stack.mq.log_tail)  # stderr is read by a thread
    log = stack.mq.log
    assert "bad HTTP request" in log
    assert " ERROR " not in log and "Traceback" not in log, stack.mq.log_tail()
    assert (await stack.request("GET", "/")).status == 200  # still serving


async def test_echoed_input_is_capped_and_spelled_as_json(stack, queue):
    long_name = "q" * 5_000
    body = assert_error(await stack.request("GET", f"/{long_name}"), 400, "invalid_queue_name")
    assert body["details"]["queue"] == "q" * 100 + "..."
    assert len(json.dumps(body)) < 500
    body = assert_error(await stack.request("GET", f"/{queue}/messages?{'p' * 3000}=1"), 400, "invalid_request")
    assert len(body["message"]) < 300 and len(body["details"]["parameter"]) == 103
    await stack.create_queue(queue)
    headers = {"Content-Type": "application/json"}
    cases = [
        ({"delay_seconds": True}, "got true"),
        ({"delay_seconds": 1.5}, "got 1.5"),
        ({"delay_seconds": "5"}, 'got "5"'),
        ({"x" * 500: 1}, '"' + "x" * 99 + "..."),
    ]
    for attrs, spelled in cases:
        reply = await stack.request("PUT", f"/{queue}/attributes", data=json.dumps(attrs), headers=headers)
        message = assert_error(reply, 400, "invalid_attribute", str(attrs))["message"]
        assert spelled in message and "True" not in message and "'" not in message.split(":")[0], message
    reply = await stack.request("PUT", f"/{queue}/attributes", data=json.dumps({"x" * 500: 1}), headers=headers)
    assert len(reply.json["details"]["name"]) == 103


async def test_put_queue_ignores_a_body_that_is_not_json_as_softlayer(stack, queue):
    defaults = None
    for i, (data, content_type) in enumerate(
        [
            (b"x", "application/x-www-form-urlencoded"),  # curl -X PUT -d x
            (b"name=jobs&durable=1", "application/x-www-form-urlencoded"),
            (b"not json at all", "text/plain"),
            (b"[1, 2]", None),  # JSON, but not an object: not attributes
        ]
    ):
        headers = {"Content-Type": content_type} if content_type else None
        skip = () if content_type else ("Content-Type",)
        reply = await stack.request("PUT", f"/{queue}-{i}", data=data, headers=headers, skip_auto_headers=skip)
        assert reply.status == 201, (data, reply.body)
        assert reply.json["created"] is True
        defaults = defaults or reply.json["attributes"]
        assert reply.json["attributes"] == defaults
    # A JSON object sets attributes, whatever the Content-Type (curl -d '{...}' sends a form type) ...
    reply = await stack.request(
        "PUT",
        f"/{queue}-obj",
        data=b'{"delay_seconds": 7}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert reply.status == 201 and reply.json["attributes"]["delay_seconds"] == 7, reply.body
    # ... and a body sent as application/json must be a JSON object.
    reply = await stack.request("PUT", f"/{queue}-bad", data=b"x", headers={"Content-Type": "application/json"})
    assert_error(reply, 400, "invalid_request")


async def test_queue_name_exists_says_how_to_change_attributes(stack, queue, tmp_path):
    headers = {"Content-Type": "application/json"}
    assert (await stack.request("PUT", f"/{queue}", data='{"delay_seconds": 1}', headers=headers)).status == 201
    reply = await stack.request("PUT", f"/{queue}", data='{"delay_seconds": 2}', headers=headers)
    message = assert_error(reply, 409, "queue_name_exists")["message"]
    assert f"PUT /{queue}/attributes" in message and f"mqctl queues attributes {queue} --set" in message
    with LocalClient(stack.root) as client, pytest.raises(QueueNameExists) as caught:  # brokerless: the same
        client.create_queue(queue, {"delay_seconds": 3})
    assert f"mqctl queues attributes {queue} --set" in str(caught.value)


async def test_change_visibility_query_parameter_names_the_json_body(stack, queue):
    await stack.create_queue(queue)
    await stack.send(queue, b"x")
    received = await stack.receive(queue)
    message_id = received.header("X-Message-Id")
    path = f"/{queue}/messages/{message_id}/visibility?visibility_timeout_seconds=5"
    body = assert_error(await stack.request("POST", path), 400, "invalid_request")
    assert '"visibility_timeout_seconds": N' in body["message"] and "JSON body" in body["message"], body
    handle = received.header("X-Receipt-Handle")
    form = json.dumps({"receipt_handle": handle, "visibility_timeout_seconds": 0})
    reply = await stack.request("POST", path.split("?")[0], data=form, headers={"Content-Type": "application/json"})
    assert reply.status == 200, reply.body


async def test_batch_routes_all_take_entries(stack, queue):
    await stack.create_queue(queue)
    headers = {"Content-Type": "application/json"}

    async def post(path: str, obj: dict):
        return await stack.request("POST", f"/{queue}/messages/{path}", data=json.dumps(obj), headers=headers)

    sent = await post("batch", {"entries": [{"id": "a", "body": "one"}, {"id": "b", "body": "two"}]})
    assert sent.status == 200 and [s["id"] for s in sent.json["successful"]] == ["a", "b"], sent.body
    alias = await post("batch", {"messages": [{"body": "three"}]})  # the older spelling still works
    assert alias.status == 200 and len(alias.json["successful"]) == 1, alias.body
    both = await post("batch", {"entries": [{"body": "x"}], "messages": [{"body": "y"}]})
    assert_error(both, 400, "invalid_request")
    bad = await post("batch", {"entries": [{"id": "a", "body": "ok"}, {"id": "b", "body": 5}]})
    assert bad.json["failed"][0]["id"] == "b" and "entries[1].body" in bad.json["failed"][0]["message"]
    reply = await stack.request("GET", f"/{queue}/messages?max_messages=10")
    handles = [m["receipt_handle"] for m in reply.json["messages"]]
    assert len(handles) == 4
    entries = [{"id": str(i), "receipt_handle": h, "visibility_timeout_seconds": 60} for i, h in enumerate(handles)]
    changed = await post("visibility", {"entries": entries})
    assert changed.status == 200 and len(changed.json["successful"]) == 4, changed.body
    new_handles = [s["receipt_handle"] for s in changed.json["successful"]]
    deleted = await post(
        "delete", {"entries": [{"id": str(i), "receipt_handle": h} for i, h in enumerate(new_handles)]}
    )
    assert deleted.status == 200 and len(deleted.json["successful"]) == 4, deleted.body


@pytest.mark.parametrize("module", ["daemons.front", "daemons.mover", "daemons.reaper"])
def test_daemons_refuse_a_root_whose_parent_is_missing(module, tmp_path):
    typo = tmp_path / "no-such-dir" / "mq"
    run = subprocess.run(
        [sys.executable, "-m", module, "--root", str(typo)], cwd=REPO, capture_output=True, timeout=60, text=True
    )
    assert run.returncode == 64, run
    assert f"root {typo}: its parent directory {typo.parent} does not exist" in run.stderr
    assert not typo.parent.exists()
