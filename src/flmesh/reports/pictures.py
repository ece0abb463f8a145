"""Pictures of a run, drawn from its rounds.jsonl rows (matplotlib, files only).

``accuracy.png`` (FA with FA ± FF, and PFA or the global model's accuracy),
``per_class.png`` (per-class accuracy over rounds), for star runs
``local_forgetting.png`` (each node's F_k,t), with a device model ``time.png`` (accuracy
against simulated seconds) and, for fl-sim's peer runs, ``exchange.png``
(the nodes' accuracy beside their consensus distance and the bytes they sent). Rows are the JSON objects of
:class:`flmesh.reports.results.RoundRow`. Every picture is titled with the run's name and main
settings (:func:`run_title`), on the image and in the PNG's ``Title`` text field; ``fl-sim
compare`` draws its panels with :func:`plot_panels`.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Fixed margins for the pictures whose labels are fixed (axis titles, tick labels of at most
#: three digits): what ``tight_layout`` computes for them, without its extra drawing pass, which
#: is a large share of the drawing time. The
#: node-forgetting and task pictures, whose labels are node names or vary, keep tight_layout.
FIXED_MARGINS = {"left": 0.11, "right": 0.977, "bottom": 0.146, "top": 0.89}


#: PNG at zlib level 1 instead of Pillow's 6: the pictures are somewhat larger (still tens of KB)
#: and written sooner, which a run waits for at its end (matplotlib passes these to Pillow).
PNG = {"pil_kwargs": {"compress_level": 1}}


class PicturesError(Exception):
    """The pictures of a run could not be drawn (its rows and summary are written)."""


#: Draws one picture of the rows to the path, under the title, and returns the path.
Plot = Callable[[Sequence[Mapping[str, Any]], Path, str], Path]


def draw(rows: Sequence[Mapping[str, Any]], out_dir: Path, title: str | None = None) -> list[Path]:
    """Draw the pictures of ``rows`` into ``out_dir``; their paths (none without rows). ``title``:
    the pictures' title (default :func:`run_title` of the folder). Blocks on the disk."""
    if not rows:
        return []
    named = run_title(Path(out_dir), rows) if title is None else title
    return [plot(rows, path, named) for plot, path in plans(rows, out_dir)]


def run_title(folder: Path, rows: Sequence[Mapping[str, Any]]) -> str:
    """The title of a run's pictures: its federation's name, then its algorithm (schedule or
    strategy, and rewind), nodes, planned rounds and seed, e.g. ``quickstart — CWT + rewind,
    10 nodes, 40 rounds, seed 1``. Read from the folder's summary.json (fl-sim writes it before
    drawing); what it lacks comes from the rows, and the name from the folder's."""
    summary = _summary(folder / "summary.json")
    config: dict[str, Any] = summary["config"] if isinstance(summary.get("config"), dict) else {}
    last = rows[-1] if rows else {}
    star = last.get("kind") == "star"
    if config.get("baseline") not in (None, "none"):
        algorithm = f"{config['baseline']} baseline"
    elif config.get("schedule") or config.get("strategy"):
        algorithm = str(config["schedule"]).upper() if config.get("schedule") else str(config["strategy"])
    else:
        algorithm = "star" if star else "peer"
    rewind: dict[str, Any] = config["rewind"] if isinstance(config.get("rewind"), dict) else {}
    if rewind.get("mode") not in (None, "off"):
        algorithm += " + rewind" if rewind["mode"] == "previous" else f" + {rewind['mode']} rewind"
    nodes = config.get("nodes") if isinstance(config.get("nodes"), list) else list(last.get("nodes") or {})
    rounds = summary.get("rounds_planned") or last.get("round")
    parts = [algorithm, f"{len(nodes)} nodes" if nodes else "", f"{rounds} rounds" if rounds else "",
             f"seed {summary['seed']}" if isinstance(summary.get("seed"), int) else ""]
    name = summary.get("federation") or folder.name
    return f"{name} — " + ", ".join(p for p in parts if p)


def _summary(path: Path) -> dict[str, Any]:
    """A summary.json's object; {} when there is none or it cannot be read (the title is all it
    is read for)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def heading(fig: Any, ax: Any, title: str, fixed: bool = True, bottom: float | None = None) -> None:
    """Put ``title`` above ``ax``, wrapped at 80 characters (never cut); with ``fixed``, set the
    fixed margins, the top one lowered for each line past the first (``bottom``: room below the
    axis, for a legend there)."""
    text = textwrap.fill(title, 80)
    ax.set_title(text, fontsize=10)
    if fixed:
        fig.subplots_adjust(**{**FIXED_MARGINS, "top": FIXED_MARGINS["top"] - 0.045 * text.count("\n"),
                               "bottom": bottom if bottom is not None else FIXED_MARGINS["bottom"]})


def whole_rounds(ax: Any) -> None:
    """Ticks on whole rounds only (a short run would otherwise get 1.25, 1.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def legend_below(ax: Any, columns: int = 2) -> None:
    """The legend under the axis, where it covers no curve."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=columns, fontsize="small",
              frameon=False)


def save(fig: Any, path: Path, title: str, **options: Any) -> None:
    """Save ``fig`` as a PNG whose ``Title`` text field is ``title``."""
    fig.savefig(path, metadata={"Title": title}, **PNG, **options)


def plans(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[tuple[Plot, Path]]:
    """The pictures ``rows`` get, in order: how each is drawn and where to."""
    if not rows:
        return []
    out_dir = Path(out_dir)
    pictures: list[tuple[Plot, Path]] = [(plot_accuracy, out_dir / "accuracy.png"),
                                         (plot_per_class, out_dir / "per_class.png")]
    if rows[0].get("kind") == "star":
        pictures.append((plot_local_forgetting, out_dir / "local_forgetting.png"))
    if any(r.get("task_accuracy") for r in rows):
        pictures.append((plot_tasks, out_dir / "tasks.png"))
    if any(r.get("consensus_distance") is not None for r in rows):
        pictures.append((plot_exchange, out_dir / "exchange.png"))
    if any(r.get("sim_time_s") is not None for r in rows):
        pictures.append((plot_time, out_dir / "time.png"))
    return pictures


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def metric_of(rows: Sequence[Mapping[str, Any]]) -> str:
    """What the rows' FA, FF and PFA are over (``[federation] metric``)."""
    return str(rows[0].get("metric") or "accuracy") if rows else "accuracy"


def accuracy_labels(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The legend of each of :func:`accuracy_curves`' curves (``"fa"``, ``"band"``: FA ± FF,
    ``"pfa"``, ``"accuracy"``), and ``"y"``, the axis label: named after ``[federation]
    metric``, which FA, FF and PFA are over."""
    metric = metric_of(rows)
    over = "" if metric == "accuracy" else f" over {metric}"
    star = bool(rows) and rows[0].get("kind") == "star"
    return {"fa": f"FA (federation {metric})", "band": "FA ± FF", "pfa": f"PFA (personalized{over})",
            "accuracy": "global model accuracy",
            "y": f"{metric}; accuracy (%)" if star and metric != "accuracy" else f"{metric} (%)"}


def accuracy_curves(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """What :func:`plot_accuracy` draws, in percent: ``"fa"`` and ``"ff"`` at the rounds with
    FA, ``"pfa"`` at those with PFA (a merged run without cross-evaluation has PFA only) and,
    for star runs, ``"accuracy"`` (the global model) at every round: name -> (rounds, values)."""
    def curve(key: str, having: str) -> tuple[list[int], list[float]]:
        kept = [r for r in rows if r.get(having) is not None]
        return [r["round"] for r in kept], [100 * (r.get(key) or 0.0) for r in kept]

    out = {"fa": curve("fa", "fa"), "ff": curve("ff", "fa"), "pfa": curve("pfa", "pfa")}
    if rows and rows[0].get("kind") == "star":
        out["accuracy"] = curve("accuracy", "round")
    return out


def plot_accuracy(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """FA and PFA over rounds (percent), with FA ± FF shaded; star runs add the global model
    (:func:`accuracy_curves`)."""
    plt = pyplot()
    curves = accuracy_curves(rows)
    rounds, fa = curves["fa"]
    ff = curves["ff"][1]
    labels = accuracy_labels(rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=100)
    if rounds:  # a merged fl-node run without cross-evaluation has PFA only
        ax.plot(rounds, fa, marker="o", label=labels["fa"])
        ax.fill_between(rounds, [a - s for a, s in zip(fa, ff, strict=True)],
                        [a + s for a, s in zip(fa, ff, strict=True)], alpha=0.2, label=labels["band"])
    if curves["pfa"][0]:
        ax.plot(*curves["pfa"], marker="s", label=labels["pfa"])
    if "accuracy" in curves:
        ax.plot(*curves["accuracy"], marker="^", label=labels["accuracy"])
    ax.set_xlabel("round")
    ax.set_ylabel(labels["y"])
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    whole_rounds(ax)
    legend_below(ax)
    heading(fig, ax, title, bottom=0.27)
    save(fig, path, title)
    plt.close(fig)
    return path


def plot_per_class(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Heat map of the federation's per-class accuracy (class x round), in percent: a star
    run's global model, or in a peer run every evaluated model on every test split, pooled."""
    plt = pyplot()
    import numpy as np

    matrix = np.array([[np.nan if v is None else v for v in r.get("per_class_accuracy") or []] for r in rows],
                      dtype=float).T * 100
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    image = ax.imshow(matrix, aspect="auto", origin="lower", vmin=0, vmax=100, cmap="viridis",
                      extent=(rows[0]["round"] - 0.5, rows[-1]["round"] + 0.5, -0.5,
                              matrix.shape[0] - 0.5))
    ax.set_xlabel("round")
    ax.set_ylabel("class")
    classes = matrix.shape[0]
    if classes <= 20:
        ax.set_yticks(range(classes))
    whole_rounds(ax)
    whose = ("the global model's accuracy (%)" if rows[0].get("kind") == "star"
             else "accuracy of every model on every split (%)")
    fig.colorbar(image, ax=ax, label=whose)
    heading(fig, ax, title)
    save(fig, path, title)
    plt.close(fig)
    return path


def plot_local_forgetting(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Heat map of each node's local forgetting F_k,t (percent; blank when not sampled),
    as in the WSM thesis Fig. 2.2 and Flashback's per-client view."""
    plt = pyplot()
    import numpy as np

    nodes = list(rows[0]["nodes"])
    matrix = np.full((len(nodes), len(rows)), np.nan)
    for j, row in enumerate(rows):
        for i, node in enumerate(nodes):
            value = row["nodes"][node].get("local_forgetting")
            if value is not None:
                matrix[i, j] = 100 * value
    fig, ax = plt.subplots(figsize=(6.4, max(3.0, 0.18 * len(nodes) + 1.5)), dpi=100)
    image = ax.imshow(matrix, aspect="auto", origin="lower", cmap="magma_r", vmin=0,
                      extent=(rows[0]["round"] - 0.5, rows[-1]["round"] + 0.5, -0.5, len(nodes) - 0.5))
    ax.set_xlabel("round")
    ax.set_ylabel("node")
    whole_rounds(ax)
    if len(nodes) <= 20:
        ax.set_yticks(range(len(nodes)), nodes)
    fig.colorbar(image, ax=ax, label="local forgetting F_k,t (%)")
    heading(fig, ax, title, fixed=False)
    fig.tight_layout()
    save(fig, path, title)
    plt.close(fig)
    return path


def plot_exchange(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Peer runs, per evaluated round: the nodes' mean accuracy on the common test split (least
    to most shaded), the consensus distance of their models, and the model bytes a node sent
    in that round, on average (KiB)."""
    kept = [r for r in rows if r.get("mean_accuracy") is not None]
    rounds = [r["round"] for r in kept]
    nodes = max(1, len(kept[0].get("nodes") or {})) if kept else 1
    with_distance = [r for r in kept if r.get("consensus_distance") is not None]
    panels = [
        {"title": "node accuracy on the common test split", "unit": "accuracy (%)",
         "curves": [{"label": "mean node (shaded: least to most)", "rounds": rounds,
                     "values": [100 * r["mean_accuracy"] for r in kept],
                     "low": [100 * r["min_accuracy"] for r in kept],
                     "high": [100 * r["max_accuracy"] for r in kept]}]},
        {"title": "consensus distance of the node models", "unit": "L2 distance",
         "curves": [{"label": "consensus distance", "rounds": [r["round"] for r in with_distance],
                     "values": [r["consensus_distance"] for r in with_distance]}]},
        {"title": "model bytes a node sent in the round", "unit": "KiB",
         "curves": [{"label": "sent per node", "rounds": rounds,
                     "values": [sum((r.get("bytes_by_kind") or {}).values()) / 1024 / nodes for r in kept]}]},
    ]
    return plot_panels(panels, path, title)


def plot_time(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Runs with a device model: accuracy against simulated seconds (FA between peers, the global
    model's with an aggregator, as on accuracy.png), and the simulated seconds each round took."""
    plt = pyplot()
    kept = [r for r in rows if r.get("sim_time_s") is not None]
    labels = accuracy_labels(rows)
    star = bool(rows) and rows[0].get("kind") == "star"
    key = "accuracy" if star else "fa"
    scored = [r for r in kept if r.get(key) is not None]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 6.4), dpi=100)
    if star:
        top.plot([r["sim_time_s"] for r in scored], [100 * r[key] for r in scored], marker="o",
                 label=labels["accuracy"])
    else:  # each node at its own round: FA over every node's latest model at each moment
        from flmesh.reports.time_curve import fa_over_time

        curve = fa_over_time(kept)
        top.step([t for t, _ in curve], [100 * fa for _, fa in curve], where="post",
                 label=labels["fa"] + ", each node's latest model")
        top.plot([r["sim_time_s"] for r in scored], [100 * r[key] for r in scored], "o",
                 label="row FA, when its round's last node ended")
    top.set_xlabel("simulated time (s)")
    top.set_ylabel(labels["y"])
    top.set_ylim(0, 100)
    top.grid(alpha=0.3)
    top.legend(loc="lower right", fontsize="small")
    ends = [r["sim_time_s"] for r in kept]
    # a row every eval_every rounds: the seconds since the previous row, per round between them
    took = [(b - a) / max(1, r["round"] - p["round"])
            for p, r, a, b in zip([{"round": 0}, *kept], kept, [0.0, *ends], ends, strict=False)]
    bottom.plot([r["round"] for r in kept], took, marker="o", label="simulated seconds per round")
    bottom.set_xlabel("round")
    bottom.set_ylabel("simulated time per round (s)")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    whole_rounds(bottom)
    heading(fig, top, title, fixed=False)
    fig.tight_layout()
    save(fig, path, title)
    plt.close(fig)
    return path


def plot_tasks(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Accuracy on each task's test data over rounds (percent), with the task changes marked:
    forgetting shows as a task's line falling after the stream moved on."""
    plt = pyplot()
    tasks = max(len(r.get("task_accuracy") or []) for r in rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for k in range(tasks):
        points = [(r["round"], 100 * r["task_accuracy"][k]) for r in rows
                  if r.get("task_accuracy") and k < len(r["task_accuracy"])
                  and r["task_accuracy"][k] is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=f"task {k}")
    changes = [b["round"] for a, b in zip(rows, rows[1:], strict=False) if b.get("task") != a.get("task")]
    for x in changes:
        ax.axvline(x - 0.5, color="grey", alpha=0.3, linewidth=1)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy on the task (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    whole_rounds(ax)
    legend_below(ax, columns=min(tasks, 5))
    heading(fig, ax, title, fixed=False)
    fig.tight_layout()
    save(fig, path, title)
    plt.close(fig)
    return path


def plot_panels(panels: Sequence[Mapping[str, Any]], path: Path, title: str, x_label: str = "round") -> Path:
    """One axis per panel (``{"title", "unit", "curves": [{"label", "rounds", "values", "low",
    "high"}]}``, as in compare.json), up to three a row; a curve with ``low`` and ``high`` is
    drawn with that band shaded. A curve keeps its colour in every panel, and one legend below
    the panels names each curve once; the figure grows to hold every label whole. ``x_label``:
    what ``rounds`` hold ("round": whole ticks). Blocks."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    columns = 2 if len(panels) == 4 else min(3, max(1, len(panels)))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 3.4 * rows), dpi=100, squeeze=False)
    labels = list(dict.fromkeys(c["label"] for panel in panels for c in panel["curves"]))
    palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    colours = {label: palette(i % palette.N) for i, label in enumerate(labels)}
    handles: dict[str, Any] = {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        for c in panel["curves"]:
            colour = colours[c["label"]]
            (line,) = ax.plot(c["rounds"], c["values"], color=colour,
                              marker="." if len(c["rounds"]) < 40 else None)
            handles.setdefault(c["label"], line)
            if c.get("low") is not None and c.get("high") is not None:
                ax.fill_between(c["rounds"], c["low"], c["high"], color=colour, alpha=0.2, linewidth=0)
        ax.set_title(textwrap.fill(panel["title"], 50), fontsize=9)
        ax.set_xlabel(x_label)
        if x_label == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(panel["unit"])
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(textwrap.fill(title, 100), fontsize=11)
    fig.tight_layout()
    fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=1 if max(map(len, labels), default=0) > 40 else min(3, len(labels)), fontsize=9,
               frameon=False)
    save(fig, path, title, bbox_inches="tight")  # bbox "tight": the legend below is kept whole
    plt.close(fig)
    return path
