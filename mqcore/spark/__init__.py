"""The PySpark data source ``mq``: read queues into Spark and write DataFrames to them (docs/spark.md).

Spark 4's Python Data Source API (pyspark >= 4.0, pyarrow, Java 17: the
``spark`` extra). Register it in each session, then use the format ``mq``::

    import mqcore.spark

    mqcore.spark.register(spark)
    df = spark.read.format("mq").option("url", "http://127.0.0.1:8080").option("queue", "jobs").load()
    stream = spark.readStream.format("mq").option("queue", "jobs").option("consumer", "jobs-etl").load()
    df.select("body").write.format("mq").option("queue", "done").mode("append").save()

A batch read is a snapshot by peek (nothing is received or changed); a
streaming read's executors lease each micro-batch (bulk leases under keys its
offsets name) and the driver deletes the keys once Spark has committed the
batch (at least once); writes send each row as a message from the executors.
This package is the top layer: it uses :mod:`mqcore.client` only, and the
protocol core never imports it (an import-linter contract in CI).
"""

from __future__ import annotations

from typing import Any

try:
    from pyspark.sql.datasource import DataSource
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("mqcore.spark needs pyspark >= 4.0 and pyarrow: pip install 'mq[spark]'") from exc

from pyspark.sql.types import StructType

from mqcore.spark._options import OptionError, SourceOptions, parse
from mqcore.spark._read import READ_SCHEMA, MQBatchReader
from mqcore.spark._stream import MQStreamReader
from mqcore.spark._write import MQCommitMessage, MQStreamWriter, MQWriter, RowPlan, WriteFailed

__all__ = [
    "READ_SCHEMA",
    "MQBatchReader",
    "MQCommitMessage",
    "MQDataSource",
    "MQStreamReader",
    "MQStreamWriter",
    "MQWriter",
    "OptionError",
    "SourceOptions",
    "WriteFailed",
    "register",
]


class MQDataSource(DataSource):
    """The ``mq`` format: batch and streaming reads and writes of mq queues (options: docs/spark.md).

    Spark creates and pickles this object in several processes: it holds only
    its options (strings); readers and writers open clients when they run.
    """

    @classmethod
    def name(cls) -> str:
        """The format name, ``mq``."""
        return "mq"

    def schema(self) -> str:
        """The read schema (:data:`READ_SCHEMA`); called by ``load()``, which checks the options here.

        Raises:
            OptionError: An unknown option, no ``queue``, or a value out of range.
        """
        parse(self.options, "load")
        return READ_SCHEMA

    def reader(self, schema: StructType) -> MQBatchReader:
        """A batch reader (a snapshot by peek).

        Raises:
            OptionError: A missing, unknown or out-of-range option.
        """
        return MQBatchReader(parse(self.options, "read"))

    def streamReader(self, schema: StructType) -> MQStreamReader:
        """A streaming reader (leases micro-batches, at least once).

        Raises:
            OptionError: A missing, unknown or out-of-range option.
        """
        return MQStreamReader(parse(self.options, "stream"))

    def writer(self, schema: StructType, overwrite: bool) -> MQWriter:
        """A batch writer; only ``mode("append")`` (a queue cannot be overwritten).

        Raises:
            OptionError: ``overwrite`` mode, a bad option, or columns that cannot make messages.
        """
        if overwrite:
            raise OptionError('mq queues are append-only: write with mode("append")')
        options = parse(self.options, "write")
        return MQWriter(options, RowPlan.from_schema(schema, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> MQStreamWriter:
        """A streaming writer (each micro-batch's rows are sent; complete mode re-sends every row).

        Raises:
            OptionError: A bad option, or columns that cannot make messages.
        """
        options = parse(self.options, "write")
        return MQStreamWriter(options, RowPlan.from_schema(schema, options))


def register(spark: Any) -> None:
    """Register the ``mq`` format in ``spark`` (a SparkSession; needed once per session)."""
    spark.dataSource.register(MQDataSource)
