"""`cluster.keyspace.etcd` under its old name (see `broker.keyspace`)."""

from cluster.keyspace.etcd import *  # noqa: F403
from cluster.keyspace.etcd import etcd_binary as etcd_binary
