"""The row schema of the `gazette` source, in Spark and Arrow terms.

A user schema may name any base column (with its base type) plus extra columns: those are parsed
from each message's JSON value (`parse=json`, implied by extra columns).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipelines.source.options import GazetteOptionError, SourceOptions, parse_options

BASE_SCHEMA = StructType(
    [
        StructField("journal", StringType(), False),
        StructField("offset", LongType(), False),
        StructField("value", BinaryType(), True),
        StructField("uuid", StringType(), True),
        StructField("producer", StringType(), True),
        StructField("clock", LongType(), True),
        StructField("flags", IntegerType(), True),
        StructField("fragment_mod_time", TimestampType(), True),
        StructField("labels", MapType(StringType(), ArrayType(StringType(), False), False), True),
    ]
)
"""Columns of every row: where the message is, its bytes, its UUID parts, and its journal's labels."""


def source_schema(options: Mapping[str, str]) -> StructType:
    """The default schema: the base columns (validates `options` first, so errors come before Spark work)."""
    parse_options(options)
    return BASE_SCHEMA


def check_schema(schema: StructType, options: SourceOptions) -> list[str]:
    """The extra (parsed) column names of `schema`; raise GazetteOptionError for a base column of the wrong type."""
    by_name = {f.name: f for f in BASE_SCHEMA.fields}
    extra = []
    for f in schema.fields:
        base = by_name.get(f.name)
        if base is None:
            extra.append(f.name)
        elif _nullable(base.dataType) != _nullable(f.dataType):
            raise GazetteOptionError(
                f"schema: column {f.name!r} must be {base.dataType.simpleString()}, not {f.dataType.simpleString()}"
            )
    if extra and options.parse == "none":
        raise GazetteOptionError(f"parse: is 'none', but the schema has columns to parse: {', '.join(extra)}")
    return extra


def _nullable(t: DataType) -> DataType:
    """`t` with every array element and map value nullable: a user schema may loosen `labels` so
    (as `map<string, array<string>>` in DDL does), and its rows are then built with its own type."""
    if isinstance(t, ArrayType):
        return ArrayType(_nullable(t.elementType), True)
    if isinstance(t, MapType):
        return MapType(_nullable(t.keyType), _nullable(t.valueType), True)
    return t


# Spark's JVM takes TimestampType columns as UTC instants. PySpark 4.0-4.2 convert them so by
# default (`timestamp_utc=True`); 4.3 asks for the zone (`timezone=`) and asserts it was given.
_UTC_TIMESTAMPS: dict[str, Any] = (
    {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_schema).parameters else {}
)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects of batches of `schema` (PySpark 4.3 compares it field by field,
    names and nullability of nested fields included)."""
    return to_arrow_schema(schema, **_UTC_TIMESTAMPS)


ARROW_BASE = arrow_schema(BASE_SCHEMA)
"""The Arrow types of the base columns (int64 for LongType, microseconds in UTC for TimestampType, ...)."""
