"""What ``fl-sim`` prints on the terminal: the run's title, a line per round, the final table.

Pure formatting of a federation, its round rows and its summary; the CLI
(:mod:`~flmesh.cli.fl_sim`) decides when and where to print. Imported
once the flags are read (it loads rich), so ``fl-sim --help`` stays quick.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from flmesh.config import Federation
from flmesh.reports.record import data_text
from flmesh.reports.results import RoundRow, Summary, max_spent


def pct(x: float | None) -> str:
    """A fraction as a percentage 6 characters wide; ``-`` when there is none."""
    return f"{'-':>6}" if x is None else f"{100 * x:6.2f}"


def title(fed: Federation, out_dir: Path | str, model: str | None = None) -> str:
    """The run's first line (rich markup): the federation and where its results go; ``model``:
    what builds the model (default: the file's ``[model]``)."""
    agg = fed.aggregator
    how = (f"aggregator {agg.strategy} (C={agg.fraction:g}), objective {fed.training.objective}"
           if agg is not None else f"schedule {fed.topology.schedule}, graph {fed.topology.graph}")
    return (f"[bold]{fed.name}[/]: {len(fed.nodes)} nodes, {how}, {escape(data_text(fed))}, "
            f"model {escape(model or fed.model.label)}, "
            f"{fed.rounds} rounds x {fed.training.epochs:g} epochs  ->  {out_dir}")


def key(fed: Federation) -> str:
    """One line that says what the columns of :func:`header` mean and which way is better."""
    if fed.aggregator is not None:
        return ("acc: the global model's accuracy on the nodes' test splits (higher is better); "
                "F_t: its mean per-class drop since the previous round; F_k: the mean drop on the "
                "other participants' splits caused by each one's local training (both lower is better)")
    return peer_key(fed.metric) + (PRIVACY_KEY if privacy_column(fed) else "")


def peer_key(metric: str) -> str:
    """The key of a peer run's FA, FF and PFA columns over ``metric``."""
    return (f"FA: mean {metric} of every model on every node's test split (higher is better); "
            f"FF: their standard deviation, how unevenly the models serve the nodes (lower is "
            f"better); PFA: mean {metric} of each model on its own node's split (higher is better)")


#: The key of the privacy column (:func:`privacy_column`), appended to the run's key line.
PRIVACY_KEY = ("; eps: the most DP epsilon any one client has released so far (per client max; "
               "a client's spend is the sum of its releases; lower is more private)")


def privacy_column(fed: Federation) -> bool:
    """Whether the run's lines get the privacy column: a federation with a DP replay buffer
    (``[replay]``; between peers not in mode "local", which releases nothing)."""
    replay = fed.replay
    return replay is not None and (fed.aggregator is not None or replay.mode != "local")


def header(fed: Federation) -> str:
    """The key (:func:`key`, dimmed markup) over the column names of :func:`round_line`."""
    return f"[not bold dim]{escape(key(fed))}[/]\n" + columns(fed)


def columns(fed: Federation) -> str:
    """The column names of :func:`round_line`."""
    return column_names(fed.aggregator is not None, privacy_column(fed), fed.tasks is not None)


def column_names(star: bool, privacy: bool = False, tasks: bool = False) -> str:
    """The column names of :func:`round_line` for a star or a peer run, with the privacy
    column (``eps``) and the task columns or without."""
    if star:
        line = f"{'round':>5}  {'acc %':>6}  {'F_t %':>6}  {'F_k %':>6}  {'updates':>7}  {'s':>6}"
    else:
        line = f"{'round':>5}  {'FA %':>6}  {'FF %':>6}  {'PFA %':>6}  {'missing':>7}  {'s':>6}"
    return line + (f"  {'eps':>6}" if privacy else "") + ("  task  per-task acc %" if tasks else "")


def round_line(row: RoundRow) -> str:
    """One round's line under :func:`header`: a star row's accuracy, forgetting and updates, or
    a peer row's FA, FF, PFA and missing models; then the most epsilon a client has spent
    (:func:`max_spent`) when the row records DP spending, and the task's accuracies, if any.
    A DP federation's rows always record it (:func:`privacy_column` says which do)."""
    spent = max_spent(row.privacy_spent)
    eps = "" if spent is None else f"  {spent:6.2f}"
    tasks = ""
    if row.task is not None:
        tasks = f"  {row.task:>4}  " + " ".join(pct(a).strip() for a in row.task_accuracy or [])
    if row.kind == "star":
        updates = f"{len(row.received or [])}/{len(row.selected or [])}"
        return (f"{row.round:>5}  {pct(row.accuracy)}  {pct(row.global_forgetting)}  "
                f"{pct(row.client_forgetting)}  {updates:>7}  {row.wall_s:6.2f}{eps}{tasks}")
    missing = len(row.missing)  # the peers whose models went missing this round
    return (f"{row.round:>5}  {pct(row.fa)}  {pct(row.ff)}  {pct(row.pfa)}  {missing:>7}  "
            f"{row.wall_s:6.2f}{eps}{tasks}")


def final_table(fed: Federation, summary: Summary) -> Table | None:
    """The table after the last round (its columns are the summary's kind's); None when no
    round finished."""
    final = summary.final
    if final is None:
        return None
    table = Table(title=f"{fed.name}: after round {summary.rounds}")
    if summary.kind == "star":
        names = ["accuracy %", "FA %", "FF %", "PFA %", "mean F_t %", "wall s"]
        values = [pct(final.accuracy), pct(final.fa), pct(final.ff), pct(final.pfa),
                  pct(summary.mean_global_forgetting), f"{summary.wall_s:.1f}"]
    else:
        best = summary.best_fa or {}
        names = ["FA %", "FF %", "PFA %", "best FA %", "wall s"]
        values = [pct(final.fa), pct(final.ff), pct(final.pfa),
                  f"{pct(best.get('fa'))} (r{int(best.get('round', 0))})", f"{summary.wall_s:.1f}"]
    spent = max_spent(summary.privacy_spent)
    if spent is not None:  # a DP replay run: the most any client released (the key's eps)
        names.insert(-1, "max eps")
        values.insert(-1, f"{spent:.2f}")
    if summary.sim_time_s is not None:  # a device model: simulated seconds beside the wall's
        names.insert(-1, "simulated s")
        values.insert(-1, f"{summary.sim_time_s:.1f}")
    if summary.target_accuracy is not None:
        names.insert(-1, f"to {pct(summary.target_accuracy).strip()} %")
        reached = "" if summary.rounds_to_target is None else f" (r{summary.rounds_to_target})"
        values.insert(-1, "not reached" if summary.time_to_target_s is None else
                      f"{summary.time_to_target_s:.1f} s{reached}")
    for col in names:
        table.add_column(col, justify="right")
    table.add_row(*values)
    return table


def final_line(summary: Summary, metric: str = "accuracy") -> str:
    """The run's final metrics on one line (``fl-sim --quiet``), with where its results are;
    ``metric``: what FA, FF and PFA are over (``[federation] metric``, named when not accuracy)."""
    final = summary.final
    done = f"{summary.federation}: round {summary.rounds}/{summary.rounds_planned}"
    if final is None:
        return f"{done}: no round finished; results in {summary.out_dir}"
    values = [("accuracy", final.accuracy)] if summary.kind == "star" else []
    over = "" if metric == "accuracy" else f" {metric}"
    values += [(f"FA{over}", final.fa), (f"FF{over}", final.ff), (f"PFA{over}", final.pfa)]
    metrics = ", ".join(f"{name} {pct(value).strip()} %" for name, value in values if value is not None)
    timed = ""
    if summary.sim_time_s is not None:
        timed = f"; {summary.sim_time_s:.1f} simulated s"
        if summary.target_accuracy is not None:
            target = pct(summary.target_accuracy).strip()
            round_ = "" if summary.rounds_to_target is None else f" (round {summary.rounds_to_target})"
            timed += (f", {target} % not reached" if summary.time_to_target_s is None else
                      f", {target} % at {summary.time_to_target_s:.1f} s{round_}")
    return f"{done}: {metrics or 'not evaluated'}{timed}; results in {summary.out_dir}"
