"""The committed protobuf and gRPC stubs match broker/protocol/protocol.proto."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ["protocol_pb2.py", "protocol_pb2_grpc.py", "protocol_pb2.pyi"]


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    (tmp_path / "broker" / "protocol").mkdir(parents=True)
    shutil.copy(ROOT / "broker/protocol/protocol.proto", tmp_path / "broker/protocol/protocol.proto")
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main([
        "protoc", f"-I{tmp_path}", f"-I{include}", f"--python_out={tmp_path}",
        f"--grpc_python_out={tmp_path}", f"--mypy_out={tmp_path}", "broker/protocol/protocol.proto",
    ])
    assert rc == 0
    stale = [
        name for name in GENERATED
        if not filecmp.cmp(tmp_path / "broker/protocol" / name, ROOT / "broker/protocol" / name, shallow=False)
    ]
    assert not stale, f"regenerate with scripts/gen-protos: stale {stale}"
