"""Queues and their metadata (docs/protocol.md 6.1, 6.6, 15.2, 15.13): create, attributes, list, delete."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import uuid
from typing import Any

from mqcore.attributes import QueueAttributes, check_changes, check_fifo_throughput, check_queue_kind, effective
from mqcore.errors import InvalidAttribute, MQError, QueueNameExists, QueueNotFound, StorageUnavailable
from mqcore.names import (
    REMOVED_QUEUE_SUFFIX,
    STAGING_SUFFIX,
    MessageId,
    QueueName,
    check_message_id,
    check_queue_name,
    parse_in_flight_name,
    parse_ready_name,
    removed_name,
    sent_ms_of,
)
from mqcore.protocol._base import StoreBase
from mqcore.protocol._fs import json_bytes, listdir, read_json, rename_if_present, storage_error
from mqcore.protocol.policy import LeasePolicy

logger = logging.getLogger(__name__)


class Queues(StoreBase):
    """Queue directories and the small JSON files in them (``.attributes``, ``.sqs``, ``.purge``)."""

    def create_queue(
        self,
        queue: QueueName,
        attributes: dict[str, Any] | None = None,
        defaults: QueueAttributes | None = None,
    ) -> bool:
        """Create ``queues/<queue>`` with its attributes; return False if it already existed (idempotent).

        A new queue is built as ``queues/.Q.TOKEN.creating`` holding its
        ``.attributes`` file and renamed into place, so no process ever sees
        the queue without its attributes. ``rename(2)`` of a directory fails
        when the target is a non-empty directory, so of two racing creators
        exactly one wins. Its creation time is the store's clock.

        Args:
            queue: The queue name.
            attributes: Explicit queue attributes (``mqcore.attributes`` keys), or None.
            defaults: The caller's defaults for keys the queue does not set (used to
                compare ``attributes`` with an existing queue's effective values).
        Raises:
            InvalidQueueName: Bad name.
            InvalidAttribute: Bad attributes, or a dead-letter queue that does not exist or is the queue itself.
            QueueNameExists: The queue exists and one of ``attributes`` differs from its effective value
                (SQS: CreateQueue with other attributes fails with QueueNameExists).
            StorageUnavailable: The directory could not be made durable.
        """
        path = self.layout.queue_dir(queue)
        explicit = {k: v for k, v in check_changes(attributes or {}).items() if v is not None}
        check_queue_kind(queue, explicit)
        if os.path.isdir(path):
            self._check_same_attributes(queue, explicit, defaults)
            # Its creator may have died before its fsync of queues/: sync again.
            self.disk.sync_dir(self.layout.queues, "fsync of queues/")
            return False
        self._check_redrive_policy(explicit)
        check_fifo_throughput(explicit)
        self._check_dead_letter_queue(queue, explicit.get("dead_letter_queue"))
        created_ms = self.clock()
        staging = os.path.join(self.layout.queues, f".{queue}.{uuid.uuid4().hex}{STAGING_SUFFIX}")
        try:
            os.mkdir(staging)
        except OSError as exc:
            raise storage_error("creating the queue directory", exc) from exc
        try:
            meta = {"version": 1, "created_ms": created_ms, "modified_ms": created_ms, "attributes": explicit}
            self.disk.write_file(os.path.join(staging, ".attributes"), json_bytes(meta))
            self.disk.sync_dir(staging, "creating the queue directory")
        except StorageUnavailable:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        created = True
        try:
            os.rename(staging, path)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                raise storage_error("rename of the new queue directory", exc) from exc
            if not os.path.isdir(path):
                raise MQError(f"queues/{queue} exists but is not a directory; remove it by hand", queue=queue) from None
            self._check_same_attributes(queue, explicit, defaults)
            created = False  # its creator may have died before the fsync below: sync again
        self.disk.sync_dir(self.layout.queues, "fsync of queues/")
        return created

    def _check_same_attributes(
        self, queue: QueueName, explicit: dict[str, Any], defaults: QueueAttributes | None
    ) -> None:
        if not explicit:
            return
        stored = self.get_attributes(queue)
        current = {**effective(stored, defaults or QueueAttributes()).to_json(), **stored}
        differ = sorted(k for k, v in explicit.items() if current.get(k) != v)
        if differ:
            raise QueueNameExists(
                f"queue {queue!r} exists with other values of {', '.join(differ)}; to change an existing queue's "
                f"attributes use PUT /{queue}/attributes (mqctl queues attributes {queue} --set NAME=VALUE)",
                queue=queue,
                attributes=differ,
            )

    @staticmethod
    def _check_redrive_policy(explicit: dict[str, Any]) -> None:
        if explicit.get("max_receive_count") is not None and explicit.get("dead_letter_queue") is None:
            raise InvalidAttribute(
                "max_receive_count needs a dead_letter_queue (SQS: RedrivePolicy sets both)", name="max_receive_count"
            )

    def _check_dead_letter_queue(self, queue: QueueName, dead_letter_queue: str | None) -> None:
        if dead_letter_queue is None:
            return
        if dead_letter_queue == queue:
            raise InvalidAttribute("a queue cannot be its own dead-letter queue", name="dead_letter_queue")
        if not self.queue_exists(QueueName(dead_letter_queue)):
            raise InvalidAttribute(
                f"dead-letter queue {dead_letter_queue!r} does not exist; create it first (as SQS requires)",
                name="dead_letter_queue",
            )

    def _read_queue_file(self, queue: QueueName, name: str) -> dict[str, Any]:
        """The JSON file ``queues/<queue>/<name>``, ``{}`` if the queue has none.

        Raises:
            QueueNotFound: No such queue.
        """
        data = read_json(os.path.join(self.layout.queue_dir(queue), name))
        if data is None:
            self._require_queue(queue)
            return {}
        return data

    def queue_meta(self, queue: QueueName) -> dict[str, Any]:
        """The queue's ``.attributes`` file: ``{"created_ms", "modified_ms", "attributes"}`` ({} if absent).

        Raises:
            QueueNotFound: No such queue.
        """
        return self._read_queue_file(queue, ".attributes")

    def get_attributes(self, queue: QueueName) -> dict[str, Any]:
        """The explicitly set attributes of ``queue`` ({} when none are set, or for a queue of protocol v1).

        Raises:
            QueueNotFound: No such queue.
        """
        return self.queue_settings(queue)[0]

    def queue_settings(self, queue: QueueName) -> tuple[dict[str, Any], int | None]:
        """``(explicit attributes, created_ms)`` of ``queue`` from one read of its ``.attributes``.

        Raises:
            QueueNotFound: No such queue.
        """
        meta = self.queue_meta(queue)
        attrs = meta.get("attributes")
        created = meta.get("created_ms")
        return (dict(attrs) if isinstance(attrs, dict) else {}), (created if isinstance(created, int) else None)

    def queue_created_ms(self, queue: QueueName) -> int | None:
        """Creation time of ``queue`` in epoch ms, or None if unknown (created by protocol v1).

        Raises:
            QueueNotFound: No such queue.
        """
        return self.queue_settings(queue)[1]

    def set_attributes(self, queue: QueueName, changes: dict[str, Any]) -> dict[str, Any]:
        """Merge ``changes`` into the explicit attributes of ``queue`` (a None value removes a key).

        The file is replaced atomically (write, fsync, rename, fsync of the
        queue directory), stamped with the store's clock. Two processes
        changing attributes at the same time: the last rename wins whole
        (SQS's SetQueueAttributes has the same race).

        Returns:
            The explicit attributes after the change.
        Raises:
            QueueNotFound: No such queue.
            InvalidAttribute: A key or value is invalid, or the dead-letter queue does not exist.
            StorageUnavailable: The change could not be made durable.
        """
        checked = check_changes(changes)
        check_queue_kind(queue, checked)
        self._check_dead_letter_queue(queue, checked.get("dead_letter_queue"))
        meta = self.queue_meta(queue)
        explicit = dict(meta.get("attributes") or {})
        for key, value in checked.items():
            if value is None:
                explicit.pop(key, None)
            else:
                explicit[key] = value
        self._check_redrive_policy(explicit)
        check_fifo_throughput(explicit)
        stamp = self.clock()
        meta = {
            "version": 1,
            "created_ms": meta.get("created_ms", stamp),
            "modified_ms": stamp,
            "attributes": explicit,
        }
        self.disk.replace_json(self.layout.queue_dir(queue), ".attributes", meta)
        return explicit

    def read_sqs_meta(self, queue: QueueName) -> dict[str, Any]:
        """The queue's ``.sqs`` file (section 15.13: tags and SQS-only attributes), ``{}`` if it has none.

        Raises:
            QueueNotFound: No such queue.
        """
        return self._read_queue_file(queue, ".sqs")

    def replace_sqs_meta(self, queue: QueueName, meta: dict[str, Any]) -> None:
        """Atomically replace the queue's ``.sqs`` file with ``meta`` (write, fsync, rename, fsync).

        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: The change could not be made durable.
        """
        self._require_queue(queue)
        self.disk.replace_json(self.layout.queue_dir(queue), ".sqs", meta)

    def list_queues(self, prefix: str = "") -> list[QueueName]:
        """Names of all queues starting with ``prefix``, sorted."""
        out = []
        with os.scandir(self.layout.queues) as it:
            for entry in it:
                if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(ValueError):
                        out.append(check_queue_name(entry.name))
        return sorted(out)

    def delete_queue(self, queue: QueueName) -> None:
        """Delete a queue and every message in it.

        The queue directory is renamed into ``remove/`` in one step (consumers
        see it vanish at once; mq-reaper removes the tree), then the queue's
        in-flight files in ``delay/`` sent before the millisecond of the
        store's clock follow it (later ones may belong to a queue re-created
        since). In-flight files missed here (a receive racing the delete) are
        sent to ``remove/`` by mq-mover when they come due and their queue is gone.

        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: The deletion could not be made durable.
        """
        deleted_at = self.clock()
        target = self.layout.remove_path(f"{queue}.{uuid.uuid4().hex}{REMOVED_QUEUE_SUFFIX}")
        if not rename_if_present(self.layout.queue_dir(queue), target, "rename of the queue directory"):
            raise self._not_found(queue)
        for name in listdir(self.layout.delay):
            parsed = parse_in_flight_name(name)
            if parsed is not None and parsed.queue == queue and sent_ms_of(parsed.message_id) < deleted_at:
                self._move_to_remove(self.layout.delay_path(name), removed_name(queue, parsed.message_id))
        self.disk.sync_dir(self.layout.queues, "fsync after deleting a queue")
        self.disk.sync_dir(self.layout.remove, "fsync after deleting a queue")

    def scan_ready(self, queue: QueueName) -> list[str]:
        """File names of the ready messages of ``queue`` (a directory listing).

        Raises:
            QueueNotFound: No such queue.
        """
        try:
            return [n for n in listdir(self.layout.queue_dir(queue), missing_ok=False) if parse_ready_name(n)]
        except FileNotFoundError:
            raise self._not_found(queue) from None

    def list_queue_dir(self, queue: QueueName) -> list[str]:
        """Every file name in ``queues/<queue>/`` (ready names, ``.attributes``, ...), unfiltered: one ``listdir``.

        The daemon's index build filters and parses them in one pass
        (:class:`mqcore.index.Listing`); :meth:`scan_ready` is the filtered list.

        Raises:
            QueueNotFound: No such queue.
        """
        try:
            return listdir(self.layout.queue_dir(queue), missing_ok=False)
        except FileNotFoundError:
            raise self._not_found(queue) from None

    def policy(self, queue: QueueName) -> LeasePolicy:
        """The :class:`LeasePolicy` of ``queue`` from its ``.attributes`` and ``.purge`` files (two small reads).

        A queue that no longer exists gets the empty policy.
        """
        try:
            attrs = effective(self.get_attributes(queue), QueueAttributes())
        except QueueNotFound:
            return LeasePolicy()
        return LeasePolicy.for_queue(attrs, self.purged_before(queue))

    def purged_before(self, queue: QueueName) -> MessageId | None:
        """The id up to which ``queue`` was purged (its ``.purge`` marker), or None."""
        data = read_json(self.layout.purge_path(queue))
        if data is None:
            return None
        try:
            return check_message_id(data.get("purged_before_id"))  # type: ignore[arg-type]
        except ValueError:
            logger.error("ignoring malformed purge marker queue=%s", queue)
            return None
