"""Producers and consumers in threads, and a checker in the manner of Jepsen's total-queue checker.

Every producer records what was acknowledged (201 / a returned id); every consumer records
each delivery (message id, body, receive count, when the request began and when the answer
came) and deletes it at once. :func:`check` then asserts, as a user would:

- **lost = 0**: every acknowledged message was delivered at least once;
- nothing delivered that was never sent, and every body is exactly what was sent;
- **no message handed to two consumers inside its visibility timeout**: of two deliveries of one
  message with consecutive receive counts, the later one's answer must not come before the earlier
  one's request began plus the visibility timeout (the earlier lease's deadline is at least that
  late); the same receive count delivered twice is a double delivery too.

Clients are the project's own (``mqcore.client.connect``): HTTP for a URL, brokerless for a root.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from mqcore.client import connect
from mqcore.errors import MQError


@dataclass
class Delivery:
    """One delivery seen by a consumer (times are ``time.time()`` seconds)."""

    consumer: str
    message_id: str
    body: bytes
    receive_count: int
    began: float
    answered: float


@dataclass
class Ledger:
    """What producers had acknowledged and consumers received, shared by all threads."""

    sent: dict[str, bytes] = field(default_factory=dict)
    unacknowledged: list[bytes] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered_ids(self) -> set[str]:
        """Ids delivered at least once."""
        with self.lock:
            return {d.message_id for d in self.deliveries}


def produce(target: str, queue: str, prefix: str, count: int, ledger: Ledger, *, batch: int = 1) -> None:
    """Send ``count`` messages ``prefix-k`` to ``queue`` through ``target`` (URL or root).

    A send that still fails after the client's retries (e.g. 503 during a fault) is recorded as
    unacknowledged and retried once more later by the caller's loop; it may or may not arrive.
    """
    with connect(target, **_options(target)) as client:
        k = 0
        while k < count:
            bodies = [f"{prefix}-{k + j}".encode() for j in range(min(batch, count - k))]
            try:
                if len(bodies) == 1:
                    ids = [client.send(queue, bodies[0])]
                else:
                    results = client.send_batch(queue, bodies)
                    ids = [r if isinstance(r, str) else None for r in results]
            except (MQError, OSError) as exc:
                with ledger.lock:
                    ledger.errors.append(f"send {prefix}-{k}: {exc!r}")
                time.sleep(0.2)
                continue
            with ledger.lock:
                for body, message_id in zip(bodies, ids, strict=True):
                    if message_id:
                        ledger.sent[message_id] = body
                    else:
                        ledger.unacknowledged.append(body)
            k += len(bodies)


def consume(
    target: str,
    queues: list[str],
    name: str,
    ledger: Ledger,
    stop: threading.Event,
    *,
    visibility_timeout: int,
    delete: bool = True,
    drain: bool = True,
) -> None:
    """Receive from ``queues`` in turn (one message per request) and delete each at once, until ``stop``
    is set and a full round found every queue empty (with ``delete=False`` or ``drain=False``: until ``stop``
    is set; every message received by then was deleted)."""
    with connect(target, **_options(target)) as client:
        while not (stop.is_set() and not (delete and drain)):  # without deletes, messages keep coming back
            got_any = False
            for queue in queues:
                began = time.time()
                try:
                    messages = client.receive(
                        queue, max_messages=1, wait_time_seconds=0, visibility_timeout_seconds=visibility_timeout
                    )
                except (MQError, OSError) as exc:
                    with ledger.lock:
                        ledger.errors.append(f"{name} receive: {exc!r}")
                    time.sleep(0.2)
                    got_any = True
                    continue
                answered = time.time()
                for message in messages:
                    got_any = True
                    with ledger.lock:
                        ledger.deliveries.append(
                            Delivery(name, message.message_id, message.body, message.receive_count, began, answered)
                        )
                    if delete:
                        try:
                            client.delete(queue, message.receipt_handle)
                        except (MQError, OSError) as exc:
                            with ledger.lock:
                                ledger.errors.append(f"{name} delete {message.message_id}: {exc!r}")
            if not got_any:
                if stop.is_set():
                    return
                time.sleep(0.05)


def start_load(
    queue: str,
    ledger: Ledger,
    *,
    producers: list[tuple[str, str]],
    count: int,
    consumers: list[tuple[str, str]],
    visibility_timeout: float,
    drain: bool = True,
) -> tuple[list[threading.Thread], list[threading.Thread], threading.Event]:
    """Start one producer thread per ``(target, prefix)`` (``count`` single sends each) and one consumer
    thread per ``(target, name)`` on ``queue``; return them and the consumers' stop event (for
    :func:`finish_load`; with ``drain=False`` the consumers end as soon as it is set)."""
    stop = threading.Event()
    sending = [
        threading.Thread(daemon=True, target=produce, args=(target, queue, prefix, count, ledger))
        for target, prefix in producers
    ]
    receiving = [
        threading.Thread(
            daemon=True,
            target=consume,
            args=(target, [queue], name, ledger, stop),
            kwargs={"visibility_timeout": visibility_timeout, "drain": drain},
        )
        for target, name in consumers
    ]
    for t in (*sending, *receiving):
        t.start()
    return sending, receiving, stop


def finish_load(
    ledger: Ledger,
    producers: list[threading.Thread],
    consumers: list[threading.Thread],
    stop: threading.Event,
    *,
    wait_seconds: float = 60,
) -> None:
    """Wait for the producers, then until every acknowledged message was delivered (at most
    ``wait_seconds``), then stop the consumers and wait for them."""
    for t in producers:
        t.join(120)
    deadline = time.monotonic() + wait_seconds
    while set(ledger.sent) - ledger.delivered_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for t in consumers:
        t.join(60)


def _options(target: str) -> dict[str, Any]:
    if target.startswith("http"):
        return {"max_retries": 8, "backoff_seconds": 0.1, "max_backoff_seconds": 2.0, "timeout_seconds": 30}
    return {}


def double_deliveries(ledger: Ledger, visibility_timeout: float) -> list[tuple[Delivery, Delivery]]:
    """Pairs of deliveries of one message to two receives inside its visibility timeout."""
    by_id: dict[str, list[Delivery]] = defaultdict(list)
    for d in ledger.deliveries:
        by_id[d.message_id].append(d)
    doubles = []
    for deliveries in by_id.values():
        # Leases of one message happen in receive-count order (each redelivery adds one); a slow request may
        # have begun before an earlier lease's, so the request times do not order them.
        deliveries.sort(key=lambda d: (d.receive_count, d.began))
        for first, second in itertools.pairwise(deliveries):
            if second.answered < first.began + visibility_timeout or second.receive_count == first.receive_count:
                doubles.append((first, second))
    return doubles


def check(ledger: Ledger, visibility_timeout: float, *, all_delivered: bool = True) -> dict[str, int]:
    """Assert lost = 0, nothing foreign or corrupt, no double delivery; return the counts.

    With ``all_delivered=False`` (consumers that never delete starve the tail of a FIFO queue) the
    caller checks for loss on disk instead.

    Raises:
        AssertionError: With the offending ids (at most 10 shown).
    """
    delivered: dict[str, set[bytes]] = defaultdict(set)
    for d in ledger.deliveries:
        delivered[d.message_id].add(d.body)
    lost = sorted(set(ledger.sent) - set(delivered)) if all_delivered else []
    assert not lost, f"{len(lost)} acknowledged messages never delivered: {lost[:10]}"
    sent_bodies = set(ledger.sent.values()) | set(ledger.unacknowledged)
    foreign = {i: b for i, b in delivered.items() if i not in ledger.sent and not b <= sent_bodies}
    assert not foreign, f"delivered but never sent: {list(foreign.items())[:10]}"
    wrong = {i: (ledger.sent[i], b) for i, b in delivered.items() if i in ledger.sent and b != {ledger.sent[i]}}
    assert not wrong, f"bodies differ from what was sent: {list(wrong.items())[:10]}"
    doubles = double_deliveries(ledger, visibility_timeout)
    assert not doubles, f"{len(doubles)} messages handed to two consumers inside the visibility timeout: {doubles[:5]}"
    return {
        "acknowledged": len(ledger.sent),
        "deliveries": len(ledger.deliveries),
        "redeliveries": len(ledger.deliveries) - len(delivered),
        "errors": len(ledger.errors),
    }
