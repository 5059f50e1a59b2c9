"""An empty receive (nothing ready) answers 204, and 404 once its queue is gone, whoever deleted it.

Since issue 12's stop 18 an empty short poll of mq on a local filesystem asks whether its queue
still exists with one ``stat`` on the event loop's thread instead of a round trip through the
queue's fetcher thread (``Broker._queue_exists_now``); with ``--inline-io never`` the fetcher
still asks. Either way the answer a user sees must follow the directory on disk: a queue deleted
through another mq on the same root, or by a brokerless client, answers 404 ``queue_not_found``
at this mq's next receive, and a queue re-created afterwards is served again.
"""

from __future__ import annotations

import pytest

from mqcore.names import QueueName
from mqcore.protocol import Store


@pytest.mark.parametrize("mode", ["auto", "never"])
async def test_empty_receive_follows_deletes_made_elsewhere(mode, daemons, http, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    here = daemons.start("mq", "--root", root, "--port", "0", "--inline-io", mode)
    other = daemons.start("mq", "--root", root, "--port", "0")

    async def receive(queue: str) -> tuple[int, dict[str, str]]:
        async with http.get(f"{here.url}/{queue}/messages") as resp:
            body = await resp.json() if resp.status == 404 else {}
            return resp.status, body

    async with http.put(f"{other.url}/empty") as resp:
        assert resp.status == 201
    for _ in range(6):
        assert (await receive("empty"))[0] == 204
    async with http.delete(f"{other.url}/empty") as resp:  # another daemon deletes it
        assert resp.status == 200
    status, body = await receive("empty")
    assert status == 404 and body["error"] == "queue_not_found"

    async with http.put(f"{other.url}/empty") as resp:  # re-created: served again, empty
        assert resp.status == 201
    assert (await receive("empty"))[0] == 204
    async with http.post(f"{other.url}/empty/messages", data=b"after the re-creation") as resp:
        assert resp.status == 201
    async with http.get(f"{here.url}/empty/messages") as resp:
        assert resp.status == 200 and await resp.read() == b"after the re-creation"

    store = Store(str(root))  # a brokerless client deletes a queue this mq has served
    try:
        async with http.put(f"{here.url}/brokerless") as resp:
            assert resp.status == 201
        assert (await receive("brokerless"))[0] == 204
        store.delete_queue(QueueName("brokerless"))
    finally:
        store.close()
    status, body = await receive("brokerless")
    assert status == 404 and body["error"] == "queue_not_found"
    status, body = await receive("never-made")
    assert status == 404 and body["error"] == "queue_not_found"
