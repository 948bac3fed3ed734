"""Type stub of the generated word_count_pb2_grpc module (written by hand, not generated).

grpcio ships no type information, so the channel, server and context are `Any` here.
tests/examples/test_word_count.py checks that this stub names exactly the NGram RPCs.
"""

from typing import Any

from examples.word_count import word_count_pb2 as _pb

GRPC_GENERATED_VERSION: str
GRPC_VERSION: str

class NGramStub:
    Publish: Any
    Query: Any
    def __init__(self, channel: Any) -> None: ...

class NGramServicer:
    def Publish(self, request: _pb.PublishRequest, context: Any) -> Any: ...
    def Query(self, request: _pb.QueryRequest, context: Any) -> Any: ...

def add_NGramServicer_to_server(servicer: NGramServicer, server: Any) -> None: ...

class NGram:
    @staticmethod
    def Publish(request: _pb.PublishRequest, target: str, *args: Any, **kwargs: Any) -> Any: ...
    @staticmethod
    def Query(request: _pb.QueryRequest, target: str, *args: Any, **kwargs: Any) -> Any: ...
