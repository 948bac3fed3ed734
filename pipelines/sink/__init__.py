"""Writing Spark DataFrames to journals, batch and streaming, through the AppendService."""
