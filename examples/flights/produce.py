"""Producers: processes that replay the flights into a queue as JSON messages with ``send_batch``.

Each producer is a separate process (``spawn``: safe beside the Spark driver's
threads) with its own client from :func:`mqcore.client.connect`, and sends one
contiguous share of the rows. A message is durable once ``send_batch`` returned
its id; an entry that failed (e.g. ``QueueFull``) fails the producer, so the
run stops instead of checking an incomplete stream.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult

from examples.flights.data import flight_message, iter_flights
from mqcore.client import BatchEntry, connect

#: Content type of the messages (the bodies are JSON objects).
JSON_CONTENT_TYPE = "application/json"
#: Flights a producer hands to one ``send_batch`` call (it sends them ``batch_size`` per request).
CHUNK_FLIGHTS = 1000


@dataclass(frozen=True)
class Produced:
    """What one producer did.

    Attributes:
        producer: Its index (0-based).
        sent: Messages sent (each acknowledged with a message id).
        seconds: Wall time from its first send to its last answer.
    """

    producer: int
    sent: int
    seconds: float


def share(total: int, producers: int, index: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of producer ``index`` when ``total`` rows are split into ``producers`` shares."""
    return total * index // producers, total * (index + 1) // producers


def produce(target: str, queue: str, index: int, start: int, stop: int, batch_size: int) -> Produced:
    """Send flights ``start`` to ``stop - 1`` (CSV order) to ``queue``; runs in a producer process.

    Args:
        target: mq URL, or a root folder (brokerless).
        queue: The queue (it must exist).
        index: This producer's index, for the report.
        start: First row.
        stop: Row after the last one.
        batch_size: Entries per batch request (at most the server's ``--max-batch-messages``).
    Raises:
        RuntimeError: Some entries failed (how many, and the first error).
    """
    flights = itertools.islice(iter_flights(stop), start, None)
    sent = 0
    with connect(target) as client:
        began = time.monotonic()
        while chunk := [
            BatchEntry(flight_message(f), content_type=JSON_CONTENT_TYPE)
            for f in itertools.islice(flights, CHUNK_FLIGHTS)
        ]:
            results = client.send_batch(queue, chunk, batch_size=batch_size)
            failed = [r for r in results if not isinstance(r, str)]
            if failed:
                raise RuntimeError(f"producer {index}: {len(failed)} of {len(chunk)} entries failed: {failed[0]!r}")
            sent += len(results)
        return Produced(index, sent, time.monotonic() - began)


class Producers:
    """``count`` producer processes replaying the first ``total`` flights; :meth:`wait` collects them."""

    def __init__(self, target: str, queue: str, total: int, count: int, batch_size: int) -> None:
        self._pool = multiprocessing.get_context("spawn").Pool(count)
        self._results: list[AsyncResult[Produced]] = [
            self._pool.apply_async(produce, (target, queue, i, *share(total, count, i), batch_size))
            for i in range(count)
        ]
        self._pool.close()

    def done(self) -> bool:
        """True once every producer has finished (or failed)."""
        return all(r.ready() for r in self._results)

    def failure(self) -> BaseException | None:
        """The error of the first producer that failed, or None."""
        for result in self._results:
            if result.ready() and not result.successful():
                try:
                    result.get()
                except Exception as exc:  # noqa: BLE001 - any error of the producer is the answer
                    return exc
        return None

    def wait(self) -> list[Produced]:
        """Wait for every producer and return their reports.

        Raises:
            RuntimeError: A producer failed (its error).
        """
        reports = [r.get() for r in self._results]
        self._pool.join()
        return reports

    def terminate(self) -> None:
        """Kill the producers still running (after a failure elsewhere)."""
        self._pool.terminate()
        self._pool.join()
