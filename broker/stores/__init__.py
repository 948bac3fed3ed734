"""Fragment stores: where rolled fragments are persisted (file://, s3://)."""
