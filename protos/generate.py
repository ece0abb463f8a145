"""Regenerate the committed protobuf/gRPC code from the ``.proto`` files (a dev tool).

``python protos/generate.py`` (``make protos``) rewrites the generated files in
``src/flmesh/v1``; :func:`generate` can write into any folder, which is how the staleness
test compares a fresh generation with what is committed. It needs grpcio-tools
(a dev dependency), so it lives outside the runtime package.
"""

from __future__ import annotations

import re
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
    written = sorted((out_root / "flmesh" / "v1").glob("*_pb2*.py*"))
    for path in written:
        if path.name.endswith("_pb2_grpc.py"):
            path.write_text(public_names_only(public_version_check(path.read_text(), path.name), path.name))
    return written


#: The version check protoc's gRPC plug-in writes: it imports grpc's private ``_utilities``,
#: which a grpcio release may move without notice.
PRIVATE_CHECK = """try:
    from grpc._utilities import first_version_is_lower
    _version_not_supported = first_version_is_lower(GRPC_VERSION, GRPC_GENERATED_VERSION)
except ImportError:
    _version_not_supported = True
"""
#: The same check on public names only (:func:`flmesh.v1.release_of`).
PUBLIC_CHECK = """from flmesh.v1 import release_of  # protos/generate.py: the check on public names only

_version_not_supported = release_of(GRPC_VERSION) < release_of(GRPC_GENERATED_VERSION)
"""


def public_version_check(text: str, name: str) -> str:
    """``text`` (a generated ``*_pb2_grpc.py``) with its version check on public names;
    RuntimeError when the check is not the one this replaces (a new grpcio-tools wrote
    another: look at it before committing)."""
    if PRIVATE_CHECK not in text:
        raise RuntimeError(f"{name}: the gRPC plug-in's version check changed; update PRIVATE_CHECK")
    return text.replace(PRIVATE_CHECK, PUBLIC_CHECK, 1)


#: Where the plug-in's static helper class starts, which calls ``grpc.experimental`` (no flmesh code
#: uses it): it runs to the end of the file.
EXPERIMENTAL_CLASS = "\n\n # This class is part of an EXPERIMENTAL API.\n"
#: The plug-in's private keyword on every client method (an optimisation, off by default).
REGISTERED = re.compile(r",\s*_registered_method=True\)")
#: The server half of that optimisation: the same handlers again as "registered" methods, through
#: a ``grpc.Server`` method of recent releases only; the generic handler the line before serves
#: every method on any grpcio.
REGISTERED_HANDLERS = re.compile(r"\n    server\.add_registered_method_handlers\([^)]*\)")


def public_names_only(text: str, name: str) -> str:
    """``text`` without grpc's private ``_registered_method`` keyword on the stub's methods, the
    server's registered handlers that go with it, and the static helper class on
    ``grpc.experimental``; RuntimeError when any is not where the plug-in writes it (a new
    grpcio-tools: look before committing). A file of no service has none."""
    at = text.find(EXPERIMENTAL_CLASS)
    found = [at >= 0, bool(REGISTERED.search(text)), bool(REGISTERED_HANDLERS.search(text))]
    if not any(found):
        return text
    if not all(found):
        raise RuntimeError(f"{name}: the gRPC plug-in's output changed; update public_names_only")
    return REGISTERED_HANDLERS.sub("", REGISTERED.sub(")", text[:at])).rstrip("\n") + "\n"


def main() -> int:
    written = generate(SRC_ROOT)
    for path in written:
        print(path.relative_to(SRC_ROOT.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
