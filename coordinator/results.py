"""Machine-readable results and pictures of a run.

``rounds.jsonl`` gets one JSON object per round as soon as the round ends
(flushed, so a crashed or interrupted run keeps what it did); ``summary.json``
is written at the end; ``accuracy.png`` and ``per_class.png`` are drawn from
the rounds. Not thread-safe: one writer per run, used from one thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class RunWriter:
    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rounds_path = self.out_dir / "rounds.jsonl"
        self.summary_path = self.out_dir / "summary.json"
        self._rounds = self.rounds_path.open("w", encoding="utf-8")
        self.rows: list[dict[str, Any]] = []

    def write_round(self, row: Mapping[str, Any]) -> None:
        self.rows.append(dict(row))
        self._rounds.write(json.dumps(row, sort_keys=False) + "\n")
        self._rounds.flush()

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Write summary.json atomically (temp file, then rename)."""
        tmp = self.summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.summary_path)

    def close(self) -> None:
        if not self._rounds.closed:
            self._rounds.close()

    def draw(self) -> list[Path]:
        """Draw the pictures from the rounds written so far; returns their paths."""
        if not self.rows:
            return []
        pictures = [plot_accuracy(self.rows, self.out_dir / "accuracy.png"),
                    plot_per_class(self.rows, self.out_dir / "per_class.png")]
        if "global_forgetting" in self.rows[0]:  # a star (aggregator) run
            pictures.append(plot_local_forgetting(self.rows, self.out_dir / "local_forgetting.png"))
        return pictures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """FA and PFA over rounds (percent), with FA ± FF shaded."""
    plt = _pyplot()
    rounds = [r["round"] for r in rows]
    fa = [100 * r["fa"] for r in rows]
    ff = [100 * r["ff"] for r in rows]
    pfa = [100 * r["pfa"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.plot(rounds, fa, marker="o", label="FA (federation accuracy)")
    ax.fill_between(rounds, [a - s for a, s in zip(fa, ff, strict=True)],
                    [a + s for a, s in zip(fa, ff, strict=True)], alpha=0.2, label="FA ± FF")
    if "accuracy" in rows[0]:
        ax.plot(rounds, [100 * r["accuracy"] for r in rows], marker="^", label="global model accuracy")
    else:
        ax.plot(rounds, pfa, marker="s", label="PFA (personalized)")
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_per_class(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Heat map of the federation's per-class accuracy (class x round), in percent."""
    plt = _pyplot()
    import numpy as np

    matrix = np.array([[np.nan if v is None else v for v in r["per_class_accuracy"]] for r in rows],
                      dtype=float).T * 100
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    image = ax.imshow(matrix, aspect="auto", origin="lower", vmin=0, vmax=100, cmap="viridis",
                      extent=(rows[0]["round"] - 0.5, rows[-1]["round"] + 0.5, -0.5,
                              matrix.shape[0] - 0.5))
    ax.set_xlabel("round")
    ax.set_ylabel("class")
    fig.colorbar(image, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_local_forgetting(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Heat map of each node's local forgetting F_k,t (percent; blank when not sampled),
    as in the WSM thesis Fig. 2.2 and Flashback's per-client view."""
    plt = _pyplot()
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
    if len(nodes) <= 20:
        ax.set_yticks(range(len(nodes)), nodes)
    fig.colorbar(image, ax=ax, label="local forgetting F_k,t (%)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
