"""Update compression: bytes per round and accuracy for each [wire] setting, same federation.

    python benchmarks/compression.py [FILE ...]   # default: the quick start and examples/fedavg.toml

Runs ``fl-sim FILE`` once per setting (``--set wire.dtype=... --set
wire.compression=...``): native floats, float16, bfloat16, zstd (lossless), and
float16 + zstd. Prints, per file and setting, the mean bytes per round on the
wire (``summary.json`` ``bytes_per_round``: every model stream, headers
included), the ratio to native, and the final FA (the nodes' trained models on
their own test splits; star runs report it too) with its change from native. The seed is the
same for every row, so native and zstd (lossless) must give the same accuracy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SETTINGS = {
    "native": ("native", "none"),
    "float16": ("float16", "none"),
    "bfloat16": ("bfloat16", "none"),
    "zstd": ("native", "zstd"),
    "float16 + zstd": ("float16", "zstd"),
}


def run(file: Path, dtype: str, compression: str, out: Path) -> tuple[float, float]:
    """(bytes per round, final accuracy) of one fl-sim run."""
    argv = [str(BIN / "fl-sim"), str(file), "--quiet", "--out", str(out),
            "--set", f'wire.dtype="{dtype}"', "--set", f'wire.compression="{compression}"']
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    final = summary["final"]
    accuracy = final["fa"] if final.get("fa") is not None else final["accuracy"]
    return float(summary["bytes_per_round"]), float(accuracy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("files", type=Path, nargs="*",
                   default=[REPO / "examples/quickstart.toml", REPO / "examples/fedavg.toml"])
    args = p.parse_args(argv)
    print("| federation | wire | bytes per round | vs native | final accuracy (%) | change (points) |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for f, file in enumerate(args.files):
            base: tuple[float, float] | None = None
            for s, (name, (dtype, compression)) in enumerate(SETTINGS.items()):
                moved, accuracy = run(file, dtype, compression, Path(tmp) / f"{f}-{s}")
                base = base or (moved, accuracy)
                print(f"| {file.name} | {name} | {moved:,.0f} | {moved / base[0]:.2f}x | "
                      f"{100 * accuracy:.2f} | {100 * (accuracy - base[1]):+.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
