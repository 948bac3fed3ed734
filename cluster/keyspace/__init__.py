"""The etcd keyspace of brokers and consumers: connection choice, local mirror, member announcement,
allocator; parameterized by a `KeySpaceSchema` (`BROKER_SCHEMA` by default)."""

from cluster.keyspace.allocate import run_allocator
from cluster.keyspace.announce import Announcement
from cluster.keyspace.errors import KeySpaceError
from cluster.keyspace.etcd import EtcdConnection, EtcdProcess, open_etcd
from cluster.keyspace.keyspace import (
    BROKER_SCHEMA,
    Assignment,
    Item,
    KeySpace,
    KeySpaceSchema,
    Member,
    assignment_key,
    compare_mod,
    delete_op,
    desired_replication,
    item_key,
    member_key,
    put_op,
    txn,
    write_suspend,
)

__all__ = [
    "BROKER_SCHEMA",
    "Announcement",
    "Assignment",
    "EtcdConnection",
    "EtcdProcess",
    "Item",
    "KeySpace",
    "KeySpaceError",
    "KeySpaceSchema",
    "Member",
    "assignment_key",
    "compare_mod",
    "delete_op",
    "desired_replication",
    "item_key",
    "member_key",
    "open_etcd",
    "put_op",
    "run_allocator",
    "txn",
    "write_suspend",
]
