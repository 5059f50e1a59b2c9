"""Receipt handles (docs/protocol.md 15.6): find a lease, change its visibility, delete by it, receive again.

A receipt handle is the ``delay/`` name its receive made; a change of
visibility renames the file to a new deadline and keeps the lease key
(``Q.ID.RC.LT``), so a handle names exactly one lease for its whole life.
Methods take a parsed :class:`~mqcore.names.ReceiptHandle` (parsed once, where
the handle entered: an HTTP route, a client call, an attempt record read from disk)
and check that it is of the queue named.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from mqcore.errors import InvalidReceiptHandle, MessageNotFound, MessageNotInFlight, MQError, StaleReceiptHandle
from mqcore.model import ReceivedMessage
from mqcore.names import (
    InFlightName,
    QueueName,
    ReceiptHandle,
    in_flight_name,
    parse_in_flight_name,
    parse_ready_name,
    ready_name,
    removed_name,
)
from mqcore.protocol._fs import listdir, storage_error
from mqcore.protocol.leases import Leases
from mqcore.protocol.policy import LeasePolicy


class Handles(Leases):
    """What a receipt handle lets its holder do to the one lease it names."""

    @staticmethod
    def _handle(queue: QueueName, handle: ReceiptHandle) -> ReceiptHandle:
        """``handle``, if it is of ``queue``.

        Raises:
            InvalidReceiptHandle: Of another queue.
        """
        return handle.check(queue)

    def find_lease(self, queue: QueueName, handle: ReceiptHandle, hint: str | None = None) -> str | None:
        """The current ``delay/`` name of the lease ``handle`` made, or None if that lease is over.

        Tries the handle itself (no change of visibility since), then ``hint``
        (a name remembered by the caller; ignored unless it has the handle's
        lease key), then lists ``delay/`` for a name with the handle's lease
        key (:attr:`~mqcore.names.InFlightName.lease_key`). Never another lease
        of the same message.

        Raises:
            InvalidReceiptHandle: Of another queue.
        """
        parsed = self._handle(queue, handle)
        return self._present(self._candidates(parsed, hint)) or self._search_lease(parsed.lease)

    def find_leases(
        self, queue: QueueName, handles: Sequence[ReceiptHandle], hints: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Current ``delay/`` names of the leases several handles made, with at most one listing of ``delay/``.

        Like :meth:`find_lease` for each handle, but the handles neither found
        by name nor by ``hints`` (handle text -> remembered name) share one
        listing. Handles of other queues are left out.

        Returns:
            handle text -> current ``delay/`` name, for the leases still in flight.
        """
        found: dict[str, str] = {}
        wanted: dict[str, str] = {}  # lease key "Q.ID.RC.LT" -> handle text
        for handle in handles:
            try:
                parsed = self._handle(queue, handle)
            except InvalidReceiptHandle:
                continue
            current = self._present(self._candidates(parsed, (hints or {}).get(parsed.text)))
            if current is not None:
                found[parsed.text] = current
            else:
                wanted[parsed.lease_key] = parsed.text
        if wanted:
            for name in listdir(self.layout.delay):
                text = wanted.get(name[name.find(".") + 1 :])  # the key follows "DL."; parsed only on a hit
                if text is not None and parse_in_flight_name(name) is not None:
                    found[text] = name
        return found

    def _present(self, names: list[str]) -> str | None:
        """The first of ``names`` that exists in ``delay/``, or None."""
        return next((n for n in names if os.path.lexists(self.layout.delay_path(n))), None)

    def _search_lease(self, parsed: InFlightName) -> str | None:
        """The ``delay/`` name with the lease key of ``parsed`` (one listing), or None."""
        key = parsed.lease_key
        for name in listdir(self.layout.delay):
            if name.endswith(key):
                item = parse_in_flight_name(name)
                if item is not None and item.lease_key == key:
                    return name
        return None

    @staticmethod
    def _candidates(handle: ReceiptHandle, hint: str | None) -> list[str]:
        """The handle, then ``hint`` if it names the same lease (same lease key), never another lease."""
        if not hint or hint == handle.text:
            return [handle.text]
        hinted = parse_in_flight_name(hint)
        if hinted is None or hinted.lease_key != handle.lease_key:
            return [handle.text]
        return [handle.text, hint]

    def change_visibility(
        self,
        queue: QueueName,
        handle: ReceiptHandle,
        visibility_timeout_ms: int,
        hint: str | None = None,
    ) -> str:
        """Extend, shorten or end the lease ``handle`` made (SQS: ChangeMessageVisibility).

        The new deadline counts from the store's clock (:meth:`at` fixes it, e.g.
        to the time a caller answers with). The rename of the lease's
        current ``delay/`` file is the compare-and-swap: if mq-mover
        redelivered it first, the rename fails and nothing changes. The
        lease keeps its key (``Q.ID.RC.LT``): only the deadline in the name
        changes, so the handle keeps naming this lease and no other.

        Args:
            queue: The queue (must be the handle's).
            handle: Receipt handle from a receive.
            visibility_timeout_ms: New timeout from now, in ms; 0 makes the
                message ready at once (renamed straight back into its queue).
            hint: The lease's current ``delay/`` name if the caller remembers it.
        Returns:
            The lease's new ``delay/`` name (usable as the handle from now on;
            the old one keeps working); for a release, the handle's text unchanged.
        Raises:
            InvalidReceiptHandle: Of another queue.
            MessageNotInFlight: The lease expired and the message is ready again, not yet received.
            StaleReceiptHandle: The message was received again since.
            MessageNotFound: The message is gone (deleted, dead-lettered, purged, expired).
            QueueNotFound: The queue was deleted.
        """
        parsed = self._handle(queue, handle)
        lease = parsed.lease
        if visibility_timeout_ms > 0:
            new_name = in_flight_name(
                self.clock() + visibility_timeout_ms, queue, lease.message_id, lease.receive_count, lease.token
            )
            target = self.layout.delay_path(new_name)
        else:
            new_name = parsed.text
            target = self.layout.ready_path(queue, lease.message_id, lease.receive_count)
        names = self._candidates(parsed, hint)
        for attempt in range(2):
            for name in names:
                try:
                    os.rename(self.layout.delay_path(name), target)
                    return new_name
                except FileNotFoundError:
                    if os.path.lexists(self.layout.delay_path(name)):
                        raise self._not_found(queue) from None
                except OSError as exc:
                    raise storage_error("rename for change of visibility", exc) from exc
            found = self._search_lease(lease) if attempt == 0 else None
            if found is None:
                break
            names = [found]
        raise self._lease_over(lease, in_flight_ok=False)

    def delete_by_handle(
        self, queue: QueueName, handle: ReceiptHandle, hint: str | None = None, *, sync: bool = True
    ) -> str:
        """Delete the message ``handle`` received, only if no later receive took it (SQS: DeleteMessage).

        Tries the lease's ``delay/`` file (the handle, ``hint``, then a listing
        of ``delay/`` for the handle's lease key: exactly this lease, never
        another lease of the message), then ``queues/Q/ID.RC`` with the
        handle's receive count (the lease expired but nobody received the
        message since, so this handle is still the latest). ``remove/`` is
        fsynced before returning, unless ``sync`` is False: then the caller
        fsyncs ``remove/`` itself before it tells anyone the message is deleted
        (the daemon's group commit of a batch of deletes).

        Returns:
            ``"in_flight"`` or ``"ready"``: where the message was.
        Raises:
            InvalidReceiptHandle: Of another queue.
            StaleReceiptHandle: The message was received again since (the newer lease is untouched).
            MessageNotFound: The message is gone.
            QueueNotFound: The queue was deleted.
        """
        parsed = self._handle(queue, handle)
        lease = parsed.lease
        target = removed_name(queue, lease.message_id)
        where = None
        for name in self._candidates(parsed, hint):
            if self._move_to_remove(self.layout.delay_path(name), target):
                where = "in_flight"
                break
        if where is None:
            found = self._search_lease(lease)
            if found is not None and self._move_to_remove(self.layout.delay_path(found), target):
                where = "in_flight"
        if where is None:
            ready = self.layout.ready_path(queue, lease.message_id, lease.receive_count)
            if self._move_to_remove(ready, target):
                where = "ready"
        if where is None:
            raise self._lease_over(lease, in_flight_ok=True)
        if sync:
            self.disk.sync_dir(self.layout.remove, "fsync of remove/")
        return where

    def _lease_over(self, parsed: InFlightName, *, in_flight_ok: bool) -> MQError:
        """The error that says why the lease of ``parsed`` cannot be acted on (for the caller to raise).

        Stale: the message has a file with a higher receive count, or another
        lease (another lease key) with the same one (a receive made again
        after a power cut undid this handle's lease).
        """
        queue, message_id, count = parsed.queue, parsed.message_id, parsed.receive_count
        qdir = self.layout.queue_dir(queue)
        if not in_flight_ok and os.path.lexists(os.path.join(qdir, ready_name(message_id, count))):
            return MessageNotInFlight(
                f"message {message_id} is not in flight: its visibility timeout expired and it is ready again",
                queue=queue,
                message_id=message_id,
            )
        later = 0
        rival = False  # another lease with this receive count
        infix = f".{queue}.{message_id}."
        for name in listdir(self.layout.delay):
            if infix in name:
                item = parse_in_flight_name(name)
                if item is not None and item.queue == queue and item.message_id == message_id:
                    later = max(later, item.receive_count)
                    rival = rival or (item.receive_count == count and item.lease_key != parsed.lease_key)
        if later <= count:
            prefix = f"{message_id}."
            for name in listdir(qdir):
                if name.startswith(prefix):
                    ready = parse_ready_name(name)
                    if ready is not None:
                        later = max(later, ready[1])
        if later > count:
            return StaleReceiptHandle(
                f"message {message_id} was received again since this receipt handle was issued "
                f"(receive {later} > {count})",
                queue=queue,
                message_id=message_id,
                receive_count=later,
            )
        if rival:
            return StaleReceiptHandle(
                f"message {message_id} is in flight under another receive than this receipt handle's "
                f"(receive {count} was made again)",
                queue=queue,
                message_id=message_id,
                receive_count=count,
            )
        if not self.queue_exists(queue):
            return self._not_found(queue)
        return MessageNotFound(
            f"message {message_id} is no longer in queue {queue!r} (deleted, dead-lettered, purged or expired)",
            queue=queue,
            message_id=message_id,
        )

    def relet(
        self,
        queue: QueueName,
        handle: ReceiptHandle,
        visibility_timeout_ms: int,
        policy: LeasePolicy | None = None,
        hint: str | None = None,
        search: bool = True,
    ) -> ReceivedMessage | None:
        """Receive again the message an earlier receive got (a retried receive request attempt).

        ``search=False`` skips the listing of ``delay/`` when neither the handle
        nor ``hint`` names the lease (the caller already searched, e.g. with
        :meth:`find_leases` for a whole batch).

        The message is taken from its lease's ``delay/`` file, or from
        ``queues/Q/ID.RC`` if that lease expired and nobody received it
        since, and leased afresh (receive count + 1, a new handle).

        Returns:
            The message, or None if it is gone or was received by someone else since.
        Raises:
            InvalidReceiptHandle: Of another queue.
        """
        parsed = self._handle(queue, handle)
        message_id, count = parsed.message_id, parsed.lease.receive_count
        ready = self.layout.ready_path(queue, message_id, count)
        current = self._present(self._candidates(parsed, hint))
        if current is None and search:
            current = self._search_lease(parsed.lease)
        if current is not None:
            message = self._take(
                queue, self.layout.delay_path(current), message_id, count, visibility_timeout_ms, policy
            )
            if message is not None or not os.path.lexists(ready):
                return message
            # mq-mover made it ready between the lookup and the take: take it from there.
        return self._take(queue, ready, message_id, count, visibility_timeout_ms, policy)
