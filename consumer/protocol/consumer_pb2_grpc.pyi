"""Type stub of the generated consumer_pb2_grpc module (written by hand, not generated).

grpcio ships no type information, so the channel, server and context are `Any` here; the
request types are consumer_pb2's. tests/consumer/protocol/test_generated_stubs.py checks that
this stub names exactly the RPCs of consumer.proto's Shard service.
"""

from typing import Any

from consumer.protocol import consumer_pb2 as _pb

GRPC_GENERATED_VERSION: str
GRPC_VERSION: str

class ShardStub:
    Stat: Any
    List: Any
    Apply: Any
    GetHints: Any
    Unassign: Any
    def __init__(self, channel: Any) -> None: ...

class ShardServicer:
    def Stat(self, request: _pb.StatRequest, context: Any) -> Any: ...
    def List(self, request: _pb.ListRequest, context: Any) -> Any: ...
    def Apply(self, request: _pb.ApplyRequest, context: Any) -> Any: ...
    def GetHints(self, request: _pb.GetHintsRequest, context: Any) -> Any: ...
    def Unassign(self, request: _pb.UnassignRequest, context: Any) -> Any: ...

def add_ShardServicer_to_server(servicer: ShardServicer, server: Any) -> None: ...

class Shard:
    @staticmethod
    def Stat(request: _pb.StatRequest, target: str, *args: Any, **kwargs: Any) -> Any: ...
    @staticmethod
    def List(request: _pb.ListRequest, target: str, *args: Any, **kwargs: Any) -> Any: ...
    @staticmethod
    def Apply(request: _pb.ApplyRequest, target: str, *args: Any, **kwargs: Any) -> Any: ...
    @staticmethod
    def GetHints(request: _pb.GetHintsRequest, target: str, *args: Any, **kwargs: Any) -> Any: ...
    @staticmethod
    def Unassign(request: _pb.UnassignRequest, target: str, *args: Any, **kwargs: Any) -> Any: ...
