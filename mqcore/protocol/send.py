"""Send (docs/protocol.md 6.2, 15.3, 15.4): write ``new/Q.ID``, fsync it, rename it into place, fsync the directory."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from mqcore import model
from mqcore.errors import MQError, StorageUnavailable
from mqcore.names import MessageId, QueueName, in_flight_name, new_lease_token
from mqcore.protocol._fs import storage_error
from mqcore.protocol.queues import Queues

#: Creates a send tries, each with a fresh id, when O_EXCL answers EEXIST (docs/protocol.md 13.2).
SEND_CREATE_ATTEMPTS = 3


@dataclass(slots=True)
class PendingMessage:
    """A message written and fsynced in ``new/`` but not yet in its queue (not changed once made).

    Not frozen: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    about three times the cost, and one is made per file sent (docs/performance.md, "Batch send").
    """

    queue: QueueName
    message_id: MessageId
    path: str


@dataclass(slots=True)
class SendEntry:
    """One message of a batch send (not changed once made: :func:`dataclasses.replace` makes another).

    Not frozen, as :class:`PendingMessage`: one is made per message sent.

    Attributes:
        body: The body bytes.
        content_type: Its Content-Type, or None.
        attributes: User message attributes (name -> string), already checked.
        delay_ms: Delay before it becomes visible, in ms (0 = ready at once).
        attribute_types: SQS DataType of attributes that are not plain ``String`` (section 15.13), or None.
        group_id: MessageGroupId, for a FIFO queue (section 19; required there, ignored elsewhere).
        dedup_id: MessageDeduplicationId, for a FIFO queue (None: content-based, if the queue allows it).
    """

    body: bytes
    content_type: str | None = None
    attributes: dict[str, str] | None = None
    delay_ms: int = 0
    attribute_types: dict[str, str] | None = None
    group_id: str | None = None
    dedup_id: str | None = None


class Sending(Queues):
    """The two steps of a send, for one message or a group-committed batch."""

    def write_new(
        self,
        queue: QueueName,
        body: bytes,
        content_type: str | None = None,
        attributes: dict[str, str] | None = None,
        message_id: MessageId | None = None,
        attribute_types: dict[str, str] | None = None,
        *,
        check_queue: bool = True,
        fsync: bool = True,
    ) -> PendingMessage:
        """Send, step 1: write the message to ``new/Q.ID`` (O_EXCL) and fsync it.

        Args:
            queue: The queue.
            body: The body bytes.
            content_type: Its Content-Type, or None.
            attributes: User message attributes (checked by the caller with
                :func:`mqcore.attributes.check_message_attributes`).
            message_id: An id taken from ``self.ids`` beforehand, so that a batch
                written by parallel threads keeps its entries' order; None
                takes the next id.
            attribute_types: SQS DataType of attributes that are not plain ``String`` (section 15.13).
            check_queue: False skips the check that the queue exists (one ``stat``), for a caller
                that checked: the daemon's savers check a batch's queue once for all its files. If
                the queue is gone anyway (deleted since), the file is written and the publish's
                rename finds that out (QueueNotFound, the file unlinked).
            fsync: False writes and closes the file without its fsync: the caller must make its data
                durable (``self.disk.syncfs_later``: one ``syncfs`` for many files) before it renames
                it into place (docs/protocol.md 6.2).
        Raises:
            QueueNotFound: The queue does not exist (nothing is written; only with ``check_queue``).
            StorageUnavailable: Create, write or fsync failed; the partial file
                is unlinked (or left for mq-reaper if even that fails).
        """
        if check_queue:
            self._require_queue(queue)
        message_id = message_id or self.ids.next_id()
        head = model.encode_header(len(body), content_type, attributes, queue, attribute_types)
        for attempt in range(1, SEND_CREATE_ATTEMPTS + 1):
            path = self.layout.new_path(queue, message_id)
            try:
                self.disk.write_file(
                    path, head, exists_ok_to_retry=attempt < SEND_CREATE_ATTEMPTS, body=body, sync=fsync
                )
            except FileExistsError:
                # Ids are unique, so the name is not another sender's file: GlusterFS without kernel caches
                # can answer EEXIST to both of two racing O_EXCL creates with no file left (docs/protocol.md
                # 13.2). Nothing of ours was created; a fresh id is a fresh name.
                message_id = self.ids.next_id()
                continue
            break
        return PendingMessage(queue, message_id, path)

    def publish(self, pending: PendingMessage, delay_ms: int = 0) -> None:
        """Send, step 2: rename ``new/Q.ID`` into place and fsync the directory it went to.

        ``delay_ms == 0``: to ``queues/Q/ID.0`` (ready). ``delay_ms > 0``: to
        ``delay/DL.Q.ID.0.LT`` with ``DL`` = the store's clock + ``delay_ms`` and a fresh lease
        token (a delayed send: mq-mover makes it ready when DL passes). Once this returns the
        message is durable. Directory fsyncs of concurrent publishers are group-committed.

        Raises:
            QueueNotFound: The queue was deleted meanwhile; the file is unlinked.
            StorageUnavailable: The rename or the directory fsync failed. After
                a failed fsync the message may or may not survive a power cut:
                the client must treat the send as failed (and may resend).
        """
        target_dir = self._publish_rename(pending, delay_ms, self.clock())
        self.disk.sync_dir(target_dir, "fsync of the directory")

    def rename_one(self, pending: PendingMessage, delay_ms: int) -> str:
        """:meth:`rename_many` of one message (a lone send): rename it into place; the directory to fsync.

        The caller must fsync the directory returned (``Disk.sync_dir`` or ``Disk.sync_dir_later``)
        before it calls the message sent. Delays count from the store's clock now.

        Raises:
            QueueNotFound: The queue was deleted meanwhile; the file is unlinked.
            StorageUnavailable: The rename failed (the file is unlinked).
        """
        return self._publish_rename(pending, delay_ms, self.clock() if delay_ms > 0 else 0)

    def _publish_rename(self, pending: PendingMessage, delay_ms: int, now: int, qdir: str | None = None) -> str:
        """The rename of :meth:`publish`, delays counted from ``now`` (epoch ms); returns the directory to fsync.

        ``qdir``: the queue's directory, if the caller has it (a batch's renames look it up once).
        """
        if qdir is None:
            qdir = self.layout.queue_dir(pending.queue)
        if delay_ms > 0:
            target_dir = self.layout.delay
            target = self.layout.delay_path(
                in_flight_name(now + delay_ms, pending.queue, pending.message_id, 0, new_lease_token())
            )
            if not os.path.isdir(qdir):
                with contextlib.suppress(OSError):
                    os.unlink(pending.path)
                raise self._not_found(pending.queue)
        else:
            target_dir = qdir
            target = f"{qdir}/{pending.message_id}.0"  # os.path.join(qdir, ready_name(id, 0)): qdir ends in a name
        try:
            os.rename(pending.path, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(pending.path)
            if not isinstance(exc, FileNotFoundError):
                raise storage_error("rename", exc) from exc
            if not os.path.isdir(qdir):
                raise self._not_found(pending.queue) from None
            raise StorageUnavailable("message file vanished from new/ before it was published") from None
        return target_dir

    def send(
        self,
        queue: QueueName,
        body: bytes,
        content_type: str | None = None,
        attributes: dict[str, str] | None = None,
        delay_ms: int = 0,
        attribute_types: dict[str, str] | None = None,
    ) -> MessageId:
        """Write, fsync and publish one message; return its id once it is durable.

        The arguments are :class:`SendEntry`'s fields (``delay_ms``: SQS DelaySeconds 0-900, here in ms).

        Raises:
            QueueNotFound: No such queue.
            StorageUnavailable: It could not be guaranteed stored.
        """
        pending = self.write_new(queue, body, content_type, attributes, attribute_types=attribute_types)
        self.publish(pending, delay_ms)
        return pending.message_id

    def publish_many(self, items: list[tuple[PendingMessage, int]]) -> list[MQError | None]:
        """Send, step 2 for several written messages: rename each into place, then fsync each target directory once.

        Args:
            items: ``(pending, delay_ms)`` pairs from :meth:`write_new` (which
                callers may run in parallel threads: each fsyncs its own file).
                Delays count from one reading of the store's clock.
        Returns:
            None for each published message, or its error (in order). A
            failed directory fsync fails every message renamed into that
            directory (it may or may not survive a power cut).
        """
        results, renamed = self.rename_many(items)
        for directory, indexes in renamed.items():
            try:
                self.disk.sync_dir(directory, "fsync of the directory")
            except StorageUnavailable as error:
                for i in indexes:
                    results[i] = error
        return results

    def rename_many(self, items: list[tuple[PendingMessage, int]]) -> tuple[list[MQError | None], dict[str, list[int]]]:
        """Send, step 2 without the directory fsyncs: rename each written message into place, in order.

        The caller must fsync every directory returned (``Disk.sync_dir`` or
        ``Disk.sync_dir_later``) before it calls any of these messages sent.

        Args:
            items: ``(pending, delay_ms)`` pairs from :meth:`write_new`; delays count from one
                reading of the store's clock.
        Returns:
            (None or the error of each item, in order; the indexes of the renamed items by the
            directory they went to).
        """
        now = self.clock()
        results: list[MQError | None] = [None] * len(items)
        renamed: dict[str, list[int]] = {}
        qdirs: dict[QueueName, str] = {}
        for i, (pending, delay_ms) in enumerate(items):
            qdir = qdirs.get(pending.queue)
            if qdir is None:
                qdir = qdirs[pending.queue] = self.layout.queue_dir(pending.queue)
            try:
                renamed.setdefault(self._publish_rename(pending, delay_ms, now, qdir), []).append(i)
            except MQError as exc:
                results[i] = exc
        return results, renamed

    def send_batch(self, queue: QueueName, entries: list[SendEntry]) -> list[MessageId | MQError]:
        """Send several messages with one group commit; return each entry's id or error, in order.

        Every file is written and fsynced, all are renamed into place, then
        each target directory (the queue's, and ``delay/`` for delayed
        entries) is fsynced once. An entry whose step fails gets its error;
        the others are unaffected, except that a failed directory fsync fails
        every entry renamed into that directory.

        Raises:
            QueueNotFound: No such queue (nothing is written).
        """
        self._require_queue(queue)
        results: list[MessageId | MQError] = []
        written: list[tuple[int, PendingMessage, int]] = []
        for i, entry in enumerate(entries):
            try:
                pending = self.write_new(
                    queue, entry.body, entry.content_type, entry.attributes, attribute_types=entry.attribute_types
                )
            except MQError as exc:
                results.append(exc)
                continue
            results.append(pending.message_id)
            written.append((i, pending, entry.delay_ms))
        published = self.publish_many([(pending, delay_ms) for _, pending, delay_ms in written])
        for (i, _, _), outcome in zip(written, published, strict=True):
            if outcome is not None:
                results[i] = outcome
        return results
