"""``fl-sim report DIR... [--out DIR]``: a run's pictures and summary, or one federation merged.

One run folder (of ``fl-sim``, the aggregator or one ``fl-node``) gets its pictures redrawn
into it (with the privacy picture of a DP replay run,
:mod:`~flmesh.reports.privacy_picture`) and its summary table printed. The results
folders of one federation's ``fl-node`` processes (several, or one with ``--out``) are
merged into the federation's rounds (:mod:`~flmesh.reports.merge`): a line per
round under fl-sim's key and columns (FA, FF, PFA; ``eps`` with DP replay), a line for each
folder that lacks rounds, each node's accuracy, the summary table; ``--out DIR`` writes the
merged run as a run folder that ``fl-sim report`` and ``fl-sim compare`` read. Exit codes:
0 done, 1 the pictures could not be drawn, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flmesh.cli.common import OneLineParser

PROG = "fl-sim report"


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=(
        "Redraw a finished run's pictures and print its summary table; or merge the results "
        "folders of one federation's fl-node processes into its rounds (FA/FF/PFA per round when "
        "the nodes ran with --cross-eval)."))
    p.add_argument("runs", type=Path, nargs="+", metavar="DIR",
                   help="a run folder (rounds.jsonl and summary.json), or the fl-node folders of one "
                        "federation (merged: two or more, or one with --out)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="fl-node folders: write the merged run here (rounds.jsonl, summary.json, "
                        "pictures), a run folder fl-sim report and fl-sim compare read")
    return p


def main(argv: list[str]) -> int:
    """``argv`` from ``report`` on; the exit code."""
    from flmesh.reports.run_tools import RunError, load_run

    args = build_parser().parse_args(argv[1:])
    try:
        loaded = [(folder, *load_run(folder)) for folder in args.runs]
        if len(loaded) == 1 and args.out is None:
            return report_run(*loaded[0])
        if len(loaded) == 1 and loaded[0][2].get("writer") != "fl-node":
            raise RunError(f"--out: {args.runs[0]} is a run folder already; --out is for merging "
                           "fl-node folders")
        return report_federation(loaded, args.out)
    except RunError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def cannot_draw(folder: Path, exc: Exception) -> int:
    """Say on stderr, in one line, that the pictures in ``folder`` could not be drawn; exit 1."""
    print(f"{PROG}: error: cannot draw the pictures in {folder}: {type(exc).__name__}: {exc}",
          file=sys.stderr)
    return 1


def report_run(folder: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> int:
    """One run folder: redraw its pictures into it, print its summary table; the exit code."""
    from flmesh.reports.pictures import draw
    from flmesh.reports.privacy_picture import privacy_pictures
    from flmesh.reports.run_tools import print_table

    try:
        pictures = draw(rows, folder) + privacy_pictures(rows, folder)
    except Exception as exc:  # a full disk, a folder in a picture's place, no matplotlib
        return cannot_draw(folder, exc)
    status = "interrupted" if summary.get("interrupted") else "finished"
    print_table([(folder.name, summary)], f"{summary.get('federation', folder.name)} ({status})")
    print("pictures: " + (", ".join(str(p) for p in pictures) if pictures else "none (no rounds)"))
    return 0


def report_federation(loaded: list[tuple[Path, list[dict[str, Any]], dict[str, Any]]],
                      out: Path | None) -> int:
    """fl-node folders of one federation: print the merged rounds; with ``out``, write them."""
    from rich.console import Console
    from rich.markup import escape

    from flmesh.cli.sim_console import PRIVACY_KEY, column_names, pct, peer_key, round_line
    from flmesh.reports.merge import check_out, merge, node_folders, read_ledger, write_merged
    from flmesh.reports.run_files import to_json
    from flmesh.reports.run_tools import RunError, print_table

    folders = node_folders(loaded)
    ledger = None
    if out is not None:  # before anything is printed
        check_out(out)
        ledger = read_ledger(folders)
    merged = merge(folders, out)
    console = Console(highlight=False)

    def say(text: str) -> None:
        console.print(text, markup=False, soft_wrap=True, highlight=False)

    rows, summary = merged.rows, merged.summary
    privacy = any(r.privacy_spent is not None for r in rows)
    metric = rows[0].metric if rows else "accuracy"
    say(f"{summary.federation}: {len(merged.folders)} fl-node folders merged (nodes "
        f"{', '.join(f.node for f in merged.folders)}), {len(rows)} rounds, seed {summary.seed}")
    console.print(f"[not bold dim]{escape(peer_key(metric) + (PRIVACY_KEY if privacy else ''))}[/]",
                  soft_wrap=True)
    console.print(column_names(False, privacy), style="bold", markup=False)
    for row in rows:
        say(round_line(row))
    for gap in merged.gaps:
        say(f"missing: {gap}")
    if not merged.cross_eval:
        rounds = "every round has" if len(merged.pfa_only) == len(rows) else (
            ("rounds " if len(merged.pfa_only) > 1 else "round ") + ", ".join(map(str, merged.pfa_only))
            + (" have" if len(merged.pfa_only) > 1 else " has"))
        say(f"cross-evaluation was off for {', '.join(merged.not_cross)} (fl-node without --cross-eval): "
            f"FA and FF need every model on the other nodes' test splits, so {rounds} only PFA, the "
            f"mean {metric} of each node's model on its own split")
    if merged.unmatched:
        say(f"no folder for {', '.join(merged.unmatched)}, whose test splits the nodes evaluated on: "
            "FA, FF and PFA cover the given nodes only")
    for f in merged.folders:
        last = f.rows[max(f.rows)]["nodes"].get(f.node, {}) if f.rows else {}
        eps = last.get("privacy_spent")
        say(f"{f.node}: {len(f.rows)} round{'' if len(f.rows) == 1 else 's'}, accuracy "
            f"{pct(last.get('accuracy')).strip()} % after its last"
            + (f", eps {eps:.2f}" if eps is not None else "") + f"  ({f.folder})")
    status = "interrupted" if summary.interrupted else "finished"
    print_table([(out.name if out is not None else "merged", to_json(summary))],
                f"{summary.federation} ({status}, merged)")
    if out is None:
        return 0
    try:
        pictures = write_merged(merged, out, ledger)
    except RunError:
        raise
    except Exception as exc:  # the pictures (rows and summary are written): a full disk, no matplotlib
        return cannot_draw(out, exc)
    say(f"merged run: {out}/summary.json, rounds.jsonl, " + ", ".join(p.name for p in pictures))
    return 0
