"""Capacity admission (mq's ``capacity`` queue attribute; SQS has none), written once.

A queue with a ``capacity`` holds at most that many ready messages: a send
without a delay is admitted only while ``ready + sends in progress <
capacity``; otherwise it waits up to ``capacity_wait_seconds`` for room and
then fails with :class:`~mqcore.errors.QueueFull` (HTTP 429 + Retry-After).
A delayed send is never held or refused (capacity counts ready messages only).
"Sends in progress" are the sends this process admitted and has not published
yet; other processes' sends count once they are published (listed as ready).

The daemon counts its sends in progress on its per-queue state (event loop
only); the brokerless client in a :class:`SendReservations` (threads). Both
call :func:`admit` for the rule and :func:`queue_full` for the error.
"""

from __future__ import annotations

import threading

from mqcore.attributes import QueueAttributes
from mqcore.errors import QueueFull
from mqcore.names import QueueName

__all__ = ["SendReservations", "admit", "queue_full"]


def admit(capacity: int | None, ready: int, sending: int, wanted: int) -> int:
    """How many of ``wanted`` sends without a delay may go ahead now (0 = the queue is full).

    Args:
        capacity: The queue's ``capacity`` (None = unlimited: all are admitted).
        ready: Ready messages in the queue (as this process knows them).
        sending: Sends this process admitted and has not published yet.
        wanted: Sends asking to go ahead (>= 0).
    """
    if capacity is None:
        return wanted
    return max(0, min(capacity - ready - sending, wanted))


def queue_full(queue: QueueName, attrs: QueueAttributes) -> QueueFull:
    """The error of a send refused because ``queue`` stayed at its capacity for ``capacity_wait_seconds``."""
    return QueueFull(
        f"queue {queue!r} holds its capacity of {attrs.capacity} ready messages and no room was made "
        f"within {attrs.capacity_wait_seconds} s",
        queue=queue,
        capacity=attrs.capacity,
    )


class SendReservations:
    """Sends admitted and not yet published, per queue, safe across threads (the brokerless client's count).

    :meth:`reserve` applies :func:`admit` and counts what it admitted in one
    step, so two threads never both take the last room.
    """

    def __init__(self) -> None:
        self._sending: dict[QueueName, int] = {}
        self._lock = threading.Lock()

    def sending(self, queue: QueueName) -> int:
        """Sends of ``queue`` admitted and not yet released."""
        return self._sending.get(queue, 0)

    def reserve(self, queue: QueueName, capacity: int | None, ready: int, wanted: int) -> int:
        """Admit up to ``wanted`` sends (:func:`admit`) and count them; give them back with :meth:`release`."""
        with self._lock:
            taken = admit(capacity, ready, self._sending.get(queue, 0), wanted)
            if taken:
                self._sending[queue] = self._sending.get(queue, 0) + taken
        return taken

    def release(self, queue: QueueName, admitted: int) -> None:
        """The ``admitted`` sends of ``queue`` were published (or failed): they no longer count."""
        if not admitted:
            return
        with self._lock:
            left = self._sending.get(queue, 0) - admitted
            if left > 0:
                self._sending[queue] = left
            else:
                self._sending.pop(queue, None)
