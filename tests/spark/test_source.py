"""The ``mq`` data source in a real local SparkSession: batch and streaming reads, batch and streaming writes.

Every path runs twice: against a real stack (mq, mq-mover, mq-reaper on a temp
root, over HTTP; tests/conftest.py) and brokerless on a temp root (the driver and
the executors open LocalClients on it). What is checked is what a user sees: the
rows Spark produced, and the queue afterwards, read back with the project's
clients (peek, queue stats). Nothing is mocked; no timing assertions (waits are
generous and end as soon as what is waited for happens).
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mqcore.client import BatchEntry, Client, LocalClient, PeekedMessage, connect

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

#: Generous bound on waiting for a streaming query (never a speed test).
WAIT_SECONDS = 90.0
#: The attributes of test queues with a dead-letter queue: one receive without a delete dead-letters.
DLQ_ATTRIBUTES = {"max_receive_count": 1}


@dataclass
class Backend:
    """Where the queues are: a stack over HTTP, or a brokerless root."""

    kind: str
    target: str
    client: Client | LocalClient

    def options(self, queue: str | None = None, **extra: Any) -> dict[str, str]:
        """Options for ``spark.read/readStream/write.format("mq").options(...)``."""
        out = {"url" if self.kind == "http" else "root": self.target}
        if queue is not None:
            out["queue"] = queue
        out.update({k: str(v) for k, v in extra.items()})
        return out

    def peek_all(self, queue: str) -> list[PeekedMessage]:
        """Every message of ``queue`` (nothing changes)."""
        return list(self.client.iter_peek(queue, page_size=1000))

    def pending(self, queue: str) -> int:
        """Ready + in flight + delayed messages of ``queue``."""
        stats = self.client.queue_stats(queue)
        return int(stats["ready"]) + int(stats["in_flight"]) + int(stats["delayed"])


@pytest.fixture(params=["http", "brokerless"])
def mq(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The queues: a real stack shared by this module's HTTP tests, or a new brokerless root."""
    if request.param == "http":
        target = request.getfixturevalue("_module_stack").url
    else:
        root = tmp_path / "root"
        root.mkdir()
        target = str(root)
    with connect(target) as client:
        yield Backend(request.param, target, client)


@pytest.fixture
def http_mq(tmp_path: Path, _module_stack: Any) -> Iterator[Backend]:
    """The module's stack over HTTP only (for the paths that need no second run brokerless)."""
    with connect(_module_stack.url) as client:
        yield Backend("http", _module_stack.url, client)


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
    """Poll ``predicate`` until truthy (and return it); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def sent_ms(value: datetime.datetime) -> int:
    """A collected TIMESTAMP (naive, local time) as epoch milliseconds."""
    return round(value.timestamp() * 1000)


# -- batch read -----------------------------------------------------------------------------------


def _make_every_state(mq: Backend, queue: str) -> None:
    """One message in each state: ready, in_flight, delayed, and dead-lettered into ``<queue>-dlq``."""
    dlq = f"{queue[:70]}-dlq"
    mq.client.create_queue(dlq)
    mq.client.create_queue(queue, {"dead_letter_queue": dlq, **DLQ_ATTRIBUTES})
    mq.client.send(queue, b"dead", attributes={"why": "poison"})
    assert [m.body for m in mq.client.receive(queue, visibility_timeout_seconds=0)] == [b"dead"]
    # The second receive finds it over max_receive_count and moves it to the dead-letter queue.
    wait_until(
        lambda: mq.client.receive(queue, max_messages=10, wait_time_seconds=0) == [] and mq.peek_all(dlq),
        "the message to be dead-lettered",
    )
    mq.client.send(queue, b"in flight", content_type="text/plain")
    assert [m.body for m in mq.client.receive(queue, visibility_timeout_seconds=600)] == [b"in flight"]
    mq.client.send(queue, b"\xff\xfe not utf-8", attributes={"tenant": "acme", "trace": "4bf9"})
    mq.client.send(queue, "later", delay_seconds=600)


def test_batch_read_shows_every_state_and_consumes_nothing(spark: Any, mq: Backend, queue: str) -> None:
    _make_every_state(mq, queue)
    dlq = f"{queue[:70]}-dlq"
    before = {m.message_id: (m.state, m.receive_count) for m in mq.peek_all(queue) + mq.peek_all(dlq)}

    df = spark.read.format("mq").options(**mq.options(queue)).load()
    assert df.columns == [
        "message_id",
        "queue",
        "body",
        "body_text",
        "content_type",
        "attributes",
        "sent_timestamp",
        "receive_count",
        "state",
    ]
    rows = {bytes(r.body): r for r in df.collect()}

    assert set(rows) == {b"\xff\xfe not utf-8", b"dead", b"in flight", b"later"}
    assert {body: r.state for body, r in rows.items()} == {
        b"dead": "dead_lettered",
        b"in flight": "in_flight",
        b"\xff\xfe not utf-8": "ready",
        b"later": "delayed",
    }
    assert {r.queue for r in rows.values()} == {queue}, "dead-lettered rows carry the queue they came from"
    assert rows[b"\xff\xfe not utf-8"].body_text is None, "body_text is null unless the body is UTF-8"
    assert rows[b"\xff\xfe not utf-8"].attributes == {"tenant": "acme", "trace": "4bf9"}
    assert rows[b"\xff\xfe not utf-8"].content_type == "application/octet-stream"
    assert rows[b"later"].body_text == "later"
    assert rows[b"later"].content_type == "text/plain; charset=utf-8"
    assert rows[b"in flight"].receive_count == 1
    assert rows[b"dead"].attributes == {"why": "poison"}
    peeked = {m.message_id: m for m in mq.peek_all(queue) + mq.peek_all(dlq)}
    for row in rows.values():
        assert sent_ms(row.sent_timestamp) == peeked[row.message_id].sent_ms

    after = {m.message_id: (m.state, m.receive_count) for m in mq.peek_all(queue) + mq.peek_all(dlq)}
    assert after == before, "a batch read must not receive, lease or move anything"

    without = spark.read.format("mq").options(**mq.options(queue, includeDeadLetters="false")).load()
    assert sorted(r.state for r in without.collect()) == ["delayed", "in_flight", "ready"]


def test_batch_read_partitions_cover_every_message_once(spark: Any, mq: Backend, queue: str) -> None:
    from pyspark.sql.functions import spark_partition_id

    other = f"{queue[:70]}-b"
    for name in (queue, other):
        mq.client.create_queue(name)
    ids = {queue: mq.client.send_batch(queue, [f"a{i}" for i in range(60)])}
    ids[other] = mq.client.send_batch(other, [f"b{i}" for i in range(15)])

    df = spark.read.format("mq").options(**mq.options(queues=f"{queue},{other}", numPartitions=3, pageSize=7)).load()
    assert df.rdd.getNumPartitions() == 6, "numPartitions input partitions per queue"
    rows = df.withColumn("part", spark_partition_id()).collect()

    assert len(rows) == 75
    for name, sent in ids.items():
        assert sorted(r.message_id for r in rows if r.queue == name) == sorted(sent)
    assert len({r.message_id for r in rows}) == 75, "no message in two partitions"
    assert len({r.part for r in rows if r.queue == queue}) > 1, "a queue's messages are spread over its partitions"
    assert {r.state for r in rows} == {"ready"}
    assert mq.client.queue_stats(queue)["ready"] == 60, "nothing consumed"


# -- streaming read -------------------------------------------------------------------------------


def test_stream_available_now_drains_the_queue_in_bounded_batches(
    spark: Any, mq: Backend, queue: str, tmp_path: Path
) -> None:
    mq.client.create_queue(queue)
    bodies = [f"m{i:02d}" for i in range(25)]
    mq.client.send_batch(queue, [BatchEntry(b, attributes={"n": b[1:]}) for b in bodies])

    stream = spark.readStream.format("mq").options(**mq.options(queue, maxMessagesPerBatch=10)).load()
    query = (
        stream.writeStream.format("memory")
        .queryName(queue)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(WAIT_SECONDS), "the availableNow run did not end"
    assert query.exception() is None

    rows = spark.sql(f"SELECT * FROM `{queue}`").collect()
    assert sorted(r.body_text for r in rows) == bodies
    assert len({r.message_id for r in rows}) == 25
    assert all(r.attributes == {"n": r.body_text[1:]} for r in rows)
    assert {(r.queue, r.state, r.receive_count) for r in rows} == {(queue, "in_flight", 1)}
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 25
    assert max(sizes) <= 10, f"maxMessagesPerBatch=10 must bound every micro-batch: {sizes}"
    assert mq.pending(queue) == 0, "every processed message is deleted once the run ends"
    assert mq.peek_all(queue) == []


def test_stream_with_prefetch_delivers_every_message_once_in_bounded_batches(
    spark: Any, http_mq: Backend, queue: str, tmp_path: Path
) -> None:
    mq = http_mq
    mq.client.create_queue(queue)
    bodies = [f"p{i:02d}" for i in range(25)]
    mq.client.send_batch(queue, bodies)
    batches: list[list[str]] = []

    stream = spark.readStream.format("mq").options(**mq.options(queue, maxMessagesPerBatch=10, prefetch="true")).load()
    query = (
        stream.writeStream.foreachBatch(lambda df, _: batches.append([r.body_text for r in df.collect()]))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(WAIT_SECONDS), "the availableNow run did not end"
    assert query.exception() is None
    assert sorted(b for batch in batches for b in batch) == bodies, "every message once"
    assert [len(batch) for batch in batches if batch] == [10, 10, 5], batches
    assert mq.pending(queue) == 0, "every batch deleted, nothing prefetched beyond the run's bound"


def test_stream_processing_time_trigger_picks_up_messages_sent_while_it_runs(
    spark: Any, http_mq: Backend, queue: str, tmp_path: Path
) -> None:
    mq = http_mq
    mq.client.create_queue(queue)
    stream = spark.readStream.format("mq").options(**mq.options(queue, consumer=f"c-{uuid.uuid4().hex}")).load()
    query = (
        stream.select("body_text")
        .writeStream.format("memory")
        .queryName(queue)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:

        def seen() -> list[str]:
            return sorted(r.body_text for r in spark.sql(f"SELECT body_text FROM `{queue}`").collect())

        first = [f"first-{i}" for i in range(5)]
        mq.client.send_batch(queue, first)
        wait_until(lambda: seen() == first, "the first messages in the sink")
        later = [f"later-{i}" for i in range(7)]
        mq.client.send_batch(queue, later)
        wait_until(lambda: seen() == sorted(first + later), "the messages sent while the query runs")
        wait_until(lambda: mq.pending(queue) == 0, "the processed messages to be deleted")
        assert query.isActive
    finally:
        query.stop()
    assert query.exception() is None


def test_stream_restart_rereads_the_uncommitted_batch_from_the_checkpoint(
    spark: Any, http_mq: Backend, queue: str, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    mq = http_mq
    mq.client.create_queue(queue)
    bodies = [f"r{i:02d}" for i in range(30)]
    mq.client.send_batch(queue, bodies)
    delivered: list[tuple[int, str]] = []
    fail_batch = {1}

    def sink(df: Any, batch_id: int) -> None:
        if batch_id in fail_batch:
            raise RuntimeError(f"injected failure in batch {batch_id}")
        delivered.extend((batch_id, r.body_text) for r in df.collect())

    def run() -> Any:
        stream = spark.readStream.format("mq").options(**mq.options(queue, maxMessagesPerBatch=10)).load()
        return (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    query = run()
    with pytest.raises(StreamingQueryException, match="injected failure in batch 1"):
        query.awaitTermination(WAIT_SECONDS)
    stats = mq.client.queue_stats(queue)
    assert len(delivered) == 10, "batch 0 reached the sink"
    # Batch 0 deleted; batch 1's messages still ready. Its executors lease them when the batch is read
    # (bulk leases, issue 17): this sink failed before reading, so nothing of it is in flight.
    assert (stats["in_flight"], stats["ready"]) == (0, 20), "batch 0 deleted, batch 1 never leased"

    fail_batch.clear()
    query = run()
    assert query.awaitTermination(WAIT_SECONDS), "the restarted run did not end"
    assert query.exception() is None
    assert sorted(body for _, body in delivered) == bodies, "every message once: batch 1 re-read at once"
    assert sorted({batch for batch, _ in delivered}) == [0, 1, 2]
    assert mq.pending(queue) == 0


def test_stream_with_a_reused_consumer_name_and_a_new_checkpoint_still_reads(
    spark: Any, http_mq: Backend, queue: str, tmp_path: Path
) -> None:
    """The second query's attempt ids repeat the first one's: the server's replays of them are empty."""
    mq = http_mq
    mq.client.create_queue(queue)
    seen: list[str] = []
    for run in ("first", "second"):
        mq.client.send_batch(queue, [f"{run}-{i}" for i in range(15)])
        stream = spark.readStream.format("mq").options(**mq.options(queue, consumer="same-name")).load()
        query = (
            stream.select("body_text")
            .writeStream.foreachBatch(lambda df, _: seen.extend(r.body_text for r in df.collect()))
            .option("checkpointLocation", str(tmp_path / f"checkpoint-{run}"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(WAIT_SECONDS), f"the {run} run did not end"
        assert query.exception() is None
    assert sorted(seen) == sorted(f"{run}-{i}" for run in ("first", "second") for i in range(15))
    assert mq.pending(queue) == 0


# -- writes ---------------------------------------------------------------------------------------


def test_batch_write_sends_each_row_as_a_message(spark: Any, mq: Backend, queue: str) -> None:
    other = f"{queue[:70]}-other"
    for name in (queue, other):
        mq.client.create_queue(name)
    schema = "body BINARY, content_type STRING, attributes MAP<STRING,STRING>, delay_seconds INT, queue STRING"
    rows = [
        (b"\x00\x01 binary", "application/x-test", {"k": "v"}, None, None),
        (b"plain", None, None, None, None),
        (b"delayed", None, None, 600, None),
        (b"to the other queue", None, {"a": "1", "b": "2"}, None, other),
    ]
    df = spark.createDataFrame(rows, schema).repartition(2)
    df.write.format("mq").options(**mq.options(queue)).mode("append").save()

    got = {m.body: m for m in mq.peek_all(queue)}
    assert sorted(got) == [b"\x00\x01 binary", b"delayed", b"plain"]
    assert got[b"\x00\x01 binary"].content_type == "application/x-test"
    assert dict(got[b"\x00\x01 binary"].attributes) == {"k": "v"}
    assert got[b"plain"].content_type == "application/octet-stream"
    assert dict(got[b"plain"].attributes) == {}
    assert got[b"delayed"].state == "delayed"
    assert got[b"plain"].state == "ready"
    (moved,) = mq.peek_all(other)
    assert (moved.body, dict(moved.attributes)) == (b"to the other queue", {"a": "1", "b": "2"})

    text = spark.createDataFrame([("héllo",), ("wörld",)], "value STRING")
    text.write.format("mq").options(**mq.options(other, batchSize=2)).mode("append").save()
    texts = {m.body: m.content_type for m in mq.peek_all(other) if m.body != b"to the other queue"}
    assert texts == {"héllo".encode(): "text/plain; charset=utf-8", "wörld".encode(): "text/plain; charset=utf-8"}


def test_stream_write_pipes_one_queue_into_another(spark: Any, mq: Backend, queue: str, tmp_path: Path) -> None:
    from pyspark.sql.functions import upper

    source, target = f"{queue[:70]}-in", f"{queue[:70]}-out"
    for name in (source, target):
        mq.client.create_queue(name)
    words = [f"word{i}" for i in range(12)]
    mq.client.send_batch(source, [BatchEntry(w, attributes={"origin": w}) for w in words])

    stream = spark.readStream.format("mq").options(**mq.options(source, maxMessagesPerBatch=5)).load()
    query = (
        stream.select(upper("body_text").alias("value"), "attributes")
        .writeStream.format("mq")
        .options(**mq.options(target))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(WAIT_SECONDS), "the availableNow run did not end"
    assert query.exception() is None

    out = mq.peek_all(target)
    assert sorted(m.body.decode() for m in out) == sorted(w.upper() for w in words)
    assert all(dict(m.attributes) == {"origin": m.body.decode().lower()} for m in out)
    assert {m.content_type for m in out} == {"text/plain; charset=utf-8"}
    assert mq.pending(source) == 0


def test_write_to_a_missing_queue_fails_the_job(spark: Any, http_mq: Backend, queue: str) -> None:
    from pyspark.errors import PySparkException

    df = spark.createDataFrame([("lost?",)], "value STRING")
    with pytest.raises(PySparkException, match="QueueNotFound"):
        df.write.format("mq").options(**http_mq.options(queue)).mode("append").save()


def test_bad_options_and_columns_are_refused_before_anything_runs(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import PySparkException

    mq = {"root": str(tmp_path)}
    with pytest.raises(PySparkException, match="option queue is required"):
        spark.read.format("mq").options(**mq).load()
    with pytest.raises(PySparkException, match=r"unknown option.*maxmessageperbatch"):
        spark.readStream.format("mq").options(**mq, queue="q", maxMessagePerBatch="5").load()
    with pytest.raises(PySparkException, match="out of range"):
        spark.readStream.format("mq").options(**mq, queue="q", visibilityTimeoutSeconds="0").load()
    with pytest.raises(PySparkException, match="append-only"):
        spark.createDataFrame([("x",)], "value STRING").write.format("mq").options(**mq, queue="q").mode(
            "overwrite"
        ).save()
    with pytest.raises(PySparkException, match="exactly one of the columns body or value"):
        spark.createDataFrame([("x", "y")], "body STRING, value STRING").write.format("mq").options(
            **mq, queue="q"
        ).mode("append").save()
    with pytest.raises(PySparkException, match="cannot be written to mq"):
        spark.createDataFrame([("x", 1)], "value STRING, priority INT").write.format("mq").options(
            **mq, queue="q"
        ).mode("append").save()
