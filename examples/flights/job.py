"""The Structured Streaming job: source ``mq`` -> JSON -> per carrier and month -> Parquet.

::

    spark.readStream.format("mq")            one row per message (docs/spark.md)
      -> from_json(body_text, schema)         the flight, with an explicit schema
      -> dropDuplicates(["row"])               a redelivered flight counts once
      -> groupBy(carrier, month).agg(...)      flights; count and mean of dep_delay, arr_delay
      -> outputMode("complete").foreachBatch   overwrite one Parquet table with the whole result

Why this shape (docs/examples.md says more): the aggregate is small (at most 16
carriers x 12 months), so each micro-batch writes all of it; rewriting the whole
table is idempotent, so a batch that Spark runs again after a restart writes the
same table; and the source delivers at least once, so the job drops messages whose
``row`` it has already counted (the state keeps one key per flight).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from examples.flights.data import FLIGHT_SCHEMA_DDL, Aggregate, Key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

#: Spark's log settings for this example: errors only (the default also prints INFO and WARN lines).
LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")

#: Spark settings of this example on top of mqcore.spark.session's (quick, quiet, scratch in the work dir).
SPARK_CONF = {
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}",
}


def spark_session(
    work_dir: Path, app_name: str = "mq-flights", master: str = "local[2]", conf: dict[str, str] | None = None
) -> SparkSession:
    """A SparkSession on ``master`` (``local[N]`` or ``spark://host:port``) with the ``mq`` data source registered.

    The settings are mqcore.spark.session's: ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` (so
    Python workers run this interpreter, which has mq installed) unless set, and every
    scratch folder of Spark under ``work_dir`` (nothing is left in /tmp). ``conf`` adds Spark
    confs (``--conf``); ``*.extraJavaOptions`` are appended to this example's, not replacing them.
    """
    from mqcore.spark.session import spark_session as start

    extra = dict(SPARK_CONF)
    for key, value in (conf or {}).items():
        extra[key] = f"{extra[key]} {value}" if key.endswith(".extraJavaOptions") and key in extra else value
    return start(master, work_dir, app_name=app_name, extra=extra)


@dataclass
class Progress:
    """What the job's sink has written so far (updated from the foreachBatch callback on the driver).

    Attributes:
        batches: Micro-batches written.
        last_batch_id: Id of the last one (-1 before the first).
        flights: Flights counted in the table written last (distinct ``row`` values).
        rows: Rows of that table ((carrier, month) pairs).
    """

    batches: int = 0
    last_batch_id: int = -1
    flights: int = 0
    rows: int = 0
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def record(self, batch_id: int, flights: int, rows: int) -> None:
        with self._changed:
            self.batches += 1
            self.last_batch_id = batch_id
            self.flights = flights
            self.rows = rows
            self._changed.notify_all()

    def wait_for_flights(self, flights: int, timeout_seconds: float) -> bool:
        """Wait up to ``timeout_seconds`` until the table counts ``flights``; True if it does."""
        with self._changed:
            return self._changed.wait_for(lambda: self.flights >= flights, timeout_seconds)


def start_query(
    spark: SparkSession,
    source_options: dict[str, str],
    output: Path,
    checkpoint: Path,
    *,
    trigger_seconds: float = 1.0,
    available_now: bool = False,
) -> tuple[StreamingQuery, Progress]:
    """Start the streaming job; return the query and the :class:`Progress` its sink updates.

    Args:
        spark: A session from :func:`spark_session`.
        source_options: Options of the ``mq`` source (``url`` or ``root``, ``queue``, ...).
        output: Parquet directory, overwritten by every micro-batch with the whole result.
        checkpoint: The query's checkpoint directory.
        trigger_seconds: Processing-time trigger interval (a batch starts at most this often).
        available_now: Instead, ``trigger(availableNow=True)``: process what is in the queue now, then stop.
    """
    from pyspark.sql import functions as F

    messages = spark.readStream.format("mq").options(**source_options).load()
    flights = messages.select(F.from_json("body_text", FLIGHT_SCHEMA_DDL).alias("flight")).select("flight.*")
    per_carrier_month = (
        flights.dropDuplicates(["row"])
        .groupBy("carrier", "month")
        .agg(
            F.count(F.lit(1)).alias("flights"),
            F.count("dep_delay").alias("dep_delay_n"),
            F.avg("dep_delay").alias("mean_dep_delay"),
            F.count("arr_delay").alias("arr_delay_n"),
            F.avg("arr_delay").alias("mean_arr_delay"),
        )
    )
    progress = Progress()
    path = str(output)

    def write_table(table: DataFrame, batch_id: int) -> None:
        table.persist()
        try:
            table.write.mode("overwrite").parquet(path)
            counted = table.agg(F.sum("flights").alias("n"), F.count(F.lit(1)).alias("rows")).first()
        finally:
            table.unpersist()
        assert counted is not None
        progress.record(batch_id, int(counted["n"] or 0), int(counted["rows"]))

    query = (
        per_carrier_month.writeStream.queryName("flights_by_carrier_month")
        .outputMode("complete")
        .foreachBatch(write_table)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**({"availableNow": True} if available_now else {"processingTime": f"{trigger_seconds} seconds"}))
        .start()
    )
    return query, progress


def read_result(spark: SparkSession, output: Path) -> dict[Key, Aggregate]:
    """The Parquet table the job wrote, keyed by (carrier, month)."""
    return {
        (row["carrier"], row["month"]): Aggregate(
            flights=row["flights"],
            dep_delay_n=row["dep_delay_n"],
            mean_dep_delay=row["mean_dep_delay"],
            arr_delay_n=row["arr_delay_n"],
            mean_arr_delay=row["mean_arr_delay"],
        )
        for row in spark.read.parquet(str(output)).collect()
    }
