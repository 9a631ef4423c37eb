"""The ``aiobk`` PySpark data source (Spark 4 ``pyspark.sql.datasource``): batch and streaming
reads of logs, batch appends to them.

Its parts: ``aiobk.pipeline.options`` (the options, and the one place it connects),
``aiobk.pipeline.positions`` (which logs, from where to where), ``aiobk.pipeline.read`` (batch
reads and the rows), ``aiobk.pipeline.stream`` (streaming reads, admission control) and
``aiobk.pipeline.write`` (appends, whose commit is the client's ``append_ledgers_to_log``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from aiobk.pipeline.options import SCHEMA, Options
from aiobk.pipeline.read import BatchReader
from aiobk.pipeline.stream import StreamReader
from aiobk.pipeline.write import Writer


class AiobkDataSource(DataSource):
    """The ``aiobk`` PySpark data source: batch and streaming reads of logs (or ledgers),
    and batch appends to logs.

    Register it with ``register(spark)``, then use ``spark.read``, ``spark.readStream`` or
    ``df.write`` with ``format("aiobk")``; the Spark guide lists the options and columns.
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``aiobk``."""
        return "aiobk"

    def schema(self) -> str:
        """The columns read: log, ledger_id, entry_id, data, key, headers, timestamp,
        position, producer_id, sequence (new columns go at the end)."""
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader of the options given.

        Raises:
            ValueError: The options are missing or malformed.
        """
        return BatchReader(Options.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The streaming reader: log positions are its offsets.

        Raises:
            ValueError: Ledgers instead of logs, or a batch-only option.
        """
        opts = Options.parse(self.options)
        if opts.ledgers:
            raise ValueError("streaming reads need 'log', 'logs' or 'logPattern', not 'ledgers'")
        if opts.end_positions or opts.end_time is not None or "endingPosition" in self.options:
            raise ValueError("'endingPosition' and 'endingTimestamp' are for batch reads only")
        return StreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer: each log's part of a job is published all or nothing.

        Raises:
            ValueError: A mode other than append, or not one log option or ``log`` column.
        """
        opts = Options.parse(self.options, writing=True)
        if overwrite:
            raise ValueError("the aiobk data source only appends: use mode('append')")
        if opts.pattern or opts.ledgers or len(opts.logs) > 1:
            raise ValueError("writes take one .option('log', NAME) or a 'log' column")
        return Writer(opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """There is no streaming sink; write each micro-batch with ``foreachBatch``.

        Raises:
            ValueError: Always, saying so.
        """
        raise ValueError(
            "the aiobk source has no streaming sink: write each micro-batch with foreachBatch "
            "and the batch writer (df.write.format('aiobk')...mode('append').save())"
        )


def register(spark: Any) -> None:
    """Register the ``aiobk`` data source with a SparkSession.

    Args:
        spark: The session.
    """
    spark.dataSource.register(AiobkDataSource)


def local_session(app: str = "aiobk", master: str = "local[2]") -> Any:
    """A local SparkSession whose Python workers run this interpreter (the project's venv),
    with the ``aiobk`` source registered.

    Without PYSPARK_PYTHON the workers would start the system Python, which has neither
    pyspark's dependencies nor aiobk; this sets it (unless set) to ``sys.executable``.

    Args:
        app: The application name.
        master: The Spark master (``local[2]``: two worker threads).

    Returns:
        The session; stop it with ``spark.stop()``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    register(spark)
    return spark


__all__ = ["SCHEMA", "AiobkDataSource", "local_session", "register"]
