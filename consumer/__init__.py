"""Gazette's consumer framework, in Python.

Built so far (the runtime that runs shards, `gazette consume` and the Shard API are not yet):

- `message`: the message layer: UUIDs and clocks, framings, mappings, the Publisher, readers
  and the read-committed Sequencer.
- `protocol`: Gazette's `consumer` (and `recoverylog`) protobuf packages and their validation;
  shard spec helpers and the spec algebra.
- `keyspace`: CONSUMER_SCHEMA, with which the broker's etcd mirror, member announcement and
  allocator serve shards and consumer members.
- `application`, `shard`, `store`: the protocols an application, a shard and a store implement.
- `transaction`: the transaction state machine (sizing, pipelining, the commit barrier chain,
  ACKs); `checkpoint`: building and flattening checkpoints.
- `stores`: `SQLStore`, fenced checkpoints over DB-API connections (PostgreSQL, SQLite).
"""
