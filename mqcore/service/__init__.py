"""The SQS service rules, written once for the ``mq`` daemon and the brokerless client.

Plain functions and small classes over :class:`mqcore.protocol.Store`, with
the clock given by the caller (``now`` in epoch ms, or monotonic seconds for
pacing): no asyncio, no HTTP, no threads of their own. The daemon
(``daemons/_broker.py``, ``daemons/_send.py``, ``daemons/_leases.py``,
``daemons/_http.py``, ``daemons/_sqs.py``, ``daemons/_redrive.py``) drives them asynchronously, running the blocking
ones on its worker threads and keeping its own concurrency (fetcher locks, the
in-memory ready index, long-poll events); the brokerless client
(``mqcore/client/_local.py``) calls them directly. Neither restates a rule.

Where each rule of docs/api.md lives
------------------------------------

=====================================================  =============================================
Rule                                                   Home
=====================================================  =============================================
Queue names, message ids, partitions, receipt-handle   :mod:`mqcore.names` (``check_queue_name``,
text (the on-disk grammar)                             ``ReceiptHandle``, ``check_partition``)
Queue attributes: keys, ranges, defaults, message      :mod:`mqcore.attributes`
attributes (SQS's rules), SQS limits
Argument ranges (max_messages 1-10, wait_time_seconds  :mod:`mqcore.service.requests` (``Limit``
0-20, visibility_timeout_seconds 0-43,200,             objects, ``check_receive``, ``send_entry``,
delay_seconds 0-900, peek limit, partitions, redrive   ``check_message_size``, ``ReceiveArgs``)
rate), attempt id, content type, prefix, sizes
Receipt-handle checks and the lease memory             :mod:`mqcore.service.handles`
Receive request attempts (ReceiveRequestAttemptId):    :mod:`mqcore.service.attempts`
5-minute record, retry re-lets, per-key lock
Bulk leases (issue 17): lease under a key, replay,     :mod:`mqcore.service.bulk` (``bulk_lease``,
delete by key                                          ``bulk_delete``, ``check_bulk_lease``)
Capacity admission and QueueFull                       :mod:`mqcore.service.capacity`
Leasing, dead-letter and retention policy at receive,  :mod:`mqcore.service.receive`
redelivery of due ``delay/`` files (brokerless)
FIFO queues: send rules, receive in group order        :mod:`mqcore.service.fifo` (``fifo_message``,
(``GroupOrder``), the queue's delay at receive         ``GroupOrder``, ``send_entries``)
Redrive tasks: start, status record, pacing, moves,    :mod:`mqcore.service.redrive` over
stop and cancel                                        :mod:`mqcore.redrive` (staleness, presentation)
``GET /<queue>`` counts and settings                   :mod:`mqcore.service.queues`
File transitions (send, lease, delete, visibility,     :mod:`mqcore.protocol` (docs/protocol.md)
purge, attempts and redrive files)
Errors: codes, HTTP statuses, Retry-After              :mod:`mqcore.errors`
SQS wire words (JSON and query protocols)              :mod:`mqcore.sqs`, :mod:`mqcore.sqs_query`
How a rule that interleaves file work with waiting     :mod:`mqcore.service.plans` (sans-I/O generators:
(attempted receive, redrive task) is run               ``run_sync``, ``run_async``)
Waiting (long polls, capacity waits), threads, HTTP    the drivers: ``daemons/`` and ``mqcore/client/_local.py``
=====================================================  =============================================
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqcore.service.attempts import Attempt, KeyedLocks, attempted_receive, load_attempt, record_attempt, relet
    from mqcore.service.capacity import SendReservations, admit, queue_full
    from mqcore.service.handles import LeaseMemory, check_handle
    from mqcore.service.plans import Blocking, run_async, run_sync
    from mqcore.service.queues import queue_stats
    from mqcore.service.receive import LeaseOutcome, lease_names, lease_policy, redeliver_due
    from mqcore.service.redrive import RedrivePacer, redrive_task
    from mqcore.service.requests import (
        DELAY_SECONDS,
        MAX_MESSAGES,
        PEEK_LIMIT,
        REDRIVE_RATE,
        VISIBILITY_TIMEOUT_SECONDS,
        WAIT_TIME_SECONDS,
        Limit,
        ReceiveArgs,
        ReceiveRequest,
        check_receive,
    )

__all__ = [
    "DELAY_SECONDS",
    "MAX_MESSAGES",
    "PEEK_LIMIT",
    "REDRIVE_RATE",
    "VISIBILITY_TIMEOUT_SECONDS",
    "WAIT_TIME_SECONDS",
    "Attempt",
    "Blocking",
    "KeyedLocks",
    "LeaseMemory",
    "LeaseOutcome",
    "Limit",
    "ReceiveArgs",
    "ReceiveRequest",
    "RedrivePacer",
    "SendReservations",
    "admit",
    "attempted_receive",
    "check_handle",
    "check_receive",
    "lease_names",
    "lease_policy",
    "load_attempt",
    "queue_full",
    "queue_stats",
    "record_attempt",
    "redeliver_due",
    "redrive_task",
    "relet",
    "run_async",
    "run_sync",
]

#: The module of :mod:`mqcore.service` each name of ``__all__`` comes from. They are imported on first use (PEP
#: 562), not with the package: a program that needs one part (the HTTP client's :mod:`mqcore.service.plans`, so
#: every ``mqctl --url`` command) does not import all the rules and :mod:`mqcore.protocol` with them
#: (docs/performance.md, "mqctl, daemon start-ups and tests/fuzz's collection (issue 12, stop 30)").
_HOMES = {
    name: module
    for module, names in (
        ("attempts", "Attempt KeyedLocks attempted_receive load_attempt record_attempt relet"),
        ("capacity", "SendReservations admit queue_full"),
        ("handles", "LeaseMemory check_handle"),
        ("plans", "Blocking run_async run_sync"),
        ("queues", "queue_stats"),
        ("receive", "LeaseOutcome lease_names lease_policy redeliver_due"),
        ("redrive", "RedrivePacer redrive_task"),
        (
            "requests",
            "DELAY_SECONDS MAX_MESSAGES PEEK_LIMIT REDRIVE_RATE VISIBILITY_TIMEOUT_SECONDS WAIT_TIME_SECONDS Limit"
            " ReceiveArgs ReceiveRequest check_receive",
        ),
    )
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    """``from mqcore.service import run_sync`` (any name of ``__all__``) imports its module then (PEP 562).

    Raises:
        AttributeError: ``name`` is not one of ``__all__`` (nor a submodule already imported).
    """
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
