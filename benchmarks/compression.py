"""Update compression: bytes per round and accuracy for each [wire] setting, same federation.

    python benchmarks/compression.py [FILE ...]   # default: the quick start and examples/fedavg.toml
    python benchmarks/compression.py --quick      # the quick start only, 2 rounds

Runs ``fl-sim FILE`` once per setting (``--set wire.dtype=... --set
wire.compression=...``): native floats (the control row), float16, bfloat16, zstd
(lossless), and float16 + zstd. Prints, per file and setting, the mean bytes per round on
the wire (``summary.json`` ``bytes_per_round``: every model stream, headers included), the
ratio to native, and the final FA (the nodes' trained models on every test split; star
runs report it too) with its change from native. The seed is the same for every row, so native and zstd
(lossless) must give the same accuracy.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from _common import BIN, REPO, add_json_flag, measure, write_json

SETTINGS = {
    "native": ("native", "none"),
    "float16": ("float16", "none"),
    "bfloat16": ("bfloat16", "none"),
    "zstd": ("native", "zstd"),
    "float16 + zstd": ("float16", "zstd"),
}


def run(file: Path, dtype: str, compression: str, out: Path, rounds: int | None) -> tuple[float, float]:
    """(bytes per round, final accuracy) of one fl-sim run."""
    argv = [str(BIN / "fl-sim"), str(file), "--quiet", "--no-pictures", "--out", str(out),
            "--set", f'wire.dtype="{dtype}"', "--set", f'wire.compression="{compression}"']
    measure(argv + (["--rounds", str(rounds)] if rounds else []))
    summary = json.loads((out / "summary.json").read_text())
    final = summary["final"]
    accuracy = final["fa"] if final.get("fa") is not None else final["accuracy"]
    return float(summary["bytes_per_round"]), float(accuracy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("files", type=Path, nargs="*", help="federation files (default: the quick start and "
                   "examples/fedavg.toml; --quick: the quick start)")
    p.add_argument("--quick", action="store_true", help="the quick start only, 2 rounds")
    p.add_argument("--rounds", type=int, help="override each file's rounds (--quick: 2)")
    add_json_flag(p, "compression")
    args = p.parse_args(argv)
    files = args.files or [REPO / "examples/quickstart.toml"]
    if not args.files and not args.quick:
        files.append(REPO / "examples/fedavg.toml")
    rounds = args.rounds or (2 if args.quick else None)
    rows = []
    print("| federation | wire | bytes per round | vs native | final FA (%) | change (points) |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for f, file in enumerate(files):
            base: tuple[float, float] | None = None
            for s, (name, (dtype, compression)) in enumerate(SETTINGS.items()):
                moved, accuracy = run(file, dtype, compression, Path(tmp) / f"{f}-{s}", rounds)
                base = base or (moved, accuracy)
                if not base[0]:
                    raise SystemExit(f"{file}: the native run moved no model bytes; give it more rounds")
                rows.append({"file": file.name, "wire": name, "bytes_per_round": moved,
                             "vs_native": moved / base[0], "final_fa": accuracy,
                             "change_points": 100 * (accuracy - base[1])})
                print(f"| {file.name} | {name} | {moved:,.0f} | {moved / base[0]:.2f}x | "
                      f"{100 * accuracy:.2f} | {100 * (accuracy - base[1]):+.2f} |", flush=True)
    seeds = sorted({int(m) for f in files for m in re.findall(r"(?m)^seed = (\d+)", f.read_text())})
    write_json(args.json, "compression", {"rounds": rounds, "rows": rows}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
