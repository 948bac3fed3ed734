"""The broker's etcd keyspace: connection choice, local mirror, member announcement, allocator."""

from broker.keyspace.allocator import desired_replication, run_allocator
from broker.keyspace.announce import Announcement
from broker.keyspace.errors import KeySpaceError
from broker.keyspace.etcd import EtcdConnection, EtcdProcess, open_etcd
from broker.keyspace.keyspace import (
    Assignment,
    Item,
    KeySpace,
    Member,
    assignment_key,
    compare_mod,
    delete_op,
    item_key,
    member_key,
    put_op,
    txn,
    write_suspend,
)

__all__ = [
    "Announcement",
    "Assignment",
    "EtcdConnection",
    "EtcdProcess",
    "Item",
    "KeySpace",
    "KeySpaceError",
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
