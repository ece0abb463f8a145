"""One federation's rounds from the results folders of its separate ``fl-node`` processes.

Each ``fl-node`` writes only its own view (:mod:`flmesh.reports.results`): per round, its node's
entry, with ``cross_accuracy`` (its model on the other nodes' test splits) under
``--cross-eval``. :func:`merge` puts the folders of one peer federation side by side and
builds the rows ``fl-sim`` would have written: FA, FF and PFA per round (FedRewind Eq. 5-7,
:mod:`flmesh.learning.metrics`) over the matrix the nodes' cross-evaluations form, or,
when cross-evaluation was off, only PFA (each model on its own split) and every node's
accuracy. The result is an ``fl-sim`` run folder (:func:`write_merged`) that
``fl-sim report`` and ``fl-sim compare`` read. Folders of different federations, of a star
federation (its aggregator's folder already holds the federation's rows) or two of one node
raise :class:`~flmesh.reports.run_tools.RunError` (one line).

Pure data and files; not thread-safe (one caller).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flmesh.learning.metrics import personalized_federation_accuracy, sampled_federation_metrics
from flmesh.replay.ledger import LEDGER_FILE, PrivacyLedger
from flmesh.reports.results import Final, Matrix, NodeRound, RoundRow, SparseMatrix, Summary
from flmesh.reports.run_files import RunWriter, mean_bytes, to_json
from flmesh.reports.run_tools import RunError

_SAME = ("federation", "seed", "kind", "rounds_planned")  # what the folders of one federation share


@dataclass
class NodeFolder:
    """One fl-node's results folder: its node, its rows by round and its summary."""

    folder: Path
    node: str
    rows: dict[int, dict[str, Any]]
    summary: dict[str, Any]


@dataclass
class Merged:
    """The federation's rows and summary, and what the folders left out."""

    rows: list[RoundRow]
    summary: Summary
    folders: list[NodeFolder]
    gaps: list[str] = field(default_factory=list)  # one line per folder with rounds missing
    cross_eval: bool = True  # every round had every model on the other nodes' splits
    not_cross: list[str] = field(default_factory=list)  # nodes whose rows lack cross-evaluation
    pfa_only: list[int] = field(default_factory=list)  # rounds without FA and FF for want of it
    unmatched: list[str] = field(default_factory=list)  # cross-evaluated nodes without a folder


def node_folders(loaded: Sequence[tuple[Path, list[dict[str, Any]], dict[str, Any]]]) -> list[NodeFolder]:
    """``(folder, rows, summary)`` of fl-node runs as :class:`NodeFolder`; RunError (one line)
    when one was not written by fl-node, belongs to a star federation, repeats a node, or the
    folders are not of one federation (name, seed, kind or planned rounds differ)."""
    out: list[NodeFolder] = []
    for folder, rows, summary in loaded:
        writer = summary.get("writer")
        if writer != "fl-node":
            raise RunError(f"{folder}: written by {writer or 'an unknown writer'}, not fl-node: "
                           "fl-sim report merges only fl-node folders; report this folder on its own")
        if summary.get("kind") == "star":
            raise RunError(f"{folder}: a node of a star federation: its aggregator's results folder "
                           "holds the federation's rounds (fl-sim report AGGREGATOR_DIR)")
        node = str(summary.get("node"))
        twin = next((f for f in out if f.node == node), None)
        if twin is not None:
            raise RunError(f"{twin.folder} and {folder}: both hold node {node}'s results; pass one")
        first = out[0] if out else None
        if first is not None and (differ := _differences(first.summary, summary)):
            raise RunError(f"{first.folder} and {folder}: not one federation ({differ})")
        out.append(NodeFolder(folder, node, {int(r["round"]): r for r in rows}, summary))
    return out


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in _SAME if a.get(k) != b.get(k))


def merge(folders: Sequence[NodeFolder], out_dir: Path | None = None) -> Merged:
    """The federation's rows (one per round any folder has) and its summary, as fl-sim writes
    them (``writer`` "fl-sim"; ``config`` names the folders merged). A round a folder lacks is
    formed from the nodes that have it and named in :attr:`Merged.gaps`. O(rounds x nodes^2)."""
    ids = [f.node for f in folders]
    rounds = sorted({t for f in folders for t in f.rows})
    merged = Merged([], _summary(folders, out_dir), list(folders))
    for f in folders:
        if lost := [t for t in rounds if t not in f.rows]:
            merged.gaps.append(f"{f.folder} (node {f.node}): no row for round{'s' if len(lost) > 1 else ''} "
                               + ", ".join(map(str, lost)))
    unmatched: set[str] = set()
    not_cross: set[str] = set()
    for t in rounds:
        have = [f for f in folders if t in f.rows]
        entries = {f.node: _entry(f, t) for f in have}
        row, cross = _row(t, str(have[0].rows[t].get("metric", "accuracy")), entries)
        row.notes = [f"no row from node {n}" for n in ids if n not in entries]
        # each node's own row names the peers whose models it really missed (its report's `failed`)
        row.missing = sorted({p for f in have for p in f.rows[t].get("missing") or () if isinstance(p, str)})
        merged.cross_eval &= cross
        if not cross:
            merged.pfa_only.append(t)
            not_cross |= {n for n, e in entries.items() if not e.cross_accuracy}
        unmatched |= {c for e in entries.values() for c in e.cross_accuracy or {} if c not in ids}
        merged.rows.append(row)
    merged.unmatched = sorted(unmatched)
    merged.not_cross = [n for n in ids if n in not_cross]
    _finish(merged.summary, [to_json(r) for r in merged.rows], merged.cross_eval)
    return merged


def _entry(folder: NodeFolder, t: int) -> NodeRound:
    """The node's entry of round ``t`` (its fields checked by run_tools.load_run); a field that
    is null takes NodeRound's default."""
    found = (folder.rows[t].get("nodes") or {}).get(folder.node)
    where = f"{folder.folder / 'rounds.jsonl'}: round {t}"
    if not isinstance(found, dict):
        raise RunError(f"{where} has no entry for node {folder.node}")
    if lacks := [k for k in ("node", "round") if found.get(k) is None]:
        raise RunError(f"{where}: node {folder.node}'s entry has no {' and no '.join(lacks)}")
    known = {f.name for f in dataclasses.fields(NodeRound)}
    return NodeRound(**{k: v for k, v in found.items() if k in known and v is not None})


def _own(entry: NodeRound, metric: str) -> float | None:
    """The node's model on its own split, in ``metric``."""
    if entry.cross_accuracy and entry.node in entry.cross_accuracy:
        return entry.cross_accuracy[entry.node]
    return entry.accuracy if metric == "accuracy" else (entry.metrics or {}).get(metric)


def _row(t: int, metric: str, entries: dict[str, NodeRound]) -> tuple[RoundRow, bool]:
    """Round ``t``'s row from the nodes' entries, and whether every model was cross-evaluated."""
    ids = list(entries)
    cross = all(e.cross_accuracy for e in entries.values())
    acc = np.full((len(ids), len(ids)), math.nan)
    for i, node in enumerate(ids):
        entry = entries[node]
        scores = dict(entry.cross_accuracy or {}) if cross else {}
        own = _own(entry, metric)
        scores[node] = math.nan if own is None else own
        for j, other in enumerate(ids):
            acc[i, j] = scores.get(other, math.nan)
    fa = ff = pfa = None
    matrix: Matrix | SparseMatrix | None = None
    sampled = bool(np.isnan(acc).any())
    if not np.isnan(np.diag(acc)).any():
        if cross:
            metrics = sampled_federation_metrics(acc)
            fa, ff, pfa = metrics.fa, metrics.ff, metrics.pfa
        else:
            pfa = personalized_federation_accuracy(acc)
    if cross:
        rounded = acc.round(6)
        matrix = (SparseMatrix(ids, ids, {r: {c: float(rounded[i, j]) for j, c in enumerate(ids)
                                              if not np.isnan(rounded[i, j])} for i, r in enumerate(ids)})
                  if sampled else Matrix(ids, ids, rounded.tolist()))
    correct = np.sum([e.per_class_correct for e in entries.values() if e.per_class_correct], axis=0)
    total = np.sum([e.per_class_total for e in entries.values() if e.per_class_total], axis=0)
    per_class = (np.divide(correct, total, out=np.zeros(len(total)), where=total > 0).round(6).tolist()
                 if np.ndim(total) == 1 else None)
    spent = {n: e.privacy_spent for n, e in entries.items() if e.privacy_spent is not None}
    common = _common_accuracy(ids, acc, entries) if cross and metric == "accuracy" else []
    row = RoundRow(t, "peer", "fl-sim", metric=metric, fa=fa, ff=ff, pfa=pfa, accuracy_matrix=matrix,
                   mean_accuracy=round(float(np.mean(common)), 6) if common else None,
                   min_accuracy=round(min(common), 6) if common else None,
                   max_accuracy=round(max(common), 6) if common else None,
                   eval_sample=max(len(e.cross_accuracy or {}) for e in entries.values()) if cross and sampled
                   else None, per_class_accuracy=per_class,
                   bytes_by_kind={"sent": sum(e.bytes_sent for e in entries.values())},
                   privacy_spent=spent or None, nodes=dict(entries),
                   wall_s=max(e.wall_s for e in entries.values()))
    return row, cross


def _common_accuracy(ids: list[str], acc: np.ndarray, entries: dict[str, NodeRound]) -> list[float]:
    """Each model's accuracy on the common test split: its accuracy on every split it was
    evaluated on, weighted by that split's size (its node's own ``per_class_total``), as fl-sim
    pools the evaluated pairs."""
    sizes = [sum(entries[o].per_class_total or []) for o in ids]
    out = []
    for i in range(len(ids)):
        pairs = [(acc[i, j], sizes[j]) for j in range(len(ids)) if not math.isnan(acc[i, j]) and sizes[j]]
        if pairs:
            out.append(sum(a * n for a, n in pairs) / sum(n for _, n in pairs))
    return out


def _summary(folders: Sequence[NodeFolder], out_dir: Path | None) -> Summary:
    first = folders[0].summary
    return Summary(
        kind="peer", writer="fl-sim", federation=str(first.get("federation")), file=str(first.get("file")),
        seed=int(first.get("seed") or 0), rounds=0, rounds_planned=int(first.get("rounds_planned") or 0),
        interrupted=any(bool(f.summary.get("interrupted")) for f in folders),
        config={"nodes": [f.node for f in folders], "merged_from": [str(f.folder) for f in folders]},
        error="; ".join(f"{f.node}: {f.summary['error']}" for f in folders if f.summary.get("error")) or None,
        missing_peers=sorted({p for f in folders for p in f.summary.get("missing_peers", [])}),
        wall_s=max(float(f.summary.get("wall_s") or 0.0) for f in folders),
        out_dir=str(out_dir) if out_dir is not None else "")


def _finish(summary: Summary, rows: list[dict[str, Any]], cross_eval: bool) -> None:
    """Fill in what the rows say: rounds, final numbers, best FA, privacy, bytes."""
    complete = [r for r in rows if not r["notes"]]  # every node's row is in
    summary.rounds = len(complete)
    summary.interrupted |= summary.rounds < summary.rounds_planned or summary.error is not None
    summary.config["cross_eval"] = cross_eval
    last = rows[-1] if rows else None
    if last is not None:
        nodes = last["nodes"].items()
        summary.final = Final(
            last["round"], last.get("fa"), last.get("ff"), last.get("pfa"),
            node_accuracy={n: e["accuracy"] for n, e in nodes if e.get("accuracy") is not None},
            node_metrics={n: e["metrics"] for n, e in nodes if e.get("metrics")})
        summary.privacy_spent = last.get("privacy_spent")
    with_fa = [r for r in rows if r.get("fa") is not None]
    if with_fa:
        best = max(with_fa, key=lambda r: r["fa"])
        summary.best_fa = {"round": best["round"], "fa": best["fa"]}
    summary.bytes_per_round = mean_bytes(rows)


def check_out(out: Path) -> None:
    """RunError (one line) when ``out`` is a file or already holds a run."""
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out}: is a file, expected a folder (existing or to create)")
    if (out / "rounds.jsonl").exists() or (out / "summary.json").exists():
        raise RunError(f"--out {out}: already holds a run; choose a new folder")


def read_ledger(folders: Sequence[NodeFolder]) -> PrivacyLedger | None:
    """The privacy ledger the replay buffer's host wrote into its folder (None: no folder holds
    one). RunError (one line) when it is damaged, or when several folders hold one (only the
    host's should). Blocks on the disk."""
    from flmesh.format.state_file import StateFileError

    found = [f.folder / LEDGER_FILE for f in folders if (f.folder / LEDGER_FILE).is_file()]
    if len(found) > 1:
        raise RunError(f"{', '.join(map(str, found))}: {len(found)} privacy ledgers, expected the "
                       "replay buffer host's only; merge without --out, or remove the stray one")
    try:
        return PrivacyLedger(found[0]) if found else None
    except StateFileError as exc:
        raise RunError(str(exc)) from None


def write_merged(merged: Merged, out: Path, ledger: PrivacyLedger | None = None) -> list[Path]:
    """Write ``out``/rounds.jsonl and summary.json (a run folder fl-sim reads), the pictures,
    and ``ledger`` (:func:`read_ledger`) as fl-sim writes a run's
    (:func:`~flmesh.reports.run_files.write_ledger`); the pictures' paths. Raises RunError
    (one line) when ``out`` holds a run already or cannot be written; what drawing raises
    otherwise (the rows, the summary and the ledger are written by then). Blocks."""
    from flmesh.reports.pictures import draw
    from flmesh.reports.privacy_picture import privacy_pictures
    from flmesh.reports.run_files import write_ledger

    check_out(out)
    merged.summary.out_dir = str(out)
    try:
        writer = RunWriter(out)
        for row in merged.rows:
            writer.write_round(row)
        writer.write_summary(merged.summary)
        if ledger is not None:
            write_ledger(out, ledger)
    except OSError as exc:
        raise RunError(f"--out {out}: cannot write results there: {exc.strerror or exc}") from None
    rows = writer.rows
    pictures = draw(rows, out) + privacy_pictures(rows, out)
    merged.summary.pictures = [str(p) for p in pictures]
    writer.write_summary(merged.summary)
    return pictures
