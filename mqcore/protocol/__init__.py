"""The storage protocol: every transition a message file makes, as plain ``os`` calls.

One synchronous implementation, shared by the daemons (which call it from
worker threads) and by anything that works on a root directly. Each public
method of :class:`Store` is one transition of ``docs/protocol.md``; the
section names match.

Every transition after the first write is a ``rename(2)``: whoever renames a
file first owns the transition, and a failed rename (ENOENT) means somebody
else got there first. Nothing here holds a lock on disk, so a process killed
at any point leaves only states that the other transitions recover from.

The package is split by concern; :class:`Store` joins the parts:

- ``_fs``: the file steps every transition repeats (durable create, atomic
  replace, group-committed directory fsync, ``OSError`` -> ``StorageUnavailable``).
- ``_base``: the root, the id generator, the clock and the disk of one store.
- ``policy``: pure decisions taking the time (:class:`LeasePolicy`, :func:`iter_due`).
- ``queues``: queues and their metadata files.      ``send``: write, fsync, publish.
- ``leases``: receive (lease) and dead-lettering.   ``handles``: what a receipt handle does.
- ``attempts``: receive request attempt records.     ``delete``: delete by id, purge.
- ``peek``: reading messages in place.               ``redrive``: moving dead letters back.
- ``redelivery``: mq-mover's transitions.            ``sweeps``: mq-reaper's sweeps and counts.
- ``bulk``: bulk lease records (many leases under one key, issue 17).
"""

from __future__ import annotations

from mqcore.limits import DEFAULT_PEEK_LIMIT, MAX_PEEK_LIMIT
from mqcore.protocol._base import Clock, now_ms
from mqcore.protocol._fs import STORAGE_ERRNOS, STORAGE_HOOKS, DirSyncer, StorageHooks
from mqcore.protocol.attempts import Attempts
from mqcore.protocol.bulk import BulkLeases, BulkRecord
from mqcore.protocol.delete import Deletes
from mqcore.protocol.peek import PeekedFile, Peeking
from mqcore.protocol.policy import LeasePolicy, iter_due
from mqcore.protocol.redelivery import Redelivery
from mqcore.protocol.redrive import Redrives
from mqcore.protocol.send import SEND_CREATE_ATTEMPTS, PendingMessage, SendEntry, Sending
from mqcore.protocol.sweeps import TMP_GRACE_MS, Sweeps

__all__ = [
    "DEFAULT_PEEK_LIMIT",
    "MAX_PEEK_LIMIT",
    "SEND_CREATE_ATTEMPTS",
    "STORAGE_ERRNOS",
    "STORAGE_HOOKS",
    "TMP_GRACE_MS",
    "BulkRecord",
    "Clock",
    "DirSyncer",
    "LeasePolicy",
    "PeekedFile",
    "PendingMessage",
    "SendEntry",
    "StorageHooks",
    "Store",
    "iter_due",
    "now_ms",
]


class Store(Sending, BulkLeases, Redelivery, Attempts, Deletes, Peeking, Redrives, Sweeps):
    """The protocol on one root directory: every transition of docs/protocol.md, one method each.

    Each concern is a class of its own module (see the package docstring); a
    ``Store`` is all of them over one root, one id generator, one clock and one
    group commit of directory fsyncs. Thread-safe: it keeps no state between
    calls but the id generator and the group commit, both locked.

    Args:
        root: Root of the folder tree; ``new/``, ``queues/``, ``delay/``,
            ``remove/`` and ``attempts/`` are created if missing.
        ids: Message id generator (one per process is enough).
        fsync: Make writes durable before they are acknowledged. Only tests of
            throughput without a disk may turn it off.
        clock: Epoch ms of each transition (deadlines, retention, purge markers,
            attempt windows); default :func:`now_ms`, the wall clock. A test
            gives a clock it controls; :meth:`at` stops it for several calls.
    Raises:
        OSError: The root could not be created or fsynced.
    """
