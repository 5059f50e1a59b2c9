"""Queue-level answers written once: the counts and settings of ``GET /<queue>`` (SQS GetQueueAttributes).

The daemon counts ready messages from its index, the brokerless client from a
listing; both shape the answer here. Pure.
"""

from __future__ import annotations

from typing import Any

from mqcore.attributes import QueueAttributes
from mqcore.names import MessageId, QueueName, sent_ms_of
from mqcore.redrive import present_redrive_status

__all__ = ["queue_stats"]


def queue_stats(
    queue: QueueName,
    *,
    ready: int,
    oldest_ready: str | None,
    in_flight: int,
    delayed: int,
    created_ms: int | None,
    attrs: QueueAttributes,
    redrive: dict[str, Any] | None,
    now: int,
) -> dict[str, Any]:
    """The JSON of ``GET /<queue>``: ``{"queue", "ready", "in_flight", "delayed", "oldest_ready_age_seconds",
    "created_ms", "attributes", "redrive"}``.

    Args:
        queue: The queue.
        ready: Ready messages (SQS ApproximateNumberOfMessages).
        oldest_ready: The oldest ready name ``ID.RC`` (or id), or None when none is ready.
        in_flight: Messages received and not yet visible again (ApproximateNumberOfMessagesNotVisible).
        delayed: Messages sent with a delay not yet over (ApproximateNumberOfMessagesDelayed).
        created_ms: When the queue was created (epoch ms), or None if unknown.
        attrs: The effective attributes.
        redrive: The stored redrive status, or None (shown as :func:`mqcore.redrive.present_redrive_status`).
        now: Epoch ms (the oldest message's age and the redrive's staleness count to it).
    """
    age = None
    if oldest_ready is not None:
        age = round(max(0, now - sent_ms_of(MessageId(oldest_ready.partition(".")[0]))) / 1000, 3)
    return {
        "queue": queue,
        "ready": ready,
        "in_flight": in_flight,
        "delayed": delayed,
        "oldest_ready_age_seconds": age,
        "created_ms": created_ms,
        "attributes": attrs.to_json(),
        "redrive": present_redrive_status(redrive, now),
    }
