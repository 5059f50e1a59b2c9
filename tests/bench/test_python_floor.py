"""bench/python_floor.py's server does mq's file work per request, answering in the shape the wrk scripts parse.

The benchmark itself (wrk against the disk loops) is not run here; this checks that what it measures is real:
a 201 only once the message file is in its queue, a receive hands out the oldest ready file with its body and
``X-Message-Id`` (what bench/lua/recv_delete.lua reads), a delete removes the file, an empty queue answers 204.
"""

from __future__ import annotations

import http.client
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.python_floor import QUEUE, FloorServer, make_root  # noqa: E402


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None):
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    return resp.status, resp.getheader("X-Message-Id"), resp.read()


def _files(root: Path) -> dict[str, list[str]]:
    return {d: sorted(p.name for p in (root / d).iterdir()) for d in ("new", f"queues/{QUEUE}", "delay", "remove")}


@pytest.mark.parametrize(
    ("variant", "workers"), [("inline", 1), ("pool", 1), ("group", 1), ("group", 2), ("syncfs", 1)]
)
def test_send_receive_delete_do_the_file_work(tmp_path: Path, variant: str, workers: int) -> None:
    root = make_root(tmp_path / "floor")
    ready = root / "queues" / QUEUE
    for n, body in enumerate((b"first", b"second")):
        (ready / f"{n:012d}").write_bytes(body)
    server = FloorServer(root, variant, workers, 4, tmp_path / "server.log")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        status, sent_id, _ = _request(conn, "POST", f"/{QUEUE}/messages", b"x" * 1024)
        assert status == 201
        assert (ready / f"{sent_id}.0").read_bytes() == b"x" * 1024
        # Keep-alive: the same connection receives the oldest file of its worker, then deletes it.
        status, msg_id, body = _request(conn, "GET", f"/{QUEUE}/messages")
        assert status == 200
        assert (msg_id, body) in {("000000000000", b"first"), ("000000000001", b"second")}
        assert _files(root)["delay"] == [msg_id]
        status, _, _ = _request(conn, "DELETE", f"/{QUEUE}/messages/{msg_id}")
        assert status == 200
        deadline = time.monotonic() + 10  # group: the unlink comes after the answer
        while (_files(root)["remove"] or _files(root)["delay"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        files = _files(root)
        assert files["delay"] == files["remove"] == files["new"] == []
        assert msg_id not in files[f"queues/{QUEUE}"]
        assert _request(conn, "DELETE", f"/{QUEUE}/messages/{msg_id}")[0] == 404
        if workers == 1:
            assert _request(conn, "GET", f"/{QUEUE}/messages")[0] == 200
            assert _request(conn, "GET", f"/{QUEUE}/messages")[0] == 204
        conn.close()
    finally:
        server.stop()
