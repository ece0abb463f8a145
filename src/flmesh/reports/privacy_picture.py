"""The privacy picture of a DP replay run: epsilon spent per round (matplotlib, files only).

``privacy.png``: each client's epsilon released so far (sequential composition: the sum of its
releases) over the rounds, and the most any one client has spent, as the console's ``eps``
column (:func:`~flmesh.cli.sim_console.max_spent`). Drawn from the rows'
``privacy_spent`` (:class:`flmesh.reports.results.RoundRow`); a run without DP releases gets none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PICTURE = "privacy.png"

#: Up to this many clients get a line each; more would be a blur (the max is always drawn).
MAX_CLIENT_LINES = 20


def privacy_pictures(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """Draw ``out_dir``/privacy.png when some row records a client's DP spending; its path
    (none otherwise: a run without ``[replay]``, or one that released nothing)."""
    if not any(r.get("privacy_spent") for r in rows):
        return []
    return [plot_privacy(rows, Path(out_dir) / PICTURE)]


def plot_privacy(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Epsilon spent so far per round: one line per client (up to :data:`MAX_CLIENT_LINES`)
    and the per client max. Rows without ``privacy_spent`` are skipped."""
    from flmesh.reports.pictures import heading, pyplot, run_title, save
    from flmesh.reports.results import max_spent

    plt = pyplot()
    spent = [(int(r["round"]), dict(r["privacy_spent"])) for r in rows if r.get("privacy_spent") is not None]
    clients = sorted({c for _, s in spent for c in s})
    rounds = [t for t, _ in spent]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    if len(clients) <= MAX_CLIENT_LINES:
        for client in clients:
            points = [(t, float(s[client])) for t, s in spent if client in s]
            ax.plot([p[0] for p in points], [p[1] for p in points], linewidth=1, alpha=0.6, label=client)
    ax.plot(rounds, [max_spent(s) for _, s in spent], color="black", linewidth=2,
            marker="o" if len(rounds) < 40 else None, label="max over clients")
    ax.set_xlabel("round")
    ax.set_ylabel("epsilon spent so far")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize="small", ncol=2)
    title = run_title(path.parent, rows)
    heading(fig, ax, title, fixed=False)
    fig.tight_layout()
    save(fig, path, title)
    plt.close(fig)
    return path
