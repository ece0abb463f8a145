"""``fl-sim compare RUN_DIR... [--out DIR] [--band std|minmax]``: several runs' curves, side by side.

Each metric the runs hold gets its own panel: FA, FF and PFA (peer runs), the global model's
accuracy (star runs), the accuracy on each task (continual runs; peer and star apart), the
nodes' mean training loss, and the privacy spent (DP replay runs: the largest epsilon over
the clients). A peer metric and a star one never share an axis. A curve is labelled by the
settings that differ between the curves, as fl-sim recorded them in each run folder
(federation.toml with ``--set`` applied, run.json's transport), e.g. ``seed=2,
rewind.lambda=0.2``; a run without that record (fl-node, the aggregator) by its folder's name.

A sweep folder (``fl-sim --seeds/--sweep``: sweep.json and a folder per run) is taken whole:
its finished runs of the same settings but different seeds make one curve, their mean per
round (over the rounds every one of them has), with a band: ± the sample standard deviation,
or min-max with ``--band minmax``. Runs named one by one are drawn one curve each.

The output folder (default ``runs/compare-<hash of the runs' paths>``) gets ``compare.png``
and ``compare.json``: the panels with their curves, and per run its label, its differing
settings and its final values. A folder that is neither a run nor a sweep, or a file that
cannot be read, is one line and exit 2.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flmesh.coordinator.run_tools import RunError, load_run, print_table
from flmesh.node.cli_common import OneLineParser

SEED = "federation.seed"
#: What each --band draws around the mean, as the legend says it.
BANDS = {"std": "mean ± std", "minmax": "mean, min-max band"}
#: Panel id -> (title, unit); ``task_K_accuracy`` and ``global_task_K_accuracy`` are made per task.
PANELS = {"fa": ("FA: federation accuracy (peer runs)", "%"),
          "ff": ("FF: federation fairness (peer runs; lower is fairer)", "%"),
          "pfa": ("PFA: personalized federation accuracy (peer runs)", "%"),
          "global_accuracy": ("global model accuracy (star runs)", "%"),
          "train_loss": ("training loss (mean over the nodes that trained)", "loss"),
          "epsilon": ("privacy spent (largest epsilon over the clients)", "epsilon")}


@dataclass
class Run:
    """A run folder: its rows and summary, its recorded settings (``section.key`` -> value as
    TOML writes it; empty without federation.toml) and the sweep folder it came from."""

    folder: Path
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    settings: dict[str, str]
    sweep: Path | None = None


@dataclass
class Curve:
    """A line of the picture: one run, or a sweep's runs that differ only in their seed."""

    runs: list[Run]
    settings: dict[str, str]
    label: str = ""
    points: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # panel -> round -> values


def collect(folders: Sequence[Path]) -> list[Run]:
    """The runs in ``folders``: each a run folder, or a sweep folder's finished runs. Raises
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
    some (``seed=2, rewind.lambda=0.2``: ``federation.`` left out), else the folder's name; the
    folder's name (or path) is added where two labels would be the same."""
    differ = differing([s for s, _ in items])
    out = [", ".join(f"{k.removeprefix('federation.')}={s[k]}" for k in differ if k in s) or folder.name
           for s, folder in items]
    for i, (label, (_, folder)) in enumerate(zip(list(out), items, strict=True)):
        if out.count(label) > 1:
            out[i] = folder.name if label == folder.name else f"{label} ({folder.name})"
    return [str(folder) if out.count(label) > 1 else label
            for label, (_, folder) in zip(out, items, strict=True)]


def differing(recorded: Sequence[Mapping[str, str]]) -> list[str]:
    """The keys whose values are not all the same in the settings that are not empty (a key
    some lack differs), in the order they first come."""
    known = [s for s in recorded if s]
    return [k for k in dict.fromkeys(k for s in known for k in s) if len({s.get(k) for s in known}) > 1]


def points(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """Panel id -> round -> value of one run's rows (accuracies in percent)."""
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
        nodes = (row.get("nodes") or {}).values()
        losses = [n["train_loss"] for n in nodes if n.get("train_loss") is not None]
        if losses:
            out.setdefault("train_loss", {})[at] = statistics.fmean(losses)
        spent = [v for v in (row.get("privacy_spent") or {}).values() if v is not None]
        if spent:
            out.setdefault("epsilon", {})[at] = max(spent)
    return out


def panel_heading(panel: str) -> tuple[str, str]:
    """(title, unit) of a panel id."""
    if panel in PANELS:
        return PANELS[panel]
    if panel.endswith("_accuracy") and "task_" in panel:
        task = panel.removesuffix("_accuracy").rpartition("_")[2]
        whose = "star runs: the global model" if panel.startswith("global_") else "peer runs: the nodes' mean"
        return f"accuracy on task {task} ({whose})", "%"
    key, _, metric = panel.partition("[")
    title, unit = PANELS[key]
    return f"{title.split(':')[0]} over {metric.rstrip(']')} (peer runs)", unit


def _order(panel: str) -> tuple[int, str]:
    ranks = ["fa", "ff", "pfa", "global_accuracy", "task_", "global_task_", "train_loss", "epsilon"]
    return next((i for i, p in enumerate(ranks) if panel.startswith(p)), len(ranks)), panel


def curves(runs: Sequence[Run], band: str = "std") -> list[Curve]:
    """The curves of ``runs``, labelled: one per run named on its own; one per sweep and set of
    settings (the seed aside) for the runs that came from a sweep folder."""
    out: list[Curve] = []
    grouped: dict[tuple[Path, str], Curve] = {}
    for run in runs:
        if run.sweep is None or not run.settings:
            out.append(Curve([run], dict(run.settings)))
            continue
        common = {k: v for k, v in run.settings.items() if k != SEED}
        key = (run.sweep, json.dumps(common, sort_keys=True))
        if key not in grouped:
            grouped[key] = Curve([], common)
            out.append(grouped[key])
        grouped[key].runs.append(run)
    # a band is named after its sweep folder when no setting tells it apart
    named = labels([(c.settings, c.runs[0].sweep or c.runs[0].folder if len(c.runs) > 1 else c.runs[0].folder)
                    for c in out])
    for curve, label in zip(out, named, strict=True):
        seeds = ", ".join(r.settings.get(SEED, "?") for r in curve.runs)
        curve.label = label if len(curve.runs) == 1 else f"{label} ({BANDS[band]} over seeds {seeds})"
        for run in curve.runs:
            for panel, values in points(run.rows).items():
                for at, value in values.items():
                    curve.points.setdefault(panel, {}).setdefault(at, []).append(value)
    return out


def _line(curve: Curve, panel: str, band: str) -> dict[str, Any]:
    """One curve of a panel: its rounds and values (a band's: the mean over the runs that have
    the panel, at the rounds each of them has, with ``low`` and ``high``)."""
    having = max(len(v) for v in curve.points[panel].values())
    rounds = sorted(at for at, v in curve.points[panel].items() if len(v) == having)
    values = [curve.points[panel][at] for at in rounds]
    means = [statistics.fmean(v) for v in values]
    line: dict[str, Any] = {"label": curve.label, "runs": [str(r.folder) for r in curve.runs],
                            "rounds": rounds, "values": [round(m, 6) for m in means], "band": None}
    if len(curve.runs) > 1:
        if band == "minmax":
            low, high = [min(v) for v in values], [max(v) for v in values]
        else:
            spread = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            low = [m - s for m, s in zip(means, spread, strict=True)]
            high = [m + s for m, s in zip(means, spread, strict=True)]
        line.update(band=BANDS[band], low=[round(x, 6) for x in low], high=[round(x, 6) for x in high])
    line["final"] = line["values"][-1] if rounds else None
    return line


def build(runs: Sequence[Run], band: str = "std") -> dict[str, Any]:
    """compare.json's content for ``runs``: title, panels (each with its curves) and runs (each
    with its label, differing settings and final values: the last round's, per panel)."""
    drawn = curves(runs, band)
    ids = sorted({p for c in drawn for p in c.points}, key=_order)
    panels = [{"id": p, "title": panel_heading(p)[0], "unit": panel_heading(p)[1],
               "curves": [_line(c, p, band) for c in drawn if p in c.points]} for p in ids]
    run_labels = labels([(r.settings, r.folder) for r in runs])
    differ = differing([r.settings for r in runs])
    names = list(dict.fromkeys(str(r.summary.get("federation") or r.folder.name) for r in runs))
    title = (f"{' vs '.join(names)} — {len(runs)} runs"
             + (f", {len(drawn)} curves" if len(drawn) != len(runs) else "")
             + (f"; differing: {', '.join(k.removeprefix('federation.') for k in differ)}" if differ else ""))
    return {"title": title, "band": BANDS[band], "panels": panels,
            "runs": [{"folder": str(r.folder), "label": label,
                      "kind": r.rows[0].get("kind") if r.rows else None,
                      "settings": {k: r.settings[k] for k in differ if k in r.settings},
                      "rounds": r.summary.get("rounds"),
                      "final": {p: round(v[max(v)], 6) for p, v in sorted(points(r.rows).items(),
                                                                           key=lambda i: _order(i[0]))}}
                     for r, label in zip(runs, run_labels, strict=True)]}


def write(content: Mapping[str, Any], folder: Path, stem: str = "compare") -> tuple[Path, Path]:
    """Draw ``content`` (:func:`build`'s) as ``folder``/STEM.png and write it as STEM.json; both
    paths. Raises RunError when the folder cannot be made or written. Blocks."""
    from flmesh.coordinator.pictures import plot_panels

    picture, index = folder / f"{stem}.png", folder / f"{stem}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        plot_panels(content["panels"], picture, content["title"])
        index.write_text(json.dumps({**content, "picture": picture.name}, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise RunError(f"--out {folder}: cannot write it: {exc.strerror or exc}") from None
    return picture, index


def default_folder(folders: Sequence[Path], root: Path = Path("runs")) -> Path:
    """``runs/compare-<hash>``: one folder per list of runs (the same list again: the same folder)."""
    digest = hashlib.sha256("\n".join(str(f.resolve()) for f in folders).encode("utf-8")).hexdigest()
    return root / f"compare-{digest[:10]}"


def main(argv: list[str]) -> int:
    """``argv`` after ``fl-sim compare``; the exit code (2: bad input, one line on stderr)."""
    p = OneLineParser(prog="fl-sim compare", description="Draw several runs' metrics side by side, one "
                      "panel per metric, and write their final values.")
    p.add_argument("runs", type=Path, nargs="+",
                   help="run folders, or sweep folders (fl-sim --seeds/--sweep)")
    p.add_argument("--out", type=Path, help="folder for compare.png and compare.json "
                   "(default runs/compare-<hash of the runs' paths>)")
    p.add_argument("--band", choices=sorted(BANDS), default="std",
                   help="a sweep's seeds around their mean: std (± the sample standard deviation, the "
                        "default) or minmax")
    args = p.parse_args(argv)
    try:
        runs = collect(args.runs)
        content = build(runs, args.band)
        picture, index = write(content, args.out if args.out is not None else default_folder(args.runs))
    except RunError as exc:
        print(f"fl-sim compare: error: {exc}", file=sys.stderr)
        return 2
    print_table([(r["label"], run.summary) for r, run in zip(content["runs"], runs, strict=True)],
                content["title"])
    print(f"compare: wrote {picture}, {index}")
    return 0
