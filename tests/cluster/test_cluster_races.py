"""The two GlusterFS-specific failure paths of the protocol, provoked hard on the volume (issue 14).

- docs/protocol.md 13.2: two hosts create one name with ``O_EXCL`` at once. One may win, or (with
  the kernel's caches off) neither; every loser retries under a new id. What a user checks: every
  send a host was told succeeded is stored exactly once, with its body; nobody is told "stored" for
  a name another host holds; nothing is left behind in ``new/``.
- docs/protocol.md 13.3: two hosts lease one ready message at once. The loser's open or rename finds
  the file moved (``ENOENT``, or ``ESTALE`` on a file another host moved) and treats the message as
  taken. What a user checks: never both hosts get it; nothing is lost (a message nobody was handed
  is in flight, for its mover to bring back).

Every race is a real one (two processes on two FUSE mounts, released by a barrier: cluster_races.py),
and each host counts the recoveries the protocol reports (the hook behind ``mq_storage_races_lost_total``):
the test proves every retry and every empty-handed receive went through those paths. The counts,
``ESTALE`` and the no-winner creates among them, are logged (``-o log_cli=true``) and recorded as test
properties (``--junitxml``).
"""

from __future__ import annotations

import logging
import os
from collections import Counter

import pytest
from cluster_races import race
from conftest import Gluster

from mqcore import model
from mqcore.names import QueueName, parse_in_flight_name
from mqcore.protocol import SendEntry, Store

logger = logging.getLogger(__name__)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

#: Races per test: every race takes the path under test at least once (each race costs several round trips to
#: three bricks: 30-100 ms on this machine). The no-winner creates (8 in 18,000 in the issue) need far more.
RACES = int(os.environ.get("MQ_CLUSTER_RACES", "50"))
#: How much later than the other host one host starts a receive race, ms, in turn: at 0 both open the file before
#: either renames it (the loser's rename fails); from a few ms on, the loser opens a file already moved.
RECEIVE_STAGGER_MS = (0, 5, 15, 40, 100)


def test_two_hosts_creating_one_name_at_once_retry_under_new_ids_and_each_send_is_stored_once(
    gluster: Gluster, record_property
):
    name, queue = "races-send", QueueName("q")
    *roots, third_root = gluster.roots(name)
    third = Store(third_root)  # the check looks through a host that took no part
    third.create_queue(queue)
    ids = [third.ids.next_id() for _ in range(RACES)]  # both hosts send under the same id in each race

    runs = race(roots, queue, "send", ids)

    told = {}  # message id -> body, of every send a host was told succeeded
    no_winner = 0
    for i, forced in enumerate(ids):
        got = [run.got[i] for run in runs]
        assert got.count(forced) <= 1, f"race {i}: both hosts were told they stored {forced}"
        no_winner += forced not in got
        for run in runs:
            assert run.got[i] not in told, f"race {i}: id {run.got[i]} given to two sends"
            told[run.got[i]] = f"h{run.host}-{i}".encode()
    retried = sum(run.got[i] != forced for run in runs for i, forced in enumerate(ids))
    assert retried == RACES + no_winner  # one loser per race, two when nobody won
    assert sum(run.lost("create") for run in runs) == retried, [run.races for run in runs]
    assert set().union(*(run.races for run in runs)) == {"create/EEXIST"}

    qdir = third.layout.queue_dir(queue)
    stored = {}
    for filename in os.listdir(qdir):
        if filename.endswith(".0"):
            with open(os.path.join(qdir, filename), "rb") as fh:
                stored[filename[:-2]] = model.decode(fh.read())[1]
    assert stored == told, "every acknowledged send stored exactly once with its body, nothing else"
    assert os.listdir(third.layout.new) == []
    record_property("no_winner", no_winner)
    logger.info(
        "%d O_EXCL races of one name from two mounts: %d creates retried, %d races with no winner",
        RACES,
        retried,
        no_winner,
    )


def test_two_hosts_receiving_one_message_at_once_one_gets_it_and_the_other_finds_it_taken(
    gluster: Gluster, record_property
):
    name, queue = "races-receive", QueueName("q")
    *roots, third_root = gluster.roots(name)
    third = Store(third_root)
    third.create_queue(queue)
    ids = third.send_batch(queue, [SendEntry(b"m%d" % i) for i in range(RACES)])
    assert all(isinstance(i, str) for i in ids), ids

    runs = race(roots, queue, "receive", ids, stagger_ms=RECEIVE_STAGGER_MS)

    nobody = []
    for i, message_id in enumerate(ids):
        got = [run.got[i] for run in runs]
        assert got.count(message_id) <= 1, f"race {i}: {message_id} handed to both hosts"
        assert set(got) <= {message_id, None}
        if message_id not in got:
            nobody.append(message_id)
    empty_handed = sum(got is None for run in runs for got in run.got)
    assert empty_handed == RACES + len(nobody)
    assert sum(run.lost("open") + run.lost("rename") for run in runs) == empty_handed, [run.races for run in runs]
    assert set().union(*(run.races for run in runs)) <= {"open/ENOENT", "open/ESTALE", "rename/ENOENT", "rename/ESTALE"}
    assert all(sum(run.lost(step) for run in runs) for step in ("open", "rename")), "both steps lost races"

    # Nothing lost: every message is in flight exactly once (leased by the winner, or by a rename that reported
    # ESTALE although it happened: then nobody was handed it and the mover brings it back at its deadline).
    in_flight = [parse_in_flight_name(f) for f in os.listdir(third.layout.delay)]
    leased = sorted(p.message_id for p in in_flight if p is not None and p.queue == queue)
    assert leased == sorted(ids)
    assert not [f for f in os.listdir(third.layout.queue_dir(queue)) if f.endswith(".0")]
    races = sum((Counter(run.races) for run in runs), Counter())
    record_property("lost_races", dict(races))
    logger.info(
        "%d lease races of one message from two mounts: %s; handed to nobody: %d", RACES, dict(races), len(nobody)
    )
