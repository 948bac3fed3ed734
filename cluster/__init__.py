"""What the broker and the consumer runtimes share, as Gazette keeps `keyspace/`, `allocator/` and
`server/` packages of their own: `keyspace` (etcd, the watched KeySpace mirror, member
announcements, the allocator) and `server` (the one-port listener, TLS, peer channels, logs,
process tuning, tolerant gRPC request decoding, a serving process's start and stop)."""
