"""Step 4 of a FIFO receive in ``mq`` (docs/protocol.md 19.3): no kept lease overtakes an earlier message of its group.

Steps 1-3 of 19.3 (:class:`mqcore.service.fifo.GroupOrder`) keep a group only if no other lease of it is in
``delay/``. They cannot see an earlier message of the group that is *ready* but was missing from the names the
receive popped: another consumer gave it back (its own step 3) or mq-mover returned it at its deadline after
this daemon's index had dropped it, and inotify's arrival of it was still queued (the loop reads events in
5-ms windows, ``daemons._queues.WATCH_WINDOW_SECONDS``). The receive would then deliver a later message first
(seen once in CI, stop 26: a group delivered 0, 2, 1).

mq with inotify does step 4 from its index, with no listing: after step 3 it applies every event queued by
then (the kernel queues an event inside the rename, so a rename done before step 3's listing is read), and
asks the index which ids entered it since the receive popped past them (:meth:`mqcore.index.ReadyIndex.ids_below`).
Those below a kept lease of the same group (its header, cached per id) send the group back. In the usual
receive there are none and step 4 is one non-blocking ``read`` of the inotify descriptor and a look at the
heap's top. When the index cannot tell (an inotify overflow whose rescan has not ended, or the heap rebuilt
since the pop), every kept lease goes back. Without inotify (a shared filesystem, a partitioned receive)
:func:`mqcore.service.receive.lease_names` does step 4 by one more listing instead (``relist``).
"""

from __future__ import annotations

from daemons._handoff import Handoff
from daemons._queues import QueueState, QueueStates
from mqcore.names import QueueName
from mqcore.protocol import Store
from mqcore.service.fifo import yield_overtaken
from mqcore.service.receive import LeaseOutcome


async def keep_group_order(
    queues: QueueStates,
    store: Store,
    thread: Handoff,
    queue: QueueName,
    state: QueueState,
    outcome: LeaseOutcome,
    rebuilds: int,
) -> None:
    """Give back the leases of ``outcome`` that overtake an earlier ready message of their group (event loop).

    Args:
        queues: The daemon's queue states (their inotify descriptor is read here).
        store: The store.
        thread: The queue's fetcher thread (header reads and give-backs run there, only when needed).
        queue: The FIFO queue; ``state`` its state, watched by inotify, whose index the receive popped.
        outcome: What ``lease_names(..., relist=False)`` returned; leases given back leave ``outcome.messages``.
        rebuilds: ``state.index.rebuilds`` before the receive popped its names.
    """
    if not outcome.messages:
        return
    queues.on_watch_events()  # whether or not a window is open: what was renamed before step 3's listing
    index = state.index
    if index.rebuilds != rebuilds or queues.unrepaired:
        earlier = None  # the index may lack what step 4 asks: trust nothing
    else:
        earlier = index.ids_below(max(m.message_id for m in outcome.messages))
        if not earlier:
            return
    await thread.run(yield_overtaken, store, queue, outcome, earlier)
