"""Redelivery (docs/protocol.md 6.4, 15.9, 16.4): what mq-mover does to a ``delay/`` file whose deadline passed."""

from __future__ import annotations

import errno
import logging
import os

from mqcore.names import InFlightName, QueueName, parse_in_flight_name, ready_name, removed_name
from mqcore.protocol._fs import listdir
from mqcore.protocol.leases import Leases
from mqcore.protocol.policy import LeasePolicy

logger = logging.getLogger(__name__)


class Redelivery(Leases):
    """Due in-flight and delayed files: back to their queue, to the dead-letter queue, or to ``remove/``."""

    def scan_in_flight(self) -> list[InFlightName]:
        """Every well-formed file name in ``delay/``, parsed (a directory listing)."""
        out = []
        for name in listdir(self.layout.delay):
            parsed = parse_in_flight_name(name)
            if parsed is not None:
                out.append(parsed)
            else:
                logger.warning("ignoring foreign file in delay/ name=%s", name)
        return out

    def redeliver(self, item: InFlightName) -> str:
        """Redelivery: rename ``delay/DL.Q.ID.RC`` back to ``queues/Q/ID.RC``.

        Returns:
            ``"redelivered"``; ``"gone"`` if the file had already left
            ``delay/`` (deleted, or redelivered by another mover);
            ``"orphaned"`` if its queue no longer exists, in which case the
            file is moved to ``remove/`` instead of being stranded.
        """
        src = self.layout.delay_path(item.filename)
        qdir = os.path.join(self.layout.queues, item.queue)
        try:
            os.rename(src, os.path.join(qdir, ready_name(item.message_id, item.receive_count)))
            return "redelivered"
        except FileNotFoundError:
            if not os.path.lexists(src):
                return "gone"
        except OSError as exc:
            if exc.errno != errno.ESTALE:
                raise
            return "gone"  # moved by another host meanwhile (section 13.3); a later rescan finds it if not
        if self._move_to_remove(src, removed_name(item.queue, item.message_id)):
            return "orphaned"
        return "gone"

    def dead_letter(self, item: InFlightName, dead_letter_queue: QueueName) -> bool:
        """Dead-letter a due in-flight message: ``delay/DL.Q.ID.RC`` -> ``queues/DLQ/ID.RC`` (mq-mover).

        The id (so the send time, from which retention counts, as SQS) and the
        receive count are kept.

        Returns:
            False if the file had left ``delay/`` or the dead-letter queue does not exist.
        """
        return self._dead_letter_path(
            self.layout.delay_path(item.filename), dead_letter_queue, item.message_id, item.receive_count
        )

    def remove_in_flight(self, item: InFlightName) -> bool:
        """Remove a purged or expired in-flight (or delayed) file: ``delay/DL.Q.ID.RC`` -> ``remove/Q.ID`` (mq-mover).

        Not fsynced: if a power cut undoes the rename, the file is back in
        ``delay/``, already due, and is removed again at the next pass.

        Returns:
            True if moved, False if the file had already left ``delay/``.
        Raises:
            StorageUnavailable: Any other rename failure.
        """
        return self._move_to_remove(self.layout.delay_path(item.filename), removed_name(item.queue, item.message_id))

    def move_due(self, item: InFlightName, policy: LeasePolicy | None) -> str:
        """Move on one due ``delay/`` file as mq-mover does (also the brokerless client's redelivery).

        In order: a purged or expired message goes to ``remove/``; one received
        ``max_receive_count`` times (RC > 0) goes to its dead-letter queue; any
        other (or one whose dead-letter queue is missing: it is kept, not lost)
        is redelivered to its queue.

        Args:
            item: The parsed ``delay/`` name, its deadline at or before the store's clock (the
                time of the decision, to which retention counts; ``Store.at(now)`` for a given one).
            policy: The queue's policy (:meth:`policy`), or None if the queue is gone.
        Returns:
            ``"purged"`` or ``"expired"`` (moved to ``remove/``), ``"dead_lettered"``,
            ``"redelivered"``, ``"kept"`` (redelivered because the dead-letter queue
            does not exist), ``"orphaned"`` (its queue is gone: moved to ``remove/``)
            or ``"gone"`` (the file had already left ``delay/``).
        Raises:
            StorageUnavailable: A rename failed for another reason than a missing file.
        """
        kept = False
        if policy is not None:
            if policy.is_gone(item.message_id, self.clock()):
                if not self.remove_in_flight(item):
                    return "gone"
                return "purged" if policy.is_purged(item.message_id) else "expired"
            dead_letter_queue = policy.dead_letter_for(item.receive_count)
            if dead_letter_queue is not None and item.receive_count > 0:
                if self.dead_letter(item, dead_letter_queue):
                    return "dead_lettered"
                if not os.path.lexists(self.layout.delay_path(item.filename)):
                    return "gone"
                kept = True
        result = self.redeliver(item)
        return "kept" if kept and result == "redelivered" else result
