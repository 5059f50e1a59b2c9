"""Lone operations on the loop thread (``mq --inline-io``, daemons/_inline.py): same durability, same order.

A send, receive or delete with no other one beside it does its file work on mq's
event loop; any concurrency keeps the saver, fetcher and remover threads. These
tests mix both on real daemons and check what a user relies on: every 201 survives
a SIGKILL, a message whose 201 came before another was sent is received first
(docs/api.md), ``never`` keeps every file operation on the threads, and a
network or FUSE filesystem never gets the loop blocked on it.
"""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from daemons._inline import inline_allowed
from mqcore.fsinfo import mount_of
from mqcore.names import QueueName
from mqcore.protocol import Store

#: A mount table of the kinds a root can be on (the lines as /proc/mounts shows them).
MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
/dev/vdb /srv/xfs xfs rw,relatime,attr2,inode64 0 0
/dev/vdc /srv/btrfs btrfs rw,relatime,space_cache=v2 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
overlay /var/lib/docker/overlay2/x/merged overlay rw,lowerdir=/l,upperdir=/u,workdir=/w 0 0
127.0.0.2:/mqvol /mnt/gluster fuse.glusterfs rw,relatime,user_id=0,group_id=0,allow_other 0 0
srv:/export /mnt/nfs nfs4 rw,relatime,vers=4.2,hard,proto=tcp 0 0
//srv/share /mnt/cifs cifs rw,relatime,vers=3.0 0 0
sshfs#me@host: /mnt/sshfs fuse rw,nosuid,nodev 0 0
/dev/vdd /srv/odd zonefs rw 0 0
"""


def test_inline_io_only_on_local_filesystems_and_never_when_told(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)

    def allowed(path: str, mode: str = "auto") -> bool:
        return inline_allowed(mode, mount_of(path, str(mounts)))

    for local in ("/var/lib/mq", "/srv/xfs/mq", "/srv/btrfs/mq", "/dev/shm/mq", "/var/lib/docker/overlay2/x/merged/mq"):
        assert allowed(local), local
        assert not allowed(local, "never"), local
    for remote in ("/mnt/gluster/mq", "/mnt/nfs/mq", "/mnt/cifs/mq", "/mnt/sshfs/mq"):
        assert not allowed(remote), remote  # a hung server would hang every connection of the loop
    assert not allowed("/srv/odd/mq")  # a type not known to be local: the threads, as before
    assert not inline_allowed("auto", None)  # /proc/mounts unreadable: nothing known
    # This machine's own table: the tests' temporary directory is on a local disk or tmpfs.
    here = mount_of(tmp_path)
    assert here is not None and inline_allowed("auto", here) == (here.fstype in ("ext4", "xfs", "btrfs", "tmpfs"))


def threads_of(pid: int) -> int:
    """Threads of a process (Linux: /proc/<pid>/task)."""
    return len(os.listdir(f"/proc/{pid}/task"))


def inline_counts(log: str) -> tuple[int, int]:
    """(done on the loop thread, asked) from the line mq logs when it stops."""
    found = re.findall(r"inline io: (\d+) of (\d+) ", log)
    assert found, "mq logged no inline io count at its stop"
    done, asked = found[-1]
    return int(done), int(asked)


@pytest.mark.parametrize("mode", ["auto", "never"])
async def test_never_uses_the_threads_and_auto_leaves_a_lone_client_without_them(mode, stack_factory, tmp_path, wait):
    root = tmp_path / "root"
    root.mkdir()
    queue = QueueName("lone")
    store = Store(str(root))
    store.create_queue(queue)  # made before mq starts: no HTTP request of mq's own starts a saver for it
    store.close()
    # No rescan in the test's time: a rescan's directory checks run on a saver.
    stack = stack_factory(root=root, mq_args=["--inline-io", mode, "--rescan-interval", "3600"])
    await wait(lambda: f"inline io {'on' if mode == 'auto' else 'off'} (--inline-io {mode}" in stack.mq.log)
    pid = stack.mq.pid

    for i in range(5):  # the first few of a quiet spell still go to the threads (daemons/_inline.py)
        await stack.send(queue, b"warm-%d" % i)
    after_first = threads_of(pid)
    for i in range(10):
        await stack.send(queue, b"m%d" % i)
    after_sends = threads_of(pid)
    got = []
    for _ in range(15):
        reply = await stack.receive(queue)
        assert reply.status == 200, reply.body
        got.append(reply.body)
        deleted = await stack.delete(queue, reply.header("X-Message-Id"))
        assert deleted.status == 200, deleted.body
    assert got == [b"warm-%d" % i for i in range(5)] + [b"m%d" % i for i in range(10)]
    after_deletes = threads_of(pid)
    assert (await stack.receive(queue)).status == 204
    assert stack.mq.stop() == 0
    done, asked = inline_counts(stack.mq.log)
    if mode == "auto":  # one client at a time: after the first few, on the loop thread, no new thread
        assert asked >= 5 + 10 + 15 + 15 and done >= asked - 5, (done, asked)
        assert (after_sends, after_deletes) == (after_first, after_first), stack.mq.log_tail()
    else:  # every one on a thread: the first send started a saver, the first delete the remover
        assert done == 0 and asked >= 45, (done, asked)
        assert after_first <= after_sends < after_deletes, (after_first, after_sends, after_deletes)


async def test_lone_and_pooled_sends_mixed_keep_order(stack_factory):
    """One client sends one message at a time (alone: on the loop), others send in bursts (the savers).

    docs/api.md: a message whose 201 came before another was sent is received first.
    """
    stack = stack_factory(mq_args=["--inline-io", "auto"])
    queue = "mixed"
    await stack.create_queue(queue)
    #: body -> (monotonic time its send started, monotonic time its 201 came)
    sent: dict[bytes, tuple[float, float]] = {}

    async def send(body: bytes) -> None:
        start = time.monotonic()
        await stack.send(queue, body)
        sent[body] = (start, time.monotonic())

    async def lone_client() -> None:
        for i in range(150):
            await send(b"lone-%03d" % i)

    async def bursts() -> None:
        for k in range(10):
            await asyncio.gather(*(send(b"burst-%02d-%d" % (k, j)) for j in range(6)))
            await asyncio.sleep(0.02 * (k % 3))

    await asyncio.gather(lone_client(), bursts())
    for i in range(150, 160):  # alone at last, whatever the timing above: these go inline
        await send(b"lone-%03d" % i)
    assert len(sent) == 160 + 60
    assert stack.mq.stop() == 0
    done, asked = inline_counts(stack.mq.log)
    assert 0 < done < asked, f"both paths must have run: {done} of {asked} sends inline"
    await stack.mq.arestart()

    received: list[bytes] = []
    while True:
        reply = await stack.receive(queue)
        if reply.status == 204:
            break
        assert reply.status == 200, reply.body
        received.append(reply.body)
        assert (await stack.delete(queue, reply.header("X-Message-Id"))).status == 200
    assert sorted(received) == sorted(sent), "lost or duplicated"
    position = {body: i for i, body in enumerate(received)}
    lone = [b for b in received if b.startswith(b"lone-")]
    assert lone == sorted(lone), "one client's sequential sends out of order"
    # Across all senders: acknowledged before the other was sent => received before it.
    for earlier in sent:
        for later in sent:
            if sent[earlier][1] < sent[later][0]:
                assert position[earlier] < position[later], (earlier, later, sent[earlier], sent[later])


async def test_every_lone_201_survives_a_sigkill(stack_factory):
    stack = stack_factory(mq_args=["--inline-io", "auto"])
    queue = "kill"
    await stack.create_queue(queue)
    acked = [await stack.send(queue, b"k%03d" % i) for i in range(40)]  # all but the first few inline
    stack.mq.kill()  # SIGKILL right after the last 201
    await stack.mq.arestart()
    got = []
    while (reply := await stack.receive(queue)).status == 200:
        got.append(reply.header("X-Message-Id"))
        assert (await stack.delete(queue, reply.header("X-Message-Id"))).status == 200
    assert got == acked


async def test_a_lone_send_waits_for_nothing_but_a_queued_send_is_not_overtaken(stack_factory, tmp_path):
    """Sends started together (one of them alone at first) are all stored and answered once each."""
    stack = stack_factory(mq_args=["--inline-io", "auto"])
    queue = "together"
    await stack.create_queue(queue)
    for round_ in range(5):
        ids = await asyncio.gather(*(stack.send(queue, b"r%d-%d" % (round_, j)) for j in range(1 + round_ * 3)))
        assert len(set(ids)) == len(ids)
    seen = []
    while (reply := await stack.receive(queue)).status == 200:
        seen.append(reply.body)
        assert (await stack.delete(queue, reply.header("X-Message-Id"))).status == 200
    assert len(seen) == sum(1 + r * 3 for r in range(5))
    # Rounds were sequential: every message of round r is received before any of round r + 1.
    rounds = [int(body.split(b"-")[0][1:]) for body in seen]
    assert rounds == sorted(rounds)
