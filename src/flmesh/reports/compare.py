"""Several runs' curves side by side: what ``fl-sim compare`` draws (:mod:`flmesh.cli.compare`).

Each metric the runs hold gets its own panel: FA, FF and PFA (peer runs), the global model's
accuracy (star runs), a node's own accuracy (fl-node runs), the accuracy on each task
(continual runs; peer and star apart), the nodes' mean training loss, and the privacy spent
(DP replay runs: the largest epsilon over the clients). A peer metric and a star one never
share an axis. A curve is labelled by the
settings that differ between the curves, as fl-sim recorded them in each run folder
(federation.toml with ``--set`` applied, run.json's transport), e.g. ``seed=2,
rewind.lambda=0.2``; a run without that record (fl-node, the aggregator) by its folder's name.

A sweep folder (``fl-sim --seeds/--sweep``: sweep.json and a folder per run) is taken whole:
its interrupted runs are left out (a line says how many), its finished runs of the same
settings but different seeds make one curve, their mean per round (over the rounds every one
of them has), with a band: ± the sample standard deviation, or min-max with ``--band minmax``;
``--band none`` draws every run its own curve. Runs named one by one are drawn one curve each.

With ``--x time`` the horizontal axis is simulated seconds instead of rounds (runs of a
federation file with a device model, :mod:`flmesh.timing`).

The output folder (default ``runs/compare-<hash of the runs' paths>``; an ``--out`` ending in
``.png`` is refused) gets ``compare.png`` and ``compare.json``: the panels with their curves,
and per run its label, its differing settings and its final values. A folder that is neither
a run nor a sweep, or a file that cannot be read, is one line and exit 2.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flmesh.reports.compare_runs import SEED, Run, differing, labels, points
from flmesh.reports.run_tools import RunError

#: What each --band draws around the mean, as the legend says it.
BANDS = {"std": "mean ± std", "minmax": "mean, min-max band", "none": "every run its own curve"}
#: Panel id -> (title, unit, table column); ``task_K_accuracy`` and ``global_task_K_accuracy``
#: are made per task, ``fa[METRIC]`` and the like per ``[federation] metric``.
PANELS = {"fa": ("FA: federation accuracy (peer runs)", "%", "FA %"),
          "ff": ("FF: federation fairness (peer runs; lower is fairer)", "%", "FF %"),
          "pfa": ("PFA: personalized federation accuracy (peer runs)", "%", "PFA %"),
          "global_accuracy": ("global model accuracy (star runs)", "%", "accuracy %"),
          "node_accuracy": ("the node's model on its own test split (fl-node runs)", "%", "own accuracy %"),
          "train_loss": ("training loss (mean over the nodes that trained)", "loss", "train loss"),
          "epsilon": ("privacy spent (largest epsilon over the clients)", "epsilon", "epsilon")}


@dataclass
class Curve:
    """A line of the picture: one run, or a sweep's runs that differ only in their seed."""

    runs: list[Run]
    settings: dict[str, str]
    label: str = ""
    points: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # panel -> round -> values
    times: dict[int, list[float]] = field(default_factory=dict)  # round -> its runs' simulated seconds


def panel_heading(panel: str) -> tuple[str, str, str]:
    """(title, unit, table column) of a panel id."""
    if panel in PANELS:
        return PANELS[panel]
    if panel.endswith("_accuracy") and "task_" in panel:
        task = panel.removesuffix("_accuracy").rpartition("_")[2]
        star = panel.startswith("global_")
        whose = "star runs: the global model" if star else "peer runs: the nodes' mean"
        return f"accuracy on task {task} ({whose})", "%", f"{'global ' if star else ''}task {task} %"
    key, _, metric = panel.partition("[")
    short = PANELS[key][2].removesuffix(" %")
    return f"{short} over {metric.rstrip(']')} (peer runs)", "%", f"{short} {metric.rstrip(']')} %"


def _order(panel: str) -> tuple[int, str]:
    ranks = ["fa", "ff", "pfa", "global_accuracy", "node_accuracy", "task_", "global_task_", "train_loss",
             "epsilon"]
    return next((i for i, p in enumerate(ranks) if panel.startswith(p)), len(ranks)), panel


def curves(runs: Sequence[Run], band: str = "std") -> list[Curve]:
    """The curves of ``runs``, labelled: one per run named on its own; one per sweep and set of
    settings (the seed aside) for the runs that came from a sweep folder, unless ``band`` is
    "none" (every run its own curve, its seed in its label)."""
    out: list[Curve] = []
    grouped: dict[tuple[Path, str], Curve] = {}
    for run in runs:
        if run.sweep is None or not run.settings or band == "none":
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
            for row in run.rows:
                if row.get("sim_time_s") is not None:
                    curve.times.setdefault(int(row["round"]), []).append(float(row["sim_time_s"]))
    return out


def _line(curve: Curve, panel: str, band: str, x: str = "round") -> dict[str, Any]:
    """One curve of a panel: its rounds and values (a band's: the mean over the runs that have
    the panel, at the rounds each of them has, with ``low`` and ``high``); with ``x`` "time",
    ``rounds`` holds the runs' mean simulated seconds at those rounds instead."""
    having = max(len(v) for v in curve.points[panel].values())
    rounds = sorted(at for at, v in curve.points[panel].items() if len(v) == having)
    if x == "time":  # the rounds every run of the curve has a simulated time for
        rounds = [at for at in rounds if len(curve.times.get(at, [])) == len(curve.runs)]
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
    if x == "time":
        line["round_numbers"], line["rounds"] = rounds, [round(statistics.fmean(curve.times[at]), 6)
                                                         for at in rounds]
    return line


#: What ``fl-sim compare --x`` puts on the horizontal axis -> its label.
X_AXES = {"round": "round", "time": "simulated time (s)"}


def build(runs: Sequence[Run], band: str = "std", x: str = "round") -> dict[str, Any]:
    """compare.json's content for ``runs``: title, panels (each with its curves) and runs (each
    with its label, differing settings and final values: the last round's, per panel). ``x``:
    "round", or "time" (every run's simulated seconds: runs of a federation file with a device
    model; a band's curve at its runs' mean time per round). Raises RunError (one line) for a
    run without simulated time on a time axis."""
    if x == "time":
        for run in runs:
            if not any(r.get("sim_time_s") is not None for r in run.rows):
                raise RunError(f"{run.folder}: no simulated time in its rows (its federation file has no "
                               "[devices] or [network]); compare it by round, without --x time")
    drawn = curves(runs, band)
    ids = sorted({p for c in drawn for p in c.points}, key=_order)
    if not ids:
        raise RunError(f"{runs[0].folder}: nothing to draw (no run has a round with a metric)"
                       if len(runs) == 1 else "nothing to draw: none of the runs has a round with a metric")
    panels = [{"id": p, "title": panel_heading(p)[0], "unit": panel_heading(p)[1],
               "curves": [_line(c, p, band, x) for c in drawn if p in c.points]} for p in ids]
    run_labels = labels([(r.settings, r.folder) for r in runs])
    differ = differing([r.settings for r in runs])
    names = list(dict.fromkeys(str(r.summary.get("federation") or r.folder.name) for r in runs))
    title = (f"{' vs '.join(names)} — {len(runs)} runs"
             + (f", {len(drawn)} curve{'' if len(drawn) == 1 else 's'}" if len(drawn) != len(runs) else "")
             + (f"; differing: {', '.join(k.removeprefix('federation.') for k in differ)}" if differ else ""))
    return {"title": title, "band": BANDS[band], "x": X_AXES[x], "panels": panels,
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
    from flmesh.reports.pictures import plot_panels

    picture, index = folder / f"{stem}.png", folder / f"{stem}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        plot_panels(content["panels"], picture, content["title"], x_label=content.get("x", "round"))
        index.write_text(json.dumps({**content, "picture": picture.name}, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise RunError(f"--out {folder}: cannot write it: {exc.strerror or exc}") from None
    return picture, index


def default_folder(folders: Sequence[Path], root: Path = Path("runs")) -> Path:
    """``runs/compare-<hash>``: one folder per list of runs (the same list again: the same folder)."""
    digest = hashlib.sha256("\n".join(str(f.resolve()) for f in folders).encode("utf-8")).hexdigest()
    return root / f"compare-{digest[:10]}"


def table(content: Mapping[str, Any]) -> str:
    """:func:`build`'s runs as plain-text lines: label, rounds, final value per panel, folder;
    no cell is cut, however long."""
    ids = [p["id"] for p in content["panels"]]
    units = {p["id"]: p["unit"] for p in content["panels"]}

    def number(panel: str, value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}" if units[panel] == "%" else f"{value:.3f}"

    head = ["run", "rounds", *(panel_heading(i)[2] for i in ids), "folder"]
    body = [[r["label"], str(r["rounds"]), *(number(i, r["final"].get(i)) for i in ids), r["folder"]]
            for r in content["runs"]]
    widths = [max(len(row[k]) for row in [head, *body]) for k in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if k in (0, len(head) - 1) else c.rjust(w)
                               for k, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in [head, *body])
