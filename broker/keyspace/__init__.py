"""`cluster.keyspace` under the name it had before it moved out of `broker` (scripts outside the
project, such as peer benchmarks, import `broker.keyspace.etcd`); new code imports `cluster.keyspace`."""

from cluster.keyspace import *  # noqa: F403
from cluster.keyspace import __all__ as __all__
