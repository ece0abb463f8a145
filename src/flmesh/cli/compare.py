"""``fl-sim compare RUN_DIR... [--out DIR] [--band std|minmax|none] [--x round|time]``: several
runs' curves side by side, by round or by simulated time (:mod:`flmesh.reports.compare` draws them)."""

from __future__ import annotations

import sys
from pathlib import Path

from flmesh.cli.common import OneLineParser
from flmesh.reports.compare import BANDS, X_AXES, build, default_folder, table, write
from flmesh.reports.compare_runs import collect
from flmesh.reports.run_tools import RunError


def main(argv: list[str]) -> int:
    """``argv`` after ``fl-sim compare``; the exit code (2: bad input, one line on stderr)."""
    p = OneLineParser(prog="fl-sim compare", description="Draw several runs' metrics side by side, one "
                      "panel per metric, and write their final values.")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR",
                   help="run folders, or sweep folders (fl-sim --seeds/--sweep)")
    p.add_argument("--out", type=Path, metavar="DIR", help="folder for compare.png and compare.json "
                   "(default runs/compare-<hash of the runs' paths>)")
    p.add_argument("--band", choices=sorted(BANDS),
                   help="a sweep's seeds: around their mean, std (± the sample standard deviation, the "
                        "default) or minmax; or none, every run its own curve (the default for one sweep "
                        "folder alone, whose bands.png already shows the means)")
    p.add_argument("--x", choices=sorted(X_AXES), default="round",
                   help="the horizontal axis: rounds (the default), or simulated seconds (runs of a "
                        "federation file with [devices] or [network])")
    args = p.parse_args(argv)
    if args.out is not None and args.out.suffix.lower() == ".png":
        print(f"fl-sim compare: error: --out {args.out}: a folder (it gets compare.png and "
              f"compare.json), not a picture's name; try --out {args.out.with_suffix('')}",
              file=sys.stderr)
        return 2
    skipped: list[str] = []
    try:
        runs = collect(args.runs, skipped)
        lone_sweep = len(args.runs) == 1 and (args.runs[0] / "sweep.json").is_file()
        content = build(runs, args.band or ("none" if lone_sweep else "std"), args.x)
        picture, index = write(content, args.out if args.out is not None else default_folder(args.runs))
    except RunError as exc:
        print(f"fl-sim compare: error: {exc}", file=sys.stderr)
        return 2
    for line in skipped:
        print(line)
    print(content["title"])
    print(table(content))
    print(f"compare: wrote {picture}, {index}")
    return 0



__all__ = ["main"]
