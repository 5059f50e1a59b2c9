"""Receive (docs/protocol.md 6.3, 15.5): lease a ready file by renaming it into ``delay/``, or dead-letter it."""

from __future__ import annotations

import errno
import logging
import os
import stat

from mqcore import model
from mqcore.model import ReceivedMessage
from mqcore.names import (
    MessageId,
    QueueName,
    in_flight_name,
    new_lease_token,
    parse_ready_name,
    ready_name,
    removed_name,
)
from mqcore.protocol._fs import lost_race, read_all, storage_error
from mqcore.protocol.policy import LeasePolicy
from mqcore.protocol.queues import Queues

logger = logging.getLogger(__name__)


def _read_file(fd: int, size: int) -> bytes:
    """The whole file ``fd`` whose ``fstat`` said ``size`` bytes: one ``read`` in the usual case.

    A message file never changes once published, so ``size`` bytes read are
    all of it; a short read (a network filesystem may give one) reads on to
    the end, as :func:`~mqcore.protocol._fs.read_all` does.
    """
    data = os.read(fd, size) if size > 0 else b""
    return data if len(data) == size and size > 0 else data + read_all(fd)


class Leases(Queues):
    """Taking a message: ready (or in flight, for a re-let) -> a fresh lease in ``delay/``."""

    def lease(
        self,
        queue: QueueName,
        filename: str,
        visibility_timeout_ms: int,
        policy: LeasePolicy | None = None,
    ) -> ReceivedMessage | None:
        """Receive: rename ready ``queues/Q/ID.RC`` to ``delay/DL.Q.ID.RC+1.LT`` and read it.

        ``LT`` is a fresh lease token (:func:`mqcore.names.new_lease_token`), so
        the target name is this receive's alone: two receives racing for the
        file (on this host or another, in the same millisecond) aim at two
        different names, and the rename of the one source succeeds once.
        ``DL`` is the store's clock plus ``visibility_timeout_ms``.

        With a ``policy``, a message that was purged or outlived the retention
        period is moved to ``remove/``, and one already received
        ``max_receive_count`` times is moved to the dead-letter queue
        (``queues/DLQ/ID.RC``), instead of being delivered.

        On a first receive (RC 0) the file's mtime is set to the receive time:
        it is the message's ApproximateFirstReceiveTimestamp from then on.

        Args:
            queue: The queue.
            filename: A ready file name ``ID.RC`` (from the index).
            visibility_timeout_ms: How long the message stays invisible, in ms.
            policy: Dead-letter, retention and purge rules of the queue.
        Returns:
            The message, or None if the file was gone (another consumer or a
            delete got it first; also when the rename returned 0 but the lease's
            name is absent afterwards, docs/protocol.md 13.5), unreadable (moved to ``remove/`` if torn),
            or removed or dead-lettered by the policy.
        """
        parsed = parse_ready_name(filename)
        if parsed is None:
            return None
        message_id, count = parsed
        src = f"{self.layout.queue_dir(queue)}/{filename}"  # mq's absolute directory, a checked name: no join needed
        return self._take(queue, src, message_id, count, visibility_timeout_ms, policy)

    def _take(
        self,
        queue: QueueName,
        src: str,
        message_id: MessageId,
        count: int,
        visibility_timeout_ms: int,
        policy: LeasePolicy | None,
    ) -> ReceivedMessage | None:
        """Lease the file at ``src`` (ready, or in flight for a re-let) as receive number ``count + 1``."""
        now = self.clock()
        if policy is not None:
            if policy.is_gone(message_id, now):
                self._move_to_remove(src, removed_name(queue, message_id))
                return None
            dead_letter_queue = policy.dead_letter_for(count)
            if dead_letter_queue is not None and self._dead_letter_path(src, dead_letter_queue, message_id, count):
                logger.info(
                    "dead-lettered queue=%s id=%s receives=%d dlq=%s", queue, message_id, count, dead_letter_queue
                )
                return None
        try:
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ESTALE):
                raise storage_error("open for receive", exc) from exc
            lost_race("open", exc)  # moved by someone else (ESTALE: by another host, section 13.3): taken
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                logger.warning("ignoring foreign entry in queue=%s path=%s (not a file)", queue, src)
                return None
            deadline = now + visibility_timeout_ms
            leased = in_flight_name(deadline, queue, message_id, count + 1, new_lease_token())
            leased_path = f"{self.layout.delay}/{leased}"
            try:
                os.rename(src, leased_path)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ESTALE):
                    raise
                # Someone else moved the file between the open and the rename (ESTALE: another host, section
                # 13.3). Had our rename happened after all, the lease name is ours alone and the mover
                # redelivers it at its deadline.
                lost_race("rename", exc)
                return None
            if self.renames_may_lie and not os.path.lexists(leased_path):
                # The rename said 0 but nothing was renamed: GlusterFS's FUSE client answers a rename whose source
                # another host moved away meanwhile with error 0 ("src resolution failed", section 13.5). The
                # file we opened is someone else's lease now: taken. (A lease name is ours alone, so only such a
                # phantom rename, or a delete or redelivery of the lease since, leaves it absent: taken too.)
                # A local filesystem's rename(2) returns 0 only when it renamed: no check there.
                lost_race("rename", OSError(errno.ENOENT, "lease name absent after its rename"))
                return None
            if count == 0:
                first_receive_ms = now
                try:
                    os.utime(fd, ns=(now * 1_000_000, now * 1_000_000))
                except OSError:
                    pass
            else:
                first_receive_ms = st.st_mtime_ns // 1_000_000
            data = _read_file(fd, st.st_size)
        except OSError as exc:
            raise storage_error("receive", exc) from exc
        finally:
            os.close(fd)
        try:
            header, body = model.decode(data)
        except model.CorruptMessage as exc:
            logger.error("corrupt message file removed queue=%s id=%s error=%s", queue, message_id, exc)
            self._move_to_remove(leased_path, removed_name(queue, message_id))
            return None
        if "attributes" in header or "attribute_types" in header:
            attributes, types = model.header_attributes(header), model.header_attribute_types(header)
        else:  # the usual message: no attributes (two lookups instead of two calls)
            attributes, types = {}, {}
        return model.received_message(  # ReceivedMessage's fields in order, without its frozen __init__
            queue,
            message_id,
            body,
            model.header_content_type(header),
            count + 1,  # receive_count
            deadline,  # deadline_ms
            leased,  # in_flight_name
            attributes,
            first_receive_ms,
            model.header_source_queue(header),  # source_queue
            types,  # attribute_types
        )

    def _dead_letter_path(self, src: str, dead_letter_queue: QueueName, message_id: MessageId, count: int) -> bool:
        """Rename ``src`` to ``queues/DLQ/ID.RC``; False if ``src`` is gone or the dead-letter queue does not exist."""
        new_id = self._id_outside_purge(dead_letter_queue, message_id)
        target = os.path.join(self.layout.queue_dir(dead_letter_queue), ready_name(new_id, count))
        try:
            os.rename(src, target)
            return True
        except FileNotFoundError:
            if os.path.lexists(src):  # the caller decides what to do (and logs it)
                logger.debug("dead-letter queue %s does not exist (message %s)", dead_letter_queue, message_id)
            return False
        except OSError as exc:
            raise storage_error("rename into the dead-letter queue", exc) from exc

    def _id_outside_purge(self, queue: QueueName, message_id: MessageId) -> MessageId:
        """The id a message moved into ``queue`` must have so that ``queue``'s purge marker does not cover it.

        A purge covers ids up to its marker, and a dead-lettered or redriven
        message keeps its (older) id; moved into a queue purged after it was
        sent, it would be removed as purged. Such a message gets a fresh id
        instead (the file name is the only place the id lives), so it is
        placed after the messages already there.
        """
        purged = self.purged_before(queue)
        if purged is None or message_id > purged:
            return message_id
        new_id = self.ids.next_id()
        logger.info("new id for a message moved into purged queue=%s id=%s new_id=%s", queue, message_id, new_id)
        return new_id
