"""Clicks from journals into a streaming table, and from it back to journals keyed by region.

`spark-pipelines run` imports this file with its Spark Connect session. The `gazette` format is
registered on that session first; the broker is the source's and sink's default (`$BROKER_ADDRESS`,
then gazctl.ini, then http://localhost:8080), so the same project runs against any cluster.
"""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.datasource import register

spark = SparkSession.active()  # The session spark-pipelines runs the definitions with.
register(spark)

CLICKS = "app.gazette.dev/message-type=Click"
"""The journals read: every journal labelled as holding Click messages, now and as they are created."""

BY_REGION = "app.gazette.dev/message-type=RegionClick"
"""The journals written: each region's clicks go to one of them (rendezvous mapping of the region)."""


@dp.table(comment="Every click appended to a Click journal, with its journal, offset and labels.")
def clicks() -> DataFrame:
    return (
        spark.readStream.format("gazette")
        .option("selector", CLICKS)
        .option("startingOffsets", "earliest")
        .schema("journal string, offset long, value binary, labels map<string, array<string>>")
        .load()
    )


dp.create_sink("clicks_by_region", format="gazette", options={"selector": BY_REGION})


@dp.append_flow(target="clicks_by_region")
def clicks_to_region_journals() -> DataFrame:
    region = F.col("labels").getItem("app.gazette.dev/region").getItem(0)
    click = F.struct(
        region.alias("region"),
        F.col("journal"),
        F.col("offset"),
        F.trim(F.col("value").cast("string")).alias("click"),
    )
    # Rows keep only `value` and `key`, as the journals sink wants them; the key maps each region
    # to one journal of BY_REGION, so a region's clicks stay in order in one journal.
    return spark.readStream.table("clicks").select(F.to_json(click).alias("value"), region.alias("key"))
