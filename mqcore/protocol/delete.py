"""Delete by message id and purge (docs/protocol.md 6.5, 15.8): files move into ``remove/``."""

from __future__ import annotations

import os
from collections.abc import Iterable

from mqcore.errors import MessageNotFound
from mqcore.names import MessageId, QueueName, parse_in_flight_name, parse_ready_name, removed_name
from mqcore.protocol._fs import listdir
from mqcore.protocol.queues import Queues


class Deletes(Queues):
    """Removing messages wherever they are: one by id, or all of a queue up to a purge marker."""

    def delete(
        self,
        queue: QueueName,
        message_id: MessageId,
        *,
        ready_hint: Iterable[str] = (),
        in_flight_hint: Iterable[str] = (),
        list_ready: bool = True,
        sync: bool = True,
    ) -> str:
        """Delete a message wherever it is: move it into ``remove/Q.ID``.

        Tries, in order: the in-flight names given as hints (a lease the caller
        remembers: the usual delete after a receive is this one rename);
        ``new/Q.ID``; the ready names given as hints (from in-memory indexes);
        then a listing of ``delay/`` and, unless ``list_ready`` is False (the
        caller's index of the queue is kept fresh by inotify), of the queue
        directory. The first rename that succeeds wins (a message file is in
        one place at a time, so the order only decides how soon). ``remove/`` is
        fsynced (group commit) before returning, so a delete is not undone by
        a power cut.

        Args:
            queue: The queue.
            message_id: The message.
            ready_hint: Ready names ``ID.RC`` the message may have.
            in_flight_hint: ``delay/`` names the message may have.
            list_ready: Also list the queue directory when every hint missed.
            sync: Fsync ``remove/`` before returning. False only for a caller that
                fsyncs ``remove/`` itself before it tells anyone the message is
                deleted (the daemon's group commit of a batch of deletes).

        Returns:
            Where the message was: ``"new"``, ``"ready"`` or ``"in_flight"``.
        Raises:
            QueueNotFound: No such queue.
            MessageNotFound: The message is in none of those places.
        """
        target = removed_name(queue, message_id)  # checks the id (first), then the queue: each once
        where = self._delete_somewhere(queue, message_id, target, ready_hint, in_flight_hint, list_ready)
        if where is None:
            self._require_queue(queue)
            raise MessageNotFound(f"message {message_id} is not in queue {queue!r}", queue=queue, message_id=message_id)
        if sync:
            self.disk.sync_dir(self.layout.remove, "fsync of remove/")
        return where

    def _delete_somewhere(
        self,
        queue: QueueName,
        message_id: MessageId,
        target: str,
        ready_hint: Iterable[str],
        in_flight_hint: Iterable[str],
        list_ready: bool,
    ) -> str | None:
        for name in in_flight_hint:
            if self._move_to_remove(self.layout.delay_path(name), target):
                return "in_flight"
        if self._move_to_remove(self.layout.new_path(queue, message_id), target):
            return "new"
        qdir = self.layout.queue_dir(queue)
        for name in ready_hint:
            if self._move_to_remove(os.path.join(qdir, name), target):
                return "ready"
        suffix = f".{queue}.{message_id}."
        for name in listdir(self.layout.delay):
            if suffix in name and self._move_to_remove(self.layout.delay_path(name), target):
                return "in_flight"
        prefix = f"{message_id}."
        for name in listdir(qdir) if list_ready else ():
            if name.startswith(prefix) and self._move_to_remove(os.path.join(qdir, name), target):
                return "ready"
        return None

    def purge(self, queue: QueueName) -> int:
        """Remove every message of ``queue`` sent up to now, in one step as seen by consumers (SQS: PurgeQueue).

        Step 1 writes the marker ``queues/Q/.purge`` holding a fresh message
        id T made at the store's clock (atomic replace, fsynced): from then on every receive, redelivery
        and sweep treats a message with id <= T as gone. Step 2 moves the
        files it finds (the queue directory and the queue's files in
        ``delay/``, in flight and delayed) to ``remove/``; what it misses
        (a send publishing concurrently, a crash in step 2) is removed by the
        next receive, mq-mover or mq-reaper that meets it. A marker never
        moves back (a concurrent purge with a smaller T keeps the larger).

        Returns:
            Number of message files moved to ``remove/`` in step 2.
        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: The marker could not be made durable.
        """
        self._require_queue(queue)
        stamp = self.clock()
        threshold = self.ids.next_id(stamp)
        previous = self.purged_before(queue)
        if previous is not None and previous > threshold:
            threshold = previous
        qdir = self.layout.queue_dir(queue)
        self.disk.replace_json(qdir, ".purge", {"purged_before_id": threshold, "purged_ms": stamp})
        moved = 0
        for name in listdir(qdir):
            parsed = parse_ready_name(name)
            if parsed is not None and parsed[0] <= threshold:
                moved += self._move_to_remove(os.path.join(qdir, name), removed_name(queue, parsed[0]))
        for name in listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is not None and item.queue == queue and item.message_id <= threshold:
                moved += self._move_to_remove(self.layout.delay_path(name), removed_name(item.queue, item.message_id))
        self.disk.sync_dir(self.layout.remove, "fsync of remove/")
        return moved
