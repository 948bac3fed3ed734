"""Gazette's wire protocol: messages and service stubs, validation, labels and selectors.

`pb` is the generated message module and `pb_grpc` the generated service stubs.
"""

from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
