"""mq-mover end to end: the real daemon (a subprocess) on a real root.

The test process plays the consumers and producers through the real
:class:`mqcore.protocol.Store` on the same root (as another ``mq`` daemon on
the root would), so each test watches what the mover daemon alone does:
dead-lettering a message received ``max_receive_count`` times, making a
delayed send ready at its deadline, and removing purged in-flight messages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mqcore.names import QueueName, parse_in_flight_name
from mqcore.protocol import Store, now_ms

Q = QueueName("jobs")
DLQ = QueueName("jobs-dead")


def ready(root: Path, queue: str) -> list[str]:
    """Message file names in ``queues/<queue>/`` (names starting with "." are metadata)."""
    return sorted(n for n in os.listdir(root / "queues" / queue) if not n.startswith("."))


async def test_message_received_max_plus_one_times_lands_in_the_dead_letter_queue_intact(
    tmp_path: Path, daemons, wait
) -> None:
    root = tmp_path / "root"
    store = Store(root)
    store.create_queue(DLQ)
    store.create_queue(Q, {"max_receive_count": 3, "dead_letter_queue": DLQ})
    attributes = {"tenant": "acme", "trace-id": "4bf92f3577b34da6"}
    message_id = store.send(Q, b'{"order": 42}', content_type="application/json", attributes=attributes)
    mover = daemons.start("mq-mover", "--root", root)

    # Receives 1..3 each time out (100 ms) and are redelivered; the 4th receive finds
    # nothing in the queue: the mover moved the message to the dead-letter queue.
    for count in range(3):
        name = f"{message_id}.{count}"
        await wait(
            lambda name=name: name in ready(root, Q), message=lambda name=name: f"{name} ready\n{mover.log_tail()}"
        )
        got = store.lease(Q, name, 100)
        assert got is not None and got.receive_count == count + 1
    dead_name = f"{message_id}.3"
    await wait(lambda: dead_name in ready(root, DLQ), message=lambda: f"dead-lettered\n{mover.log_tail()}")
    assert ready(root, Q) == [] and os.listdir(root / "delay") == []
    assert store.scan_ready(Q) == [], "a 4th receive would get the message"

    dead = store.lease(DLQ, dead_name, 30_000)
    assert dead is not None
    assert (dead.message_id, dead.body, dead.content_type) == (message_id, b'{"order": 42}', "application/json")
    assert dead.attributes == attributes
    assert dead.receive_count == 4, "the receive count carries on in the dead-letter queue (as SQS)"
    assert dead.source_queue == Q
    line = f"dead-lettered queue=jobs id={message_id} receive_count=3 dead_letter_queue=jobs-dead"
    await wait(lambda: line in mover.log, message=lambda: mover.log)  # stderr is read by a thread
    assert mover.log.count(f"redelivered queue=jobs id={message_id}") == 2, mover.log


async def test_delayed_send_becomes_ready_at_its_deadline(tmp_path: Path, daemons, wait) -> None:
    root = tmp_path / "root"
    store = Store(root)
    store.create_queue(Q)
    mover = daemons.start("mq-mover", "--root", root, "--rescan-interval", "60")

    message_id = store.send(Q, b"later", delay_ms=500)
    [name] = os.listdir(root / "delay")
    item = parse_in_flight_name(name)
    assert item is not None and (item.message_id, item.receive_count) == (message_id, 0)
    assert ready(root, Q) == []
    target = f"{message_id}.0"
    await wait(lambda: target in ready(root, Q), interval=0.002, message=lambda: mover.log_tail())
    arrived_ms = now_ms()
    assert item.deadline_ms <= arrived_ms < item.deadline_ms + 100, (arrived_ms - item.deadline_ms, mover.log)
    got = store.lease(Q, target, 1_000)
    assert got is not None and got.body == b"later" and got.receive_count == 1


async def test_purged_in_flight_messages_go_to_remove_not_back_to_the_queue(tmp_path: Path, daemons, wait) -> None:
    root = tmp_path / "root"
    store = Store(root)
    store.create_queue(Q)
    before = [store.send(Q, f"before {i}".encode()) for i in range(3)]
    for message_id in before:
        assert store.lease(Q, f"{message_id}.0", 300) is not None
    # A purger that wrote its marker and died before moving the in-flight files.
    marker = {"purged_before_id": before[-1], "purged_ms": now_ms()}
    (root / "queues" / Q / ".purge").write_text(json.dumps(marker))
    after = store.send(Q, b"after the purge")
    assert store.lease(Q, f"{after}.0", 300) is not None
    mover = daemons.start("mq-mover", "--root", root)

    await wait(lambda: not os.listdir(root / "delay"), message=lambda: mover.log_tail())
    assert ready(root, Q) == [f"{after}.1"]
    assert sorted(os.listdir(root / "remove")) == sorted(f"jobs.{i}" for i in before)
    await wait(lambda: mover.log.count("purged queue=jobs id=") == 3, message=lambda: mover.log)


async def test_dead_letter_queue_over_http_with_the_full_stack(stack, queue, wait) -> None:
    dead = f"{queue[:70]}-dead"
    assert (await stack.request("PUT", f"/{dead}")).status == 201
    reply = await stack.request(
        "PUT", f"/{queue}", data=json.dumps({"max_receive_count": 2, "dead_letter_queue": dead})
    )
    assert reply.status == 201, reply.body
    attributes = {"tenant": "acme", "attempt": "first"}
    reply = await stack.request(
        "POST",
        f"/{queue}/messages",
        data=b"poison pill",
        headers={"Content-Type": "text/plain", "X-Message-Attributes": json.dumps(attributes)},
    )
    assert reply.status == 201, reply.body
    message_id = reply.header("X-Message-Id")

    # Each receive lets its lease lapse at once (visibility 0); mq-mover redelivers the
    # first and dead-letters the second, so the third receive waits in vain.
    for count in (1, 2):
        reply = await stack.request("GET", f"/{queue}/messages?visibility_timeout_seconds=0&wait_time_seconds=5")
        assert reply.status == 200, f"{reply.status} {reply.body!r}\n{stack.logs()}"
        assert reply.header("X-Message-Id") == message_id
        assert reply.header("X-Receive-Count") == str(count)
    await wait(lambda: ready(stack.root, dead) == [f"{message_id}.2"], message=stack.logs)
    reply = await stack.request("GET", f"/{queue}/messages?wait_time_seconds=1")
    assert reply.status == 204, f"received {reply.header('X-Receive-Count')} times: not dead-lettered"

    reply = await stack.request("GET", f"/{dead}/messages")
    assert reply.status == 200, reply.body
    assert reply.body == b"poison pill"
    assert reply.content_type == "text/plain"
    assert reply.header("X-Message-Id") == message_id
    assert reply.header("X-Receive-Count") == "3"
    assert json.loads(reply.header("X-Message-Attributes") or "{}") == attributes
