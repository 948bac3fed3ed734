"""Gazette's consumer framework, in Python (see docs/consumers.md).

- `message`: the message layer: UUIDs and clocks, framings, mappings, the Publisher, readers
  and the read-committed Sequencer.
- `protocol`: Gazette's `consumer` (and `recoverylog`) protobuf packages and their validation;
  shard spec helpers and the spec algebra.
- `keyspace`: CONSUMER_SCHEMA, with which the broker's etcd mirror, member announcement and
  allocator serve shards and consumer members.
- `application`, `shard`, `store`: the protocols an application, a shard and a store implement.
- `transaction`: the transaction state machine (sizing, pipelining, the commit barrier chain,
  ACKs); `checkpoint`: building and flattening checkpoints.
- `replica` (one shard's lifecycle: recovery from its log, standby, primary, hand-off),
  `service` (`ConsumerService`: announce, mirror, allocator, replicas), `resolver` (a shard's
  primary, local or remote), `api` (the Shard gRPC API).
- `recoverylog`: recovery logs: the recorded operations' FSM, the Recorder, the Player (and hot
  standbys tailing a log), hints in etcd.
- `app_api`: "Building APIs": the `AppContext` an application's `init_application(ctx)` gets, to
  serve its own gRPC services and HTTP routes on the consumer's port and resolve or proxy
  requests to a shard's primary.
- `process`, `cli`: `gazette consume MODULE:ATTR` (the `gazette` command, with the broker's `serve`,
  is `gazette.cli`).
- `stores`: `SQLStore`, fenced checkpoints over DB-API connections (PostgreSQL, SQLite), and the
  local stores recorded to a shard's recovery log: `JSONFileStore`, `SQLiteStore` (a recorded VFS).
"""
