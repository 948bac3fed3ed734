"""Spark pipelines over journals selected by label.

- datasource: the `gazette` PySpark data source (format name `gazette`), and `register(spark)`
- source: reading journals (batch and streaming; fragments straight from their stores)
- sink: writing DataFrames to journals through the AppendService (batch and streaming)
- accumulators: Spark's planner workers send no empty profiler updates (over Spark Connect they break SDP runs)
- definitions: pipeline YAML files (source, transform, sink), validated before Spark starts
"""
