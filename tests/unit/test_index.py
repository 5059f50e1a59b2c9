"""ReadyIndex (``mqcore/index.py``): an in-memory sorted set of ready names with lazy deletion.

A hypothesis state machine runs random add / update / discard / pop sequences
against a plain ``set`` model: the index must always hold exactly the model's
names, ``pop_oldest`` must return the model's minimum, ``pop_fuzzed(peers)``
one of its ``peers + 1`` smallest names (SoftLayer MQ's peer fuzz,
``docs/protocol.md`` section 10), ``pop_oldest_in(i, M)`` the minimum of partition
``i`` of ``M`` (SMQ's batches), and a rescan (``mark``, names noted during
the listing, ``drop_unlisted``) must forget exactly the names noted before the
listing started that the listing did not find; the daemon's rescan (``snapshot``,
``IndexSnapshot.compare`` off the loop, ``apply_rescan``) must in addition note
the listed names the index did not hold when the listing started.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqcore.index import Listing, ReadyIndex, _name
from mqcore.names import IdGenerator, MessageId, partition_of, ready_name, sent_ms_of

#: A small pool of ids, so random operations often hit names already present or discarded.
_GEN = IdGenerator()
POOL_IDS = [_GEN.next_id(now_ms=1_700_000_000_000 + (i % 7)) for i in range(24)]
POOL_NAMES = [ready_name(mid, rc) for mid in POOL_IDS for rc in (0, 1)]

names = st.sampled_from(POOL_NAMES)


class ReadyIndexMachine(RuleBasedStateMachine):
    """ReadyIndex against a ``set`` model."""

    def __init__(self) -> None:
        super().__init__()
        self.index = ReadyIndex()
        self.model: set[str] = set()

    @rule(name=names)
    def add(self, name: str) -> None:
        self.index.add(name)
        self.model.add(name)

    @rule(batch=st.lists(names, max_size=10))
    def update(self, batch: list[str]) -> None:
        self.index.update(batch)
        self.model.update(batch)

    @rule(name=names)
    def discard(self, name: str) -> None:
        self.index.discard(name)
        self.model.discard(name)

    @rule()
    def pop_oldest(self) -> None:
        got = self.index.pop_oldest()
        if not self.model:
            assert got is None
            return
        assert got == min(self.model)
        self.model.remove(got)

    @rule(peers=st.integers(min_value=0, max_value=6), seed=st.integers(min_value=0, max_value=2**32))
    def pop_fuzzed(self, peers: int, seed: int) -> None:
        got = self.index.pop_fuzzed(peers, random.Random(seed))
        if not self.model:
            assert got is None
            return
        assert got in sorted(self.model)[: peers + 1]
        if peers == 0:
            assert got == min(self.model)
        self.model.remove(got)

    @rule(partitions=st.integers(min_value=1, max_value=20), data=st.data())
    def pop_oldest_in(self, partitions: int, data: st.DataObject) -> None:
        partition = data.draw(st.integers(min_value=0, max_value=partitions - 1))
        got = self.index.pop_oldest_in(partition, partitions)
        share = sorted(n for n in self.model if partition_of(n.partition(".")[0], partitions) == partition)
        if not share:
            assert got is None
            return
        assert got == share[0]
        self.model.remove(got)

    @rule(listed=st.lists(names, max_size=30), during=st.lists(names, max_size=5))
    def rescan(self, listed: list[str], during: list[str]) -> None:
        mark = self.index.mark()
        for name in during:  # noted while the listing runs (sends, inotify, a receive putting names back)
            self.index.add(name)
            self.model.add(name)
        gone = self.model - set(listed) - set(during)
        assert sorted(self.index.drop_unlisted(mark, listed)) == sorted(gone)
        self.model -= gone

    @rule(listed=st.lists(names, max_size=30), during=st.lists(names, max_size=5), taken=st.lists(names, max_size=5))
    def rescan_off_the_loop(self, listed: list[str], during: list[str], taken: list[str]) -> None:
        """The daemon's rescan: snapshot, names noted and taken while the listing is compared, then the diff."""
        snapshot = self.index.snapshot()
        before = set(self.model)
        for name in during:  # noted while the listing runs and is compared on a worker thread
            self.index.add(name)
            self.model.add(name)
        for name in taken:  # received meanwhile
            self.index.discard(name)
            self.model.discard(name)
        diff = snapshot.compare([*listed, ".attributes"], pause=lambda: None, chunk=4)
        gone = (before - set(listed) - set(during)) & self.model
        assert sorted(self.index.apply_rescan(diff)) == sorted(gone)
        self.model -= gone
        self.model |= set(listed) - before  # what the index did not hold when the listing started

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def name_for_a_present_id(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.model)))
        mid = name.partition(".")[0]
        found = self.index.name_for(mid)
        # Only one ready name per id exists on disk; with two (a stale one), either may be known.
        assert found is None or (found in self.model and found.startswith(mid + "."))
        if sum(n.startswith(mid + ".") for n in self.model) == 1 and found is not None:
            assert found == name

    @invariant()
    def same_members(self) -> None:
        assert len(self.index) == len(self.model)
        for name in POOL_NAMES:
            assert (name in self.index) == (name in self.model)


TestReadyIndexMachine = ReadyIndexMachine.TestCase


@given(st.lists(st.integers(min_value=0, max_value=10_000), unique=True, max_size=300))
def test_name_for_finds_every_indexed_id(offsets: list[int]) -> None:
    gen = IdGenerator()
    ids = [gen.next_id(now_ms=1_700_000_000_000 + o) for o in offsets]
    index = ReadyIndex(ready_name(mid, i % 3) for i, mid in enumerate(ids))
    for i, mid in enumerate(ids):
        assert index.name_for(mid) == ready_name(mid, i % 3)
    for mid in ids[::2]:
        index.discard(index.name_for(mid))
        assert index.name_for(mid) is None
    assert index.name_for("not-an-id") is None


def test_pop_oldest_is_send_order_for_real_ids() -> None:
    gen = IdGenerator()
    ids = [gen.next_id() for _ in range(2_000)]
    shuffled = [ready_name(mid, 0) for mid in ids]
    random.Random(7).shuffle(shuffled)
    index = ReadyIndex(shuffled)
    popped = [index.pop_oldest() for _ in range(len(ids))]
    assert popped == [ready_name(mid, 0) for mid in ids]
    assert index.pop_oldest() is None
    assert len(index) == 0


def test_a_redelivered_message_keeps_its_place_at_the_head() -> None:
    gen = IdGenerator()
    first, second, third = (gen.next_id() for _ in range(3))
    index = ReadyIndex([ready_name(second, 0), ready_name(third, 0)])
    index.add(ready_name(first, 2))  # redelivered after two receives
    assert index.pop_oldest() == ready_name(first, 2)


def test_ids_below_are_the_ids_indexed_since_a_pop_went_past_them() -> None:
    gen = IdGenerator()
    ids = [gen.next_id() for _ in range(6)]
    index = ReadyIndex([ready_name(mid, 0) for mid in ids[1:]])
    assert index.pop_oldest() == ready_name(ids[1], 0)
    assert index.pop_oldest() == ready_name(ids[2], 0)
    assert index.ids_below(ids[3]) == []  # what the pops went past is off the heap
    index.add(ready_name(ids[0], 1))  # given back elsewhere: ready again
    index.add(ready_name(ids[2], 3))
    index.discard(ready_name(ids[2], 3))  # indexed and gone again: id known, name not
    assert index.ids_below(ids[3]) == [(ids[0], ready_name(ids[0], 1)), (ids[2], None)]
    assert index.ids_below(ids[1]) == [(ids[0], ready_name(ids[0], 1))]
    with pytest.raises(ValueError, match="not a message id"):
        index.ids_below("nope")


@given(st.lists(st.tuples(st.booleans(), names), max_size=40), st.integers(0, 23))
def test_ids_below_holds_every_id_indexed_since_the_pops_unless_the_heap_was_rebuilt(
    ops: list[tuple[bool, str]], cut: int
) -> None:
    limit = sorted(POOL_IDS)[cut]
    index = ReadyIndex(POOL_NAMES)
    while (top := index.peek_oldest()) is not None and top[:36] < limit:
        index.pop_oldest()
    rebuilds, added = index.rebuilds, set()
    for add, name in ops:
        if add:
            if name[:36] not in {n[:36] for n in _present_names(index)}:
                added.add(name[:36])
            index.add(name)
        else:
            index.discard(name)
    found = index.ids_below(limit)
    assert [mid for mid, _ in found] == sorted({mid for mid, _ in found})
    for mid, name in found:
        assert name == (index.name_for(mid) and min(n for n in _present_names(index) if n[:36] == mid))
    if index.rebuilds == rebuilds:
        assert {mid for mid, _ in found} == {mid for mid in added if mid < limit}


def _present_names(index: ReadyIndex) -> list[str]:
    return [n for n in POOL_NAMES if n in index]


def test_discarding_most_names_keeps_the_rest_in_order() -> None:
    """Discard every count of names around the point where the heap is compacted; nothing is lost."""
    gen = IdGenerator()
    total = 1_500
    all_names = [ready_name(gen.next_id(), 0) for _ in range(total)]
    order = list(all_names)
    random.Random(5).shuffle(order)
    listing = Listing(all_names)  # parsed once; the same names as ``all_names``
    for discarded in range(total - 300, total + 1):
        index = ReadyIndex(listing)
        for name in order[:discarded]:
            index.discard(name)
        index.discard("never-added.0")
        keep = sorted(order[discarded:])
        assert len(index) == len(keep)
        assert [index.pop_oldest() for _ in range(len(keep))] == keep
        assert index.pop_oldest() is None


def test_add_after_discard_and_duplicate_adds_are_idempotent() -> None:
    gen = IdGenerator()
    a, b = (ready_name(gen.next_id(), 0) for _ in range(2))
    index = ReadyIndex()
    index.add(b)
    index.add(b)
    index.discard(b)
    index.add(b)
    index.add(a)
    index.discard(a)
    assert len(index) == 1
    assert index.pop_oldest() == b
    assert index.pop_oldest() is None
    assert b not in index


def test_only_ready_names_are_indexed() -> None:
    """Any other name is refused by add and absent for ``in``, discard and name_for (the daemon filters listings)."""
    gen = IdGenerator()
    mid = gen.next_id()
    index = ReadyIndex([ready_name(mid, 3)])
    for other in ("b.0", ".attributes", mid, f"{mid}.03", f"{mid}.x", f"{mid.upper()}.0", f" {mid}.0"):
        with pytest.raises(ValueError):
            ReadyIndex().add(other)
        with pytest.raises(ValueError):
            ReadyIndex().update([other])
        assert other not in index
        index.discard(other)
    index.discard(ready_name(mid, 1))  # another count of the same id: not indexed, nothing forgotten
    assert len(index) == 1 and index.name_for(mid) == ready_name(mid, 3)
    assert index.name_for(mid.upper()) is None and index.name_for(mid[:-1]) is None


@given(st.lists(st.sampled_from(POOL_NAMES), max_size=40), st.lists(st.sampled_from(POOL_NAMES), max_size=10))
def test_a_parsed_listing_is_the_same_as_its_names(listed: list[str], before: list[str]) -> None:
    """``Listing`` (parsed on a worker thread) gives the index the same names as the names themselves."""
    foreign = [".attributes", ".purge", "x.0", "tmp"]
    by_names, by_listing = ReadyIndex(before), ReadyIndex(before)
    by_names.update(listed)
    by_listing.update(Listing(listed + foreign))
    assert len(Listing(listed + foreign)) == len(listed)
    assert [n for n in POOL_NAMES if n in by_names] == [n for n in POOL_NAMES if n in by_listing]
    mark_a, mark_b = by_names.mark(), by_listing.mark()
    assert sorted(by_names.drop_unlisted(mark_a, listed[::2])) == sorted(
        by_listing.drop_unlisted(mark_b, Listing(listed[::2] + foreign))
    )
    popped = [by_listing.pop_oldest() for _ in range(len(by_listing))]
    assert popped == [by_names.pop_oldest() for _ in range(len(by_names))]
    assert popped == sorted(popped, key=lambda n: (n.partition(".")[0], int(n.partition(".")[2])))
    assert ReadyIndex(Listing(listed)).peek_oldest() == (min(listed) if listed else None)
    oldest = ReadyIndex(Listing(listed)).peek_oldest()
    assert ReadyIndex(Listing(listed)).oldest_sent_ms() == (sent_ms_of(MessageId(oldest[:36])) if oldest else None)


@pytest.mark.parametrize("peers", [1, 3, 7])
def test_pop_fuzzed_picks_among_the_oldest_peers_plus_one(peers: int) -> None:
    gen = IdGenerator()
    all_names = [ready_name(gen.next_id(), 0) for _ in range(20)]
    oldest = all_names[: peers + 1]
    seen = set()
    rng = random.Random(1)
    for _ in range(400):
        index = ReadyIndex(all_names)
        got = index.pop_fuzzed(peers, rng)
        assert got in oldest
        seen.add(got)
        # The others are put back: the index lost exactly the chosen name.
        assert len(index) == len(all_names) - 1
        assert got not in index
        assert [index.pop_oldest() for _ in range(len(index))] == [n for n in all_names if n != got]
    assert seen == set(oldest)  # every candidate is chosen sometimes (uniform choice)


def test_pop_fuzzed_with_fewer_names_than_peers() -> None:
    gen = IdGenerator()
    a, b = (ready_name(gen.next_id(), 0) for _ in range(2))
    index = ReadyIndex([b, a])
    assert index.pop_fuzzed(5, random.Random(3)) in {a, b}
    assert len(index) == 1
    index.pop_fuzzed(5)
    assert index.pop_fuzzed(5) is None
    assert index.pop_fuzzed(0) is None


@given(
    st.lists(st.sampled_from(POOL_NAMES), min_size=1, unique=True),
    st.integers(min_value=0, max_value=10),
    st.randoms(use_true_random=False),
)
def test_pop_fuzzed_returns_one_of_the_oldest(initial: list[str], peers: int, rng: random.Random) -> None:
    index = ReadyIndex(initial)
    expected = sorted(initial)
    got = index.pop_fuzzed(peers, rng)
    assert got in expected[: peers + 1]
    assert sorted(n for n in POOL_NAMES if n in index) == [n for n in expected if n != got]


def test_a_rescan_forgets_names_another_host_took_but_keeps_names_noted_while_it_listed() -> None:
    gen = IdGenerator()
    taken, kept, renewed, during, fresh = (ready_name(gen.next_id(), 0) for _ in range(5))
    index = ReadyIndex([taken, kept, renewed])
    mark = index.mark()  # the listing starts; it finds ``kept`` only (another host took the others)
    index.add(renewed)  # noted again while it lists (e.g. a receive put it back): it stays
    index.add(during)  # arrived after the listing read that part of the directory
    assert index.drop_unlisted(mark, [kept, fresh]) == [taken]
    assert len(index) == 3 and taken not in index and fresh not in index
    assert index.name_for(taken.partition(".")[0]) is None
    assert [index.pop_oldest() for _ in range(3)] == [kept, renewed, during]
    assert index.pop_oldest() is None


def test_a_rescan_of_an_empty_directory_empties_the_index() -> None:
    gen = IdGenerator()
    all_names = [ready_name(gen.next_id(), 0) for _ in range(3_000)]
    index = ReadyIndex(all_names)
    assert sorted(index.drop_unlisted(index.mark(), ())) == all_names
    assert len(index) == 0 and index.peek_oldest() is None and index.pop_oldest() is None
    index.add(all_names[5])
    assert index.pop_oldest() == all_names[5]


def test_rescan_compare_reads_only_whole_ready_names() -> None:
    """A foreign name holding a newline and a ready name inside it is not taken for that ready name."""
    gen = IdGenerator()
    held, listed_new, inside = (ready_name(gen.next_id(), 0) for _ in range(3))
    redelivered = ready_name(gen.next_id(), 2)
    index = ReadyIndex([held])
    listing = [held, listed_new, redelivered, f"x\n{inside}\ny", ".attributes", f"{inside}.tmp"]
    for chunk in (1, 2, 1024):
        diff = index.snapshot().compare(listing, pause=lambda: None, chunk=chunk)
        assert sorted(_name(mid, rc) for mid, rc in diff.new) == sorted([listed_new, redelivered])
        assert diff.unlisted == []
    diff = index.snapshot().compare([listed_new], pause=lambda: None, chunk=1)
    assert [_name(mid, rc) for mid, rc in diff.unlisted] == [held]
