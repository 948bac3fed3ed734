"""Gazette's consumer wire protocol: the `consumer` protobuf package and its Shard service.

`pb` is the generated message module of consumer/protocol/consumer.proto (ShardSpec,
ConsumerSpec, ReplicaStatus, Checkpoint, Status and the Shard RPC messages), `pb_grpc` its
generated Shard service stubs, and `recoverylog_pb` the generated `recoverylog` package
(RecordedOp, Segment, FnodeSegments, FSMHints, Property) that GetHints and Apply carry.
Broker types (Header, LabelSet, ProcessSpec, Route) come from `broker.protocol.pb`.
Validation of these messages is in `consumer.protocol.validation`.
"""

from consumer.protocol import consumer_pb2 as pb
from consumer.protocol import consumer_pb2_grpc as pb_grpc
from consumer.protocol import recoverylog_pb2 as recoverylog_pb

__all__ = ["pb", "pb_grpc", "recoverylog_pb"]
