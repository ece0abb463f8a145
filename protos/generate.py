"""Regenerate the committed protobuf/gRPC code from the ``.proto`` files (a dev tool).

``python protos/generate.py`` (``make protos``) rewrites the files beside the
sources; :func:`generate` can write into any folder, which is how the staleness
test compares a fresh generation with what is committed. It needs grpcio-tools
(a dev dependency), so it lives outside the runtime package.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent  # the folder that holds flmesh/v1/*.proto
PROTO_DIR = PROTO_ROOT / "flmesh" / "v1"
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
    written = generate(PROTO_ROOT)
    for path in written:
        print(path.relative_to(PROTO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
