"""The committed consumer protobuf and gRPC stubs match consumer/protocol/*.proto.

(Named apart from tests/broker/protocol/test_generated_stubs.py: test modules share one
namespace under pytest's default import mode, so equal basenames collide.)
"""

from __future__ import annotations

import ast
import filecmp
import shutil
from pathlib import Path

from grpc_tools import protoc

from consumer.protocol import pb

ROOT = Path(__file__).resolve().parents[3]
PROTOS = ["broker/protocol/protocol.proto", "consumer/protocol/recoverylog.proto", "consumer/protocol/consumer.proto"]
GENERATED = [
    "consumer_pb2.py", "consumer_pb2.pyi", "consumer_pb2_grpc.py", "recoverylog_pb2.py", "recoverylog_pb2.pyi",
]
REGENERATE = (
    "python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --mypy_out=. "
    "consumer/protocol/recoverylog.proto consumer/protocol/consumer.proto"
    " && rm consumer/protocol/recoverylog_pb2_grpc.py"
)


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    for proto in PROTOS:
        (tmp_path / proto).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / proto, tmp_path / proto)
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main([
        "protoc", f"-I{tmp_path}", f"-I{include}", f"--python_out={tmp_path}",
        f"--grpc_python_out={tmp_path}", f"--mypy_out={tmp_path}", *PROTOS[1:],
    ])
    assert rc == 0
    stale = [
        name for name in GENERATED
        if not filecmp.cmp(tmp_path / "consumer/protocol" / name, ROOT / "consumer/protocol" / name, shallow=False)
    ]
    assert not stale, f"regenerate with `{REGENERATE}`: stale {stale}"


def test_generated_imports_resolve_to_packages() -> None:
    text = (ROOT / "consumer/protocol/consumer_pb2.py").read_text()
    assert "from broker.protocol import protocol_pb2 " in text
    assert "from consumer.protocol import recoverylog_pb2 " in text


def test_hand_written_grpc_stub_names_the_service_rpcs() -> None:
    """consumer_pb2_grpc.pyi is written by hand: it must name exactly the Shard RPCs."""
    rpcs = {m.name for m in pb.DESCRIPTOR.services_by_name["Shard"].methods}
    tree = ast.parse((ROOT / "consumer/protocol/consumer_pb2_grpc.pyi").read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert set(classes) == {"ShardStub", "ShardServicer", "Shard"}
    stub_attrs = {
        n.target.id for n in classes["ShardStub"].body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    assert stub_attrs == rpcs
    for name in ("ShardServicer", "Shard"):
        methods = {n.name for n in classes[name].body if isinstance(n, ast.FunctionDef)}
        assert methods == rpcs, name
    for node in classes["ShardServicer"].body:
        assert isinstance(node, ast.FunctionDef)
        request = node.args.args[1].annotation
        assert request is not None
        method = pb.DESCRIPTOR.services_by_name["Shard"].methods_by_name[node.name]
        assert ast.unparse(request) == f"_pb.{method.input_type.name}"
