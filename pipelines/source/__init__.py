"""Reading journals into Spark: options, planning (partitions per fragment), executors' reads, streaming."""
