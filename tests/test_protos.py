"""The committed generated code must match what the pinned protoc makes of the .proto files."""

from __future__ import annotations

import importlib.util
import re

from conftest import REPO


def _generator():
    spec = importlib.util.spec_from_file_location("protos_generate", REPO / "protos" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_current(tmp_path):
    generate = _generator()
    fresh = generate.generate(tmp_path)
    assert fresh, "protoc generated nothing"
    committed_dir = generate.PROTO_DIR
    for path in fresh:
        committed = committed_dir / path.name
        assert committed.exists(), f"{path.name} is not committed; run `make protos`"
        assert committed.read_bytes() == path.read_bytes(), f"{path.name} is stale; run `make protos`"
    names = {p.name for p in fresh}
    extra = {p.name for p in committed_dir.glob("*_pb2*.py*")} - names
    assert not extra, f"generated files with no .proto: {sorted(extra)}"


def test_the_generated_stubs_use_no_private_grpc_names():
    from flmesh.v1 import release_of

    generate = _generator()
    for path in generate.PROTO_DIR.glob("*_pb2_grpc.py"):
        text = path.read_text()
        private = re.findall(r"\bgrpc\._(?!_)\w+|\b_registered_method\b|\bgrpc\.experimental\b"
                             r"|\badd_registered_method_handlers\b", text)
        assert not private, f"{path.name} uses {private}"  # grpc.__version__ is public
    assert release_of("1.85.1") == (1, 85, 1) == release_of("1.85.1rc2")
    assert release_of("1.9.0") < release_of("1.85.1") < release_of("1.100.0")
