"""Receive request attempts (docs/protocol.md 15.7): ``attempts/Q.HASH`` remembers what a receive returned.

SQS: a ReceiveRequestAttemptId is remembered for 5 minutes from the first call
(:data:`mqcore.names.ATTEMPT_WINDOW_MS`); a retry with it gets the same messages.
"""

from __future__ import annotations

import hashlib
import os

from mqcore.names import ATTEMPT_WINDOW_MS, QueueName
from mqcore.protocol._base import StoreBase
from mqcore.protocol._fs import listdir, read_json, unlink_if_older, write_json_unsynced


class Attempts(StoreBase):
    """Records of the receipt handles a receive with an attempt id returned, and their expiry."""

    def _attempt_path(self, queue: QueueName, attempt_id: str) -> str:
        """``attempts/Q.HASH``, HASH = sha256 of ``attempt_id`` in hex."""
        return self.layout.attempt_path(queue, hashlib.sha256(attempt_id.encode()).hexdigest())

    def load_attempt_record(self, queue: QueueName, attempt_id: str) -> tuple[list[str], int] | None:
        """``(handles, created_ms)`` recorded for ``attempt_id`` on ``queue`` within the last 5 minutes, or None.

        The window is judged by the store's clock.
        """
        data = read_json(self._attempt_path(queue, attempt_id))
        if data is None or data.get("attempt_id") != attempt_id:
            return None
        created = data.get("created_ms")
        handles = data.get("handles")
        if not isinstance(created, int) or self.clock() - created >= ATTEMPT_WINDOW_MS or not isinstance(handles, list):
            return None
        return [h for h in handles if isinstance(h, str)], created

    def load_attempt(self, queue: QueueName, attempt_id: str) -> list[str] | None:
        """Receipt handles recorded for ``attempt_id`` on ``queue`` within the last 5 minutes, or None."""
        record = self.load_attempt_record(queue, attempt_id)
        return record[0] if record is not None else None

    def attempt_created_ms(self, queue: QueueName, attempt_id: str) -> int | None:
        """When ``attempt_id`` was first recorded on ``queue`` (epoch ms), or None."""
        data = read_json(self._attempt_path(queue, attempt_id))
        created = data.get("created_ms") if data else None
        return created if isinstance(created, int) else None

    def save_attempt(
        self, queue: QueueName, attempt_id: str, handles: list[str], created_ms: int | None = None
    ) -> None:
        """Record the handles a receive with ``attempt_id`` returned (atomic replace, not fsynced).

        ``created_ms`` keeps the first call's time on a retry, so the 5-minute
        window is not extended by retrying; a first record is stamped with the
        store's clock. Not fsynced: after a power cut a retry gets new
        messages, and the old ones come back after their visibility timeout
        (at-least-once still holds).

        Raises:
            StorageUnavailable: The record could not be written.
        """
        record = {
            "attempt_id": attempt_id,
            "created_ms": created_ms or self.clock(),
            "queue": queue,
            "handles": handles,
        }
        name = os.path.basename(self._attempt_path(queue, attempt_id))
        write_json_unsynced(self.layout.attempts, name, record, "writing the receive attempt record")

    def sweep_attempts(self) -> int:
        """Unlink attempt records (and their temporary files) 5 minutes old by the clock; return how many."""
        cutoff = self.clock() - ATTEMPT_WINDOW_MS
        return sum(
            unlink_if_older(os.path.join(self.layout.attempts, n), cutoff) for n in listdir(self.layout.attempts)
        )
