"""The runs ``fl-sim compare`` reads: run folders and sweep folders, their recorded settings,
the labels those settings give, and the values each run's rows hold per panel.

A run folder is what every writer leaves (rounds.jsonl, summary.json); fl-sim's also hold
federation.toml (the effective federation file) and run.json (how it ran:
:mod:`~flmesh.reports.record`), which give a run's settings. A sweep folder holds
sweep.json and a run folder per run (:mod:`~flmesh.sim.sweep`). Everything here
reads files and blocks; nothing keeps state.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flmesh.reports.run_tools import RunError, load_run

SEED = "federation.seed"


@dataclass
class Run:
    """A run folder: its rows and summary, its recorded settings (``section.key`` -> value as
    TOML writes it; empty without federation.toml) and the sweep folder it came from."""

    folder: Path
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    settings: dict[str, str]
    sweep: Path | None = None


def collect(folders: Sequence[Path], skipped: list[str] | None = None) -> list[Run]:
    """The runs in ``folders``: each a run folder, or a sweep folder's finished runs (with
    ``skipped``: a line is added to it per sweep whose interrupted runs were left out). Raises
    RunError (one line naming the folder or file)."""
    runs: list[Run] = []
    for folder in folders:
        if not folder.is_dir():
            raise RunError(f"{folder}: no such run folder")
        index = folder / "sweep.json"
        if (folder / "rounds.jsonl").exists() or not index.is_file():
            if not (folder / "rounds.jsonl").exists():
                raise RunError(f"{folder}: not a run folder (no rounds.jsonl) nor a sweep folder "
                               "(no sweep.json)")
            runs.append(_load(folder, None))
            continue
        entries = _json_file(index).get("runs")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise RunError(f"{index}: not a sweep index (no list of runs)")
        finished = [e["folder"] for e in entries
                    if not e.get("interrupted") and isinstance(e.get("folder"), str)]
        if not finished:
            raise RunError(f"{folder}: a sweep folder without a finished run")
        if skipped is not None and len(finished) < len(entries):
            left = len(entries) - len(finished)
            skipped.append(f"{folder}: {left} of its {len(entries)} runs skipped (interrupted)")
        runs.extend(_load(folder / name, folder) for name in finished)
    return runs


def _load(folder: Path, sweep: Path | None) -> Run:
    rows, summary = load_run(folder)
    return Run(folder, rows, summary, settings(folder), sweep)


def _json_file(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(found, dict):
        raise RunError(f"{path}: expected a JSON object")
    return found


def settings(folder: Path) -> dict[str, str]:
    """A run folder's recorded settings: federation.toml's keys flattened (``rewind.lambda``),
    and run.json's ``transport`` and ``tls``; {} when the folder has no federation.toml."""
    path = folder / "federation.toml"
    if not path.is_file():
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RunError(f"{path}: cannot read it: {exc}") from None
    flat: dict[str, str] = {}
    _flatten(raw, "", flat)
    if (folder / "run.json").is_file():
        record = _json_file(folder / "run.json")
        flat.update({k: _text(record[k]) for k in ("transport", "tls") if k in record})
    return flat


def _flatten(table: Mapping[str, Any], prefix: str, flat: dict[str, str]) -> None:
    for key, value in table.items():
        if isinstance(value, Mapping):
            _flatten(value, f"{prefix}{key}.", flat)
        else:
            flat[f"{prefix}{key}"] = _text(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def labels(items: Sequence[tuple[Mapping[str, str], Path]]) -> list[str]:
    """A label per (settings, folder): the settings that differ between the items that have
    some (``seed=2, rewind.lambda=0.2``: ``federation.`` left out; a key the run's file does not
    set is ``key=(default)``, or ``key=(none)`` when the file has no such section at all, e.g.
    a peer run's ``aggregator.strategy``), else the folder's name; the folder's name (or path)
    is added where two labels would be the same."""
    differ = differing([s for s, _ in items])
    out = [", ".join(f"{k.removeprefix('federation.')}={_setting(s, k)}" for k in differ)
           if s and differ else folder.name for s, folder in items]
    out = [label if out.count(label) == 1 or label == folder.name else f"{label} ({folder.name})"
           for label, (_, folder) in zip(out, items, strict=True)]
    return [str(folder) if out.count(label) > 1 else label
            for label, (_, folder) in zip(out, items, strict=True)]


def _setting(settings: Mapping[str, str], key: str) -> str:
    if key in settings:
        return settings[key]
    section, dot, _ = key.rpartition(".")
    return "(none)" if dot and not any(k.startswith(section + ".") for k in settings) else "(default)"


def differing(recorded: Sequence[Mapping[str, str]]) -> list[str]:
    """The keys whose values are not all the same in the settings that are not empty (a key
    some lack differs), in the order they first come."""
    known = [s for s in recorded if s]
    return [k for k in dict.fromkeys(k for s in known for k in s) if len({s.get(k) for s in known}) > 1]


def points(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """Panel id -> round -> value of one run's rows (accuracies in percent): rows as
    :func:`~flmesh.reports.run_tools.load_run` checks them."""
    from flmesh.reports.results import max_spent

    out: dict[str, dict[int, float]] = {}
    for row in rows:
        at, star = int(row["round"]), row.get("kind") == "star"
        metric = row.get("metric") or "accuracy"
        found: dict[str, Any] = {"global_accuracy": row.get("accuracy")} if star else {
            key if metric == "accuracy" else f"{key}[{metric}]": row.get(key) for key in ("fa", "ff", "pfa")}
        for k, value in enumerate(row.get("task_accuracy") or []):
            found[f"{'global_' if star else ''}task_{k}_accuracy"] = value
        for key, value in found.items():
            if value is not None:
                out.setdefault(key, {})[at] = 100 * float(value)
        nodes = list((row.get("nodes") or {}).values())
        own = [n["accuracy"] for n in nodes if n.get("accuracy") is not None]
        if row.get("writer") == "fl-node" and own:  # one node's view: its model on its own split
            out.setdefault("node_accuracy", {})[at] = 100 * statistics.fmean(own)
        losses = [n["train_loss"] for n in nodes if n.get("train_loss") is not None]
        if losses:
            out.setdefault("train_loss", {})[at] = statistics.fmean(losses)
        spent = max_spent(row.get("privacy_spent") or None)
        if spent is not None:
            out.setdefault("epsilon", {})[at] = spent
    return out
