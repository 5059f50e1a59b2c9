"""Queue names, message ids and file-name forms (``mqcore/names.py``, ``docs/protocol.md`` sections 2-3).

Pure functions are checked with hypothesis on arbitrary text: whatever a client
sends, an accepted queue name is 1-80 ASCII characters of ``[A-Za-z0-9_-]`` and
names a directory directly under ``ROOT/queues``; every name form round-trips,
and anything that parses is the canonical form of what it parses to. Id
uniqueness is checked across threads and across real processes.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqcore.errors import InvalidMessageId, InvalidQueueName
from mqcore.names import (
    IdGenerator,
    InFlightName,
    Layout,
    MessageId,
    QueueName,
    check_message_id,
    check_queue_name,
    in_flight_name,
    new_name,
    parse_in_flight_name,
    parse_new_name,
    parse_ready_name,
    ready_name,
    removed_name,
    sent_ms_of,
)

REPO = Path(__file__).resolve().parents[2]
QUEUE_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
#: Largest epoch millisecond a UUIDv7 holds (48 bits).
MAX_MS = (1 << 48) - 1
#: Largest deadline of the 13-digit ``DL`` field, epoch ms.
MAX_DEADLINE_MS = 10**13 - 1
#: Largest receive count the parsers accept (``RC`` is 1-9 digits).
MAX_RC = 10**9 - 1
#: Ids per thread / process in the uniqueness tests.
IDS_PER_WORKER = 20_000

QUEUE_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"

queue_names = st.text(alphabet=QUEUE_ALPHABET, min_size=1, max_size=80).map(QueueName)
deadlines = st.integers(min_value=0, max_value=MAX_DEADLINE_MS)
receive_counts = st.integers(min_value=0, max_value=MAX_RC)


@st.composite
def message_ids(draw: st.DrawFn) -> MessageId:
    """Well-formed ids, built from a drawn timestamp, counter and random bits (any generator's)."""
    ms = draw(st.integers(min_value=0, max_value=MAX_MS))
    counter = draw(st.integers(min_value=0, max_value=0xFFF))
    rand = draw(st.integers(min_value=0, max_value=(1 << 62) - 1))
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    return MessageId(str(uuid.UUID(int=value)))


# -- queue names ---------------------------------------------------------------

TRICKY_QUEUE_NAMES = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "/abs",
    "a\\b",
    "a.b",
    "a b",
    "a\n",
    "a\x00b",
    "a" * 81,
    "\u00e9",
    "\uff51",  # fullwidth q
    "\u0661\u0662\u0663",  # Arabic-Indic digits
    "\u00b2",
    "\u212a",  # Kelvin sign: lowercases to ASCII k
    "\u0131",  # dotless i: uppercases to ASCII I
    "~",
    "*",
]


@pytest.mark.parametrize("name", TRICKY_QUEUE_NAMES)
def test_check_queue_name_rejects_tricky_names(name: str) -> None:
    with pytest.raises(InvalidQueueName) as info:
        check_queue_name(name)
    assert info.value.code == "invalid_queue_name"
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidQueueName):
        Layout("/srv/mq").queue_dir(QueueName(name))


@pytest.mark.parametrize("value", [None, b"abc", 12, ["a"]])
def test_check_queue_name_rejects_non_strings(value: object) -> None:
    with pytest.raises(InvalidQueueName):
        check_queue_name(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["a", "A", "0", "-", "_", "orders", "Orders-2024_v1", "a" * 80, QUEUE_ALPHABET[:80]])
def test_check_queue_name_accepts_sqs_names(name: str) -> None:
    assert check_queue_name(name) == name


@given(st.text(max_size=100) | queue_names)
def test_accepted_queue_names_cannot_escape_the_root(name: str) -> None:
    """Any text: accepted only if it is SQS's alphabet, and then a direct child of ``queues/``."""
    layout = Layout("/srv/mq")
    try:
        accepted = check_queue_name(name)
    except InvalidQueueName:
        assert not QUEUE_RE.fullmatch(name)
        return
    assert QUEUE_RE.fullmatch(accepted)
    assert accepted.isascii()
    path = layout.queue_dir(accepted)
    assert os.path.dirname(path) == os.path.join(layout.root, "queues")
    assert os.path.normpath(path) == path
    assert os.path.basename(path) == name


@given(queue_names, message_ids())
def test_new_and_ready_paths_stay_in_their_directories(name: QueueName, message_id: MessageId) -> None:
    layout = Layout("/srv/mq")
    assert os.path.dirname(layout.new_path(name, message_id)) == layout.new
    assert os.path.dirname(layout.ready_path(name, message_id, 3)) == layout.queue_dir(name)


def test_layout_create_makes_the_top_level_directories(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "root")
    layout.create()
    layout.create()  # idempotent
    assert sorted(os.listdir(layout.root)) == ["attempts", "delay", "new", "queues", "remove"]
    assert layout.delay_path("x") == os.path.join(layout.root, "delay", "x")
    assert layout.remove_path("x") == os.path.join(layout.root, "remove", "x")


# -- message ids ----------------------------------------------------------------


def test_ids_are_well_formed_uuid7_and_strictly_increase_over_100k_calls() -> None:
    gen = IdGenerator()
    before = time.time_ns() // 1_000_000
    ids = [gen.next_id() for _ in range(100_000)]
    after = time.time_ns() // 1_000_000
    for message_id in ids:
        assert check_message_id(message_id) == message_id
    assert all(a < b for a, b in itertools.pairwise(ids))
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert str(parsed) == ids[0]
    # The generator may run ahead of the clock by 1 ms per 4096 ids in one ms.
    assert before <= sent_ms_of(ids[0]) <= after
    assert before <= sent_ms_of(ids[-1]) <= after + len(ids) // 4096 + 1


def test_ids_increase_when_the_clock_goes_backwards() -> None:
    gen = IdGenerator()
    t = 1_700_000_000_000
    first = gen.next_id(now_ms=t)
    back = gen.next_id(now_ms=t - 60_000)
    further_back = gen.next_id(now_ms=0)
    forward = gen.next_id(now_ms=t + 5)
    assert first < back < further_back < forward
    # The last timestamp is reused while the clock is behind, then follows it again.
    assert [sent_ms_of(i) for i in (first, back, further_back, forward)] == [t, t, t, t + 5]


def test_counter_overflow_in_one_millisecond_still_increases() -> None:
    gen = IdGenerator()
    t = 1_700_000_000_000
    ids = [gen.next_id(now_ms=t) for _ in range(3 * 4096 + 10)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert len(set(ids)) == len(ids)
    for message_id in ids:
        check_message_id(message_id)
    sent = [sent_ms_of(i) for i in ids]
    # 4096 ids per millisecond (12-bit counter), then the timestamp is advanced by one.
    assert sent[:4096] == [t] * 4096
    assert sent[4096 : 2 * 4096] == [t + 1] * 4096
    assert sent[-1] == t + 3
    # The real clock catching up to the borrowed millisecond keeps ids increasing.
    assert gen.next_id(now_ms=t + 3) > ids[-1]
    assert gen.next_id(now_ms=t + 4) > ids[-1]


@given(st.lists(st.integers(min_value=0, max_value=MAX_MS - 10), min_size=1, max_size=200))
def test_ids_strictly_increase_under_any_clock(clock: list[int]) -> None:
    gen = IdGenerator()
    ids = [gen.next_id(now_ms=ms) for ms in clock]
    assert all(a < b for a, b in itertools.pairwise(ids))
    highest = 0
    for ms, message_id in zip(clock, ids, strict=True):
        check_message_id(message_id)
        sent = sent_ms_of(message_id)
        if ms > highest:
            assert sent == ms  # a clock that moved forward is used as is
        assert sent >= ms
        highest = max(highest, sent)


@given(st.integers(min_value=1, max_value=MAX_MS - 1))
def test_sent_ms_of_returns_the_millisecond_used(ms: int) -> None:
    assert sent_ms_of(IdGenerator().next_id(now_ms=ms)) == ms


def test_ids_are_unique_across_threads() -> None:
    gen = IdGenerator()
    threads_n = 8
    results: list[list[MessageId]] = [[] for _ in range(threads_n)]
    barrier = threading.Barrier(threads_n)

    def work(out: list[MessageId]) -> None:
        barrier.wait()
        out.extend(gen.next_id() for _ in range(IDS_PER_WORKER))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    everything = [i for out in results for i in out]
    assert len(everything) == threads_n * IDS_PER_WORKER
    assert len(set(everything)) == len(everything)
    for out in results:  # each thread sees the shared generator's order
        assert all(a < b for a, b in itertools.pairwise(out))


_ID_SCRIPT = """
import sys
from mqcore.names import IdGenerator
gen = IdGenerator()
sys.stdout.write("\\n".join(gen.next_id() for _ in range(int(sys.argv[1]))))
"""


def test_ids_are_unique_across_processes() -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ID_SCRIPT, str(IDS_PER_WORKER)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        outputs.append(out.split("\n"))
    everything = [i for out in outputs for i in out]
    assert len(everything) == 4 * IDS_PER_WORKER
    assert len(set(everything)) == len(everything)
    for out in outputs:
        assert all(ID_RE.fullmatch(i) for i in out)
        assert all(a < b for a, b in itertools.pairwise(out))


def test_a_forked_child_draws_random_bits_of_its_own() -> None:
    """Random bits come in blocks (one ``os.urandom`` per many ids): a child made by ``fork`` must not
    reuse the block its parent holds, or parent and child would make equal ids in one millisecond."""
    gen = IdGenerator()
    gen.next_id()  # the parent now holds a block of random bits
    t = 1_700_000_000_000
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same clock reading and counter state as the parent's next id
        os.close(read_end)
        os.write(write_end, "\n".join(IdGenerator.next_id(gen, now_ms=t + i) for i in range(50)).encode())
        os._exit(0)
    os.close(write_end)
    parent = [gen.next_id(now_ms=t + i) for i in range(50)]
    with os.fdopen(read_end) as fh:
        child = fh.read().split("\n")
    os.waitpid(pid, 0)
    assert len(child) == 50
    assert [sent_ms_of(i) for i in child] == [sent_ms_of(i) for i in parent]  # same millisecond and counter...
    assert not set(child) & set(parent)  # ...different random bits
    assert all(ID_RE.fullmatch(i) for i in child)


def test_ids_random_bits_are_never_reused() -> None:
    """Across blocks and batch calls no two ids of one millisecond and counter share their random part."""
    gen = IdGenerator()
    ids = [gen.next_id() for _ in range(3_000)] + gen.next_ids(1_000) + gen.next_ids(3) + [gen.next_id()]
    randoms = [i[19:] for i in ids]  # the variant digit and the random digits after it
    assert len(set(randoms)) == len(randoms)
    assert {r[0] for r in randoms} == set("89ab")
    assert all(a < b for a, b in itertools.pairwise(ids))


@pytest.mark.parametrize(
    "value",
    [
        "",
        "01a1fe4f-1bbf-7000-ac36-adce7281dd1",  # too short
        "01a1fe4f-1bbf-7000-ac36-adce7281dd160",  # too long
        "01A1FE4F-1BBF-7000-AC36-ADCE7281DD16",  # uppercase
        "01a1fe4f-1bbf-4000-ac36-adce7281dd16",  # version 4
        "01a1fe4f-1bbf-7000-cc36-adce7281dd16",  # variant 110
        "01a1fe4f1bbf7000ac36adce7281dd16",  # no hyphens
        "{01a1fe4f-1bbf-7000-ac36-adce7281dd16}",
        "01a1fe4f-1bbf-7000-ac36-adce7281dd16\n",
        "../../../../../etc/passwd",
        "01a1fe4f-1bbf-7000-ac36-adce7281dd1\u0663",  # Arabic-Indic digit
    ],
)
def test_check_message_id_rejects_malformed_ids(value: str) -> None:
    with pytest.raises(InvalidMessageId) as info:
        check_message_id(value)
    assert info.value.code == "invalid_message_id"


def test_check_message_id_rejects_non_strings() -> None:
    with pytest.raises(InvalidMessageId):
        check_message_id(None)  # type: ignore[arg-type]


@given(st.text(max_size=40))
def test_check_message_id_accepts_only_the_canonical_form(value: str) -> None:
    try:
        check_message_id(value)
    except InvalidMessageId:
        return
    assert ID_RE.fullmatch(value)
    assert str(uuid.UUID(value)) == value


# -- file-name forms ---------------------------------------------------------


@given(message_ids(), receive_counts)
def test_ready_name_round_trips(message_id: MessageId, rc: int) -> None:
    assert parse_ready_name(ready_name(message_id, rc)) == (message_id, rc)


@given(deadlines, queue_names, message_ids(), receive_counts)
def test_in_flight_name_round_trips(dl: int, name: QueueName, message_id: MessageId, rc: int) -> None:
    filename = in_flight_name(dl, name, message_id, rc)
    assert len(filename.split(".")[0]) == 13
    parsed = parse_in_flight_name(filename)
    assert parsed == InFlightName(dl, name, message_id, rc)
    assert parsed.filename == filename


@given(queue_names, message_ids())
def test_new_name_round_trips(name: QueueName, message_id: MessageId) -> None:
    assert parse_new_name(new_name(name, message_id)) == (name, message_id)
    assert removed_name(name, message_id) == new_name(name, message_id)


@given(st.lists(deadlines, min_size=2, max_size=20))
def test_in_flight_names_sort_by_deadline(dls: list[int]) -> None:
    mid = IdGenerator().next_id()
    names = [in_flight_name(dl, QueueName("q"), mid, 1) for dl in dls]
    assert [parse_in_flight_name(n).deadline_ms for n in sorted(names)] == sorted(dls)


ID = "01a1fe4f-1bbf-7000-ac36-adce7281dd16"
DL = "1795267959745"


@pytest.mark.parametrize(
    "rc",
    ["\u00b2", "\u0663", "\uff11", "01", "00", "+1", "-1", " 1", "1 ", "1\n", "", "1_0", "1234567890", "0x1", "1.0"],
)
def test_parsers_reject_non_canonical_receive_counts(rc: str) -> None:
    assert parse_ready_name(f"{ID}.{rc}") is None
    assert parse_in_flight_name(f"{DL}.q.{ID}.{rc}") is None


@pytest.mark.parametrize(
    "dl",
    [
        "179526795974\u0665",
        "\uff11795267959745",
        "\u00b2795267959745",
        "179526795974",
        "17952679597450",
        "+795267959745",
    ],
)
def test_in_flight_parser_rejects_non_canonical_deadlines(dl: str) -> None:
    assert parse_in_flight_name(f"{dl}.q.{ID}.1") is None


@pytest.mark.parametrize(
    "filename",
    [
        f"{DL}.{ID}.1",  # no queue
        f"{DL}.q.{ID}.1.1",
        f"{DL}.q/x.{ID}.1",
        f"{DL}..{ID}.1",
        f"{DL}.q.{ID.upper()}.1",
        ".nfs0000000001",
        "",
    ],
)
def test_in_flight_parser_rejects_foreign_names(filename: str) -> None:
    assert parse_in_flight_name(filename) is None


@pytest.mark.parametrize("filename", [ID, f"{ID}.", f"{ID}.0.1", f".{ID}.0", f"x{ID}.0", "foo.0", f"{ID}.0.tmp"])
def test_ready_parser_rejects_foreign_names(filename: str) -> None:
    assert parse_ready_name(filename) is None


@pytest.mark.parametrize("filename", [ID, f"q.{ID}.0", f".{ID}", f"q.{ID}x", f"a/b.{ID}", f"{'a' * 81}.{ID}", "q."])
def test_new_parser_rejects_foreign_names(filename: str) -> None:
    assert parse_new_name(filename) is None


@given(
    st.text(alphabet=st.sampled_from("0123456789abcdef-.q7\u00b2\u0663\uff11 \n"), max_size=60) | st.text(max_size=60)
)
def test_ready_names_that_parse_are_canonical(filename: str) -> None:
    parsed = parse_ready_name(filename)
    if parsed is not None:
        assert ready_name(*parsed) == filename


@given(st.text(max_size=80))
def test_in_flight_and_new_names_that_parse_are_canonical(filename: str) -> None:
    parsed = parse_in_flight_name(filename)
    if parsed is not None:
        assert parsed.filename == filename
    parsed_new = parse_new_name(filename)
    if parsed_new is not None:
        assert new_name(*parsed_new) == filename


@given(deadlines, queue_names, message_ids(), receive_counts, st.sampled_from(["\u00b2", "\u0663", "\uff11", "0", "a"]))
def test_in_flight_names_with_a_digit_swapped_in_parse_only_if_canonical(
    dl: int, name: QueueName, message_id: MessageId, rc: int, char: str
) -> None:
    """Replacing one digit of ``DL`` or ``RC`` never makes a name parse to something else."""
    filename = in_flight_name(dl, name, message_id, rc)
    for pos in (0, 12, len(filename) - 1):
        mutated = filename[:pos] + char + filename[pos + 1 :]
        parsed = parse_in_flight_name(mutated)
        assert parsed is None or parsed.filename == mutated


def _parse_in_flight_name_by_parts(filename: str) -> InFlightName | None:
    """``parse_in_flight_name`` as written before its one regex (split at "."; a regex per part): the reference."""
    parts = filename.split(".")
    if len(parts) == 6 and parts[2] == "fifo":  # DL.Q.fifo.ID.RC.LT: a FIFO queue (v2 only), section 19.1
        parts = [parts[0], parts[1] + ".fifo", *parts[3:]]
    if len(parts) == 5:
        deadline, queue, mid, rc, token = parts
        if not re.fullmatch(r"[0-9a-f]{17,32}", token):
            return None
    elif len(parts) == 4:
        deadline, queue, mid, rc = parts
        token = ""
    else:
        return None
    if (
        not re.fullmatch(r"[0-9]{13}", deadline)
        or not re.fullmatch(r"0|[1-9][0-9]{0,8}", rc)
        or not re.fullmatch(r"[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo", queue)
        or not ID_RE.fullmatch(mid)
    ):
        return None
    return InFlightName(int(deadline), QueueName(queue), MessageId(mid), int(rc), token)


_TOKEN = "a1b2c3d4e5f60718293"
_NEAR_NAMES = [
    f"{DL}.q.{ID}.1.{_TOKEN}",
    f"{DL}.q.{ID}.1",
    f"{DL}.q.fifo.{ID}.1.{_TOKEN}",
    f"{DL}.q.fifo.{ID}.1",  # a FIFO name is v2 only
    f"{DL}.{'a' * 75}.fifo.{ID}.2.{_TOKEN}",
    f"{DL}.{'a' * 76}.fifo.{ID}.2.{_TOKEN}",
    f"{DL}.{'a' * 80}.{ID}.2.{_TOKEN}",
    f"{DL}.{'a' * 81}.{ID}.2",
    f"{DL}.q.x.{ID}.1.{_TOKEN}",
    f"{DL}.q.{ID}.1.{_TOKEN[:16]}",
    f"{DL}.q.{ID}.1.{_TOKEN}0" * 2,
    f"{DL}.fifo.{ID}.1.{_TOKEN}",
    f"{DL}..fifo.{ID}.1.{_TOKEN}",
    f"{DL}.q.{ID}.0.{_TOKEN}",
]


@pytest.mark.parametrize("filename", _NEAR_NAMES)
def test_the_in_flight_parser_decides_as_its_part_by_part_reference(filename: str) -> None:
    assert parse_in_flight_name(filename) == _parse_in_flight_name_by_parts(filename)


@given(
    st.sampled_from(_NEAR_NAMES).flatmap(
        lambda name: st.tuples(st.just(name), st.integers(0, len(name) - 1), st.sampled_from(".0a-_f\u0663 x"))
    )
    | st.text(alphabet=st.sampled_from("0123456789abcdef-.qfio7x"), max_size=90).map(lambda t: (t, 0, None))
)
def test_the_in_flight_parser_decides_as_its_reference_on_mutated_names(case: tuple[str, int, str | None]) -> None:
    name, pos, char = case
    mutated = name if char is None else name[:pos] + char + name[pos + 1 :]
    assert parse_in_flight_name(mutated) == _parse_in_flight_name_by_parts(mutated)
