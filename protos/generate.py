"""Regenerate the committed protobuf/gRPC code from the ``.proto`` files (a dev tool).

``python protos/generate.py`` (``make protos``) rewrites the generated files in
``src/flmesh/v1``; :func:`generate` can write into any folder, which is how the staleness
test compares a fresh generation with what is committed. It needs grpcio-tools
(a dev dependency), so it lives outside the runtime package.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent  # the folder that holds flmesh/v1/*.proto
SRC_ROOT = PROTO_ROOT.parent / "src"  # the package: the generated code lands in src/flmesh/v1
PROTO_DIR = SRC_ROOT / "flmesh" / "v1"  # where the committed generated code is
PROTO_FILES = ("model.proto", "peer.proto", "aggregator.proto", "replay.proto")


def generate(out_root: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) for every proto into ``out_root``.

    Returns the generated files. Raises RuntimeError naming protoc's exit code
    when generation fails.
    """
    import grpc_tools  # type: ignore[import-untyped]
    from grpc_tools import protoc  # type: ignore[import-untyped]

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    out_root.mkdir(parents=True, exist_ok=True)
    sources = [str(PROTO_ROOT / "flmesh" / "v1" / name) for name in PROTO_FILES]
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc exited with {code} for {', '.join(PROTO_FILES)}")
    return sorted((out_root / "flmesh" / "v1").glob("*_pb2*.py*"))


def main() -> int:
    written = generate(SRC_ROOT)
    for path in written:
        print(path.relative_to(SRC_ROOT.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
