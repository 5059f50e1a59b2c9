"""Sweeps (docs/protocol.md 6.7, 6.8, 15.11): counts, retention, and what dead writers left (mq-reaper).

Every age is judged by the store's clock.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from mqcore.names import (
    STAGING_SUFFIX,
    QueueName,
    parse_in_flight_name,
    parse_ready_name,
    removed_name,
    sent_ms_of,
)
from mqcore.protocol._fs import listdir, mtime_ms, unlink_if_older
from mqcore.protocol.bulk import is_bulk_record_name, sweep_bulk_record
from mqcore.protocol.policy import LeasePolicy
from mqcore.protocol.queues import Queues

logger = logging.getLogger(__name__)

#: Age after which a temporary metadata file (``.NAME.TOKEN.tmp``) belongs to a writer that died, in ms.
TMP_GRACE_MS = 300_000


#: Ready names (and dot names) :meth:`Sweeps.sweep_queue` reads between two calls of its ``pause``.
SWEEP_CHUNK = 1024
#: Sorts above every ready name (ids are lowercase hex and dashes).
_ABOVE_ALL_NAMES = "~"
#: Sorts below every message id (ids are lowercase hex and dashes): a bound that no name is at or below.
_BELOW_ALL_IDS = ""
#: The largest 48-bit send time of a UUIDv7 (its first 12 hex digits).
_MAX_SENT_MS = (1 << 48) - 1


def gone_bounds(policy: LeasePolicy, now: int) -> tuple[str, str]:
    """Two string bounds that every ready name ``ID.RC`` whose message is gone at ``now`` falls under.

    A message is gone (:meth:`LeasePolicy.is_gone`) when its id is at or
    below the purge marker's id, or when its send time (the id's first 48
    bits, ``xxxxxxxx-xxxx``) plus the retention period is at or before
    ``now``. Ids are lowercase hex at fixed places, so they sort as their
    numbers: a gone message's name has ``name[:13] <= sent_bound`` or
    ``name[:36] <= purge_bound``, and a name above both needs no parse.
    The bounds only pre-filter; :meth:`LeasePolicy.is_gone` decides.

    Args:
        policy: The queue's policy (retention in ms, purge marker).
        now: The time judged by, epoch ms.
    Returns:
        ``(sent_bound, purge_bound)``: ``"xxxxxxxx-xxxx"`` of the latest send
        time that has outlived the retention, and the purge marker's id;
        either is ``""`` (below every name) when nothing can be gone that way.
    """
    sent_bound = _BELOW_ALL_IDS
    if policy.retention_ms is not None and now - policy.retention_ms >= 0:
        h = f"{min(now - policy.retention_ms, _MAX_SENT_MS):012x}"
        sent_bound = f"{h[:8]}-{h[8:]}"
    return sent_bound, policy.purged_before or _BELOW_ALL_IDS


@dataclass(frozen=True, slots=True)
class QueueSweep:
    """What :meth:`Sweeps.sweep_queue` did to one queue directory."""

    moved: int
    """Ready messages moved to ``remove/``."""
    due_ms: int | None
    """Epoch ms before which none of the ready messages the sweep left can be gone by retention (the oldest
    one's send time plus the retention period); None if it left none (or the queue has no retention);
    the sweep's own time if it stopped midway or met temporary files or bulk lease records (they
    expire by their own clocks). A purge or an attribute change renames a file in the directory, and
    any message added changes it too, so while the directory is unchanged nothing of it is gone before
    this time."""


class Sweeps(Queues):
    """Work over whole directories: counting ``delay/``, expiring messages, removing leftovers and ``remove/``."""

    def count_delay(self, queue: QueueName | None = None) -> dict[QueueName, tuple[int, int]]:
        """``{queue: (in_flight, delayed)}`` from one listing of ``delay/`` (only ``queue`` if given).

        In flight = receive count >= 1; delayed = a delayed send not yet visible (receive count 0).
        """
        counts: dict[QueueName, list[int]] = {}
        for name in listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is None or (queue is not None and item.queue != queue):
                continue
            pair = counts.setdefault(item.queue, [0, 0])
            pair[0 if item.receive_count else 1] += 1
        return {q: (a, b) for q, (a, b) in counts.items()}

    def expire_queue(self, queue: QueueName) -> int:
        """Move ready messages of ``queue`` that were purged or outlived its retention period to ``remove/``.

        :meth:`sweep_queue` without pauses; see there. Used by mq-reaper's tests and tools.

        Returns:
            Number of messages moved.
        """
        return self.sweep_queue(queue).moved

    def sweep_queue(self, queue: QueueName, pause: Callable[[], bool] | None = None) -> QueueSweep:
        """Move ready messages of ``queue`` that were purged or outlived its retention period to ``remove/``.

        Also unlinks temporary metadata files (``.NAME.TOKEN.tmp``) older than
        the attempt window, left by a writer that died, and bulk lease records
        past their deadline. Used by mq-reaper.

        The directory is read with ``scandir`` in chunks of :data:`SWEEP_CHUNK`
        names; ``pause`` is called between two chunks (mq-reaper sleeps there, so
        that sweeping a queue of 1,000,000 ready messages is not a second of
        CPU taken at once beside mq: issue 12). When it returns False the sweep
        ends there (what it did not reach is left for the next sweep).

        Args:
            queue: The queue.
            pause: Called between chunks; False stops the sweep.
        Returns:
            What was moved, and until when nothing listed can be gone (see :class:`QueueSweep`).
        """
        now = self.clock()
        policy = self.policy(queue)
        qdir = self.layout.queue_dir(queue)
        sent_bound, purge_bound = gone_bounds(policy, now)
        moved = 0
        oldest = _ABOVE_ALL_NAMES  # the lowest ready name left in the directory
        records = complete = False
        try:
            with os.scandir(qdir) as entries:
                for count, entry in enumerate(entries, 1):
                    if pause is not None and not count % SWEEP_CHUNK and not pause():
                        break
                    name = entry.name
                    if name[:1] == ".":
                        if name.endswith(".tmp"):
                            records = True
                            unlink_if_older(os.path.join(qdir, name), now - TMP_GRACE_MS)
                        elif is_bulk_record_name(name):  # a bulk lease record past its deadline (docs/protocol.md 20)
                            records = True
                            sweep_bulk_record(os.path.join(qdir, name), now)
                        continue
                    # Only a name at or below a bound can be gone: a string compare, not a parse, per name
                    # (a start-up sweep of 1,000,000 ready messages parsed every one: issue 12).
                    if name[:13] > sent_bound and name[:36] > purge_bound:
                        if name < oldest:
                            oldest = name
                        continue
                    parsed = parse_ready_name(name)
                    if parsed is not None and policy.is_gone(parsed[0], now):
                        moved += self._move_to_remove(os.path.join(qdir, name), removed_name(queue, parsed[0]))
                    elif name < oldest:
                        oldest = name
                else:
                    complete = True
        except FileNotFoundError:
            complete = True  # the queue is gone: nothing of it can expire
        parsed = parse_ready_name(oldest)
        due: int | None = now  # stopped midway, leftovers that expire by their own clocks, or a foreign name
        if complete and not records and (oldest == _ABOVE_ALL_NAMES or policy.retention_ms is None):
            due = None
        elif complete and not records and parsed is not None and policy.retention_ms is not None:
            due = sent_ms_of(parsed[0]) + policy.retention_ms
        return QueueSweep(moved, due)

    def expire_in_flight(self) -> int:
        """Move files in ``delay/`` whose message was purged or outlived its queue's retention to ``remove/``.

        Files of queues that no longer exist are left to mq-mover (it moves
        them to ``remove/`` when they come due). Used by mq-reaper.

        Returns:
            Number of messages moved.
        """
        now = self.clock()
        policies: dict[QueueName, LeasePolicy] = {}
        moved = 0
        for name in listdir(self.layout.delay):
            item = parse_in_flight_name(name)
            if item is None:
                continue
            policy = policies.get(item.queue)
            if policy is None:
                policy = policies[item.queue] = self.policy(item.queue)
            if policy.is_gone(item.message_id, now):
                moved += self._move_to_remove(self.layout.delay_path(name), removed_name(item.queue, item.message_id))
        return moved

    def sweep_staging(self, older_than_ms: int) -> int:
        """Remove staging directories ``queues/.Q.TOKEN.creating`` older than ``older_than_ms`` (a creator died)."""
        removed = 0
        staging = [n for n in listdir(self.layout.queues) if n.startswith(".") and n.endswith(STAGING_SUFFIX)]
        for name in self._older_than(self.layout.queues, staging, older_than_ms):
            shutil.rmtree(os.path.join(self.layout.queues, name), ignore_errors=True)
            removed += 1
        return removed

    def sweep_new(self, older_than_ms: int) -> list[str]:
        """Unlink files in ``new/`` older than ``older_than_ms`` (writers that died).

        A sender answers 201 only after its file left ``new/``, so a file that
        sits there longer than any write takes was never acknowledged: it is
        removed, never delivered. Foreign names get the same grace period (a
        writer of a newer protocol version may be using them).

        Returns:
            The names unlinked.
        """
        removed = []
        for name in self._older_than(self.layout.new, listdir(self.layout.new), older_than_ms):
            try:
                os.unlink(os.path.join(self.layout.new, name))
                removed.append(name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("cannot remove stale entry in new/ name=%s error=%s", name, exc)
        return removed

    def _older_than(self, directory: str, names: list[str], age_ms: int) -> list[str]:
        """Those of ``names`` in ``directory`` whose mtime is ``age_ms`` or more before the store's clock."""
        cutoff = self.clock() - age_ms
        old = []
        for name in names:
            try:
                if mtime_ms(os.path.join(directory, name)) <= cutoff:
                    old.append(name)
            except FileNotFoundError:
                continue
        return old

    def scan_removed(self) -> list[str]:
        """Names in ``remove/``."""
        return listdir(self.layout.remove)

    def reap_many(self, names: list[str]) -> list[tuple[str, bool | OSError | ValueError, int]]:
        """:meth:`reap` for each of ``names``, relative to one descriptor of ``remove/``; with each file's size.

        Each file costs one ``fstatat`` (its size, for mq-reaper's byte counts) and one ``unlinkat``
        relative to ``remove/`` (the kernel does not walk the root's path for each); a directory
        (a removed queue) goes through :meth:`reap`.

        Returns:
            Per name, in order: (name, True if removed / False if already gone / the error it met, its
            size in bytes before the unlink: 0 if unknown or a directory).
        Raises:
            OSError: ``remove/`` itself cannot be opened (nothing was removed).
        """
        out: list[tuple[str, bool | OSError | ValueError, int]] = []
        fd = os.open(self.layout.remove, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            stat, unlink = os.stat, os.unlink
            for name in names:
                try:
                    _check_remove_name(name)
                except ValueError as exc:
                    out.append((name, exc, 0))
                    continue
                try:
                    size = stat(name, dir_fd=fd, follow_symlinks=False).st_size
                except OSError:
                    size = 0
                try:
                    unlink(name, dir_fd=fd)
                    out.append((name, True, size))
                except FileNotFoundError:
                    out.append((name, False, 0))
                except OSError:  # a directory (EISDIR; EPERM on some systems), or a real error: reap() tells
                    try:
                        out.append((name, self.reap(name), 0))
                    except OSError as exc:
                        out.append((name, exc, 0))
        finally:
            os.close(fd)
        return out

    def reap(self, name: str) -> bool:
        """Unlink ``remove/<name>`` (a removed queue directory is removed whole).

        Returns:
            True if something was removed, False if it was already gone.
        Raises:
            ValueError: ``name`` is empty, ``.``, ``..`` or has a ``/`` (it
                would address something outside ``remove/``).
        """
        _check_remove_name(name)
        path = self.layout.remove_path(name)
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            pass
        except PermissionError:
            if not os.path.isdir(path):
                raise
        shutil.rmtree(path, ignore_errors=True)
        return True


def _check_remove_name(name: str) -> None:
    """Refuse a name that would address something outside ``remove/`` (:meth:`Sweeps.reap`, ``reap_many``).

    Raises:
        ValueError: ``name`` is empty, ``.``, ``..``, or has a ``/`` or a NUL.
    """
    if not name or name in {".", ".."} or "/" in name or "\0" in name:
        raise ValueError(f"not a name inside remove/: {name!r}")
