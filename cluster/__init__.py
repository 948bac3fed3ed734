"""What the broker and the consumer runtimes share, as Gazette keeps `keyspace/`, `allocator/` and
`server/` packages of their own: `keyspace` (etcd, the watched KeySpace mirror, member
announcements, the allocator) and `server` (the one-port listener, the HTTP/1.1 server, TLS, peer
channels, logs, process tuning, tolerant gRPC request decoding, a serving process's start and
stop, the flags its command line shares)."""
