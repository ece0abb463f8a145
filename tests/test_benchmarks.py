"""Every benchmark still runs, on a tiny setting, and prints the table shape docs/results.md quotes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def table(text: str, header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def titled(text: str, title: str) -> list[list[str]]:
    """The body rows of the table under the bold line that starts with ``title``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"**{title}"))
    return table("\n".join(lines[start + 2:]), "|")


@pytest.mark.slow
def test_dp_replay_prints_table_1(tmp_path):
    out = run("dp_replay.py", "--quick", "--tasks", "2", "--rounds-per-task", "1")
    rows = table(out, "| scenario | participation | epsilon |")
    assert len(rows) == 2 * 2 * 3 and all(len(r) == 7 for r in rows)
    assert {r[0] for r in rows} == {"Novel Inputs", "Novel Inputs & Targets"}
    assert [r[2] for r in rows[:3]] == ["1", "10", "100"]
    assert all(cell.count("±") == 1 for r in rows for cell in r[3:])
    per_task = table(out, "| scenario | participation | method |")
    assert len(per_task) == 2 * 4 * 3 and all(len(r) == 3 + 2 for r in per_task)


@pytest.mark.slow
def test_fedrewind_prints_tables_1_to_4_steps_and_the_alpha_sweep():
    out = run("fedrewind.py", "--quick", "--rounds", "2", "--epochs", "1", "2")  # both E: 2 rounds
    methods = ["Standalone", "Joint", "CWT", "CWT + Rewind", "CWT + RandRewind", "RWT", "RWT + Rewind",
               "RWT + RandRewind", "FedAvg (C = 1)", "FedAvg + Rewind (C = 1)",
               "FedAvg + Rewind, chain scope (C = 1)"]
    for title in ("Table 1", "Table 2", "Table 3", "Optimizer steps"):
        rows = titled(out, title)
        assert [r[0] for r in rows] == methods, title
        assert all(len(r) == 3 for r in rows)
    steps = {r[0]: r[1:] for r in titled(out, "Optimizer steps")}
    # every federated row trains the same steps per node per round; Joint holds all the data
    assert len({tuple(cells) for name, cells in steps.items() if name != "Joint"}) == 1
    sweep = titled(out, "Fig. 2")
    assert [r[0] for r in sweep] == ["CWT", "CWT + Rewind"] and all(len(r) == 4 for r in sweep)


@pytest.mark.slow
def test_forgetting_prints_flashback_table_1_with_its_controls():
    out = run("forgetting.py", "--quick", "--rounds", "2", "--nodes", "10")
    rows = table(out, "| method | rounds to A_0.75 |")
    assert [r[0] for r in rows] == [
        "FedAvg (2.5% held out, unused)", "FedAvg + FT on 2.5% (control)", "Flashback, 2.5% public",
        "FedAvg (10% held out, unused)", "FedAvg + FT on 10% (control)", "Flashback, 10% public",
        "FedAvg + Rewind (10% held out)", "FedAvg + Rewind, chain scope"]
    assert all(len(r) == 6 for r in rows)


@pytest.mark.slow
def test_fedcurv_prints_rounds_to_a_share_of_the_best():
    out = run("fedcurv.py", "--quick", "--rounds", "2", "--epochs", "2", "--nodes", "6")
    rows = table(out, "| method | rounds to 85% of best |")
    assert [r[0] for r in rows] == ["FedAvg", "FedCurv, lambda = 0 (control: plain mean, no penalty)",
                                    "FedCurv, lambda = 1", "FedCurv, lambda = 10"]
    assert all(len(r) == 6 for r in rows)
    assert any(cell != "-" for r in rows for cell in r[1:4]), "the best row reaches 95% of itself"


@pytest.mark.slow
def test_wsm_prints_client_forgetting_over_c():
    out = run("wsm.py", "--quick", "--rounds", "2", "--nodes", "20")  # C = 0.1: 2 participants
    rows = table(out, "| C | method |")
    assert [(r[0], r[1]) for r in rows] == [("0.1", "FedAvg"), ("0.1", "FedAvg + WSM"), ("0.5", "FedAvg"),
                                            ("0.5", "FedAvg + WSM")]
    assert all(len(r) == 6 and r[4] != "nan" for r in rows)


@pytest.mark.slow
def test_lane_timeline_prints_every_mark_in_the_order_a_delivery_passes_them():
    """Each mark of a delivery comes after the one before it, so their medians are in order too;
    a timer that wrapped the wrong function (or none) would break the order or leave a mark out."""
    out = run("lane_timeline.py", "--mib", "5", "--deliveries", "3")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("data-lane Deliver of "))
    marks = [line.split() for line in lines[start + 1:lines.index("steps (median ms):")]]
    assert [m[0] for m in marks] == ["call", "servicer", "read", "first", "last", "digested", "checked",
                                     "decoded", "answered"]
    medians = [float(m[1]) for m in marks]
    assert medians[0] == 0 and medians == sorted(medians) and medians[-1] > 0
    assert "the raw socket, the same bytes, whole transfer: " in out
    assert "not yet hashed and checked when the last byte came: " in out
    assert "before the first read, timed alone (median of 200): header checks " in out
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lane_timeline.py"), "--mib", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--mib at least 4" in proc.stderr.splitlines()[-1]


@pytest.mark.slow
def test_startup_prints_help_serving_and_exit_times_with_the_control():
    rows = table(run("startup.py", "--runs", "1"), "| what |")
    assert [r[0] for r in rows] == ["`fl-sim --help`", "`fl-node --help`", "`fl-certs --help`",
                                    "`fl-node` launch to health SERVING",
                                    'control: `python -c "import torch"`', "`fl-sim` last line to exit",
                                    "control: the same `main` under `sys.exit`"]
    assert all(float(r[1]) > 0 and r[1] == r[2] for r in rows)  # one run: min is the median
    assert [r[3] for r in rows] == ["0.5", "0.5", "0.5", "2.0", "-", "-", "-"]


@pytest.mark.slow
def test_round_cost_prints_each_way_and_they_agree():
    rows = table(run("round_cost.py", "--rounds", "2", "--repeats", "1"), "| way |")
    assert [r[0] for r in rows] == ["loop", "memory", "grpc"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert len({r[3] for r in rows}) == 1  # the same computation: the same final FA


@pytest.mark.slow
def test_poll_model_prints_both_ways_and_they_agree(tmp_path):
    job = tmp_path / "star.toml"
    job.write_text('[federation]\nname = "star"\nseed = 1\nrounds = 2\n[topology]\nnodes = 4\n'
                   '[data]\ndataset = "digits"\n[model]\nname = "mlp"\nhidden = [16]\n'
                   '[aggregator]\nstrategy = "fedavg"\nfraction = 1.0\n')
    out = run("poll_model.py", str(job), "--pairs", "1")
    rows = table(out, "| way |")
    assert [r[0] for r in rows] == ["with the model", "control: poll, then fetch"]
    assert rows[0][3] == rows[1][3] and rows[0][3].endswith("%")  # the same rounds: the same accuracy
    assert "paired difference" in out


@pytest.mark.slow
def test_picture_cost_prints_the_forked_and_the_launched_helper(tmp_path):
    job = tmp_path / "star.toml"
    job.write_text('[federation]\nname = "star"\nseed = 1\nrounds = 2\n[topology]\nnodes = 3\n'
                   '[model]\nname = "mlp"\nhidden = [16]\n[aggregator]\nfraction = 1.0\n')
    done = subprocess.run([str(Path(sys.executable).parent / "fl-sim"), str(job), "--quiet", "--no-pictures",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = table(run("picture_cost.py", str(tmp_path / "run"), "--runs", "1"), "| helper |")
    assert [r[0] for r in rows] == ["forked (fl-sim on Linux)", "launched interpreter (control)"]
    assert all(float(r[1].split()[0]) > 0 and float(r[2].split()[0]) > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="CPU affinity is Linux's")
def test_pinning_prints_the_steps_and_both_ways_of_each_job_and_they_agree():
    out = run("pinning.py", "--pairs", "1", "--rounds", "2")
    steps = table(out, "| way | every CPU |")
    assert [r[0] for r in steps] == ["one thread", "node threads"]
    assert all(float(v) > 0 for r in steps for v in r[1:])
    for job in ("quickstart.toml", "fedavg10.toml"):
        ways = table(out[out.index(f"2. {job}"):], "| way | wall s")
        assert [r[0] for r in ways] == ["pinned (default)", "control: --no-pin"]
        assert ways[0][3] == ways[1][3] and ways[0][3].endswith("%")  # pinning changes no number
    assert out.count("paired difference") == 2


@pytest.mark.slow
def test_scale_prints_each_size_and_where_its_workers_ran():
    cpus = sorted(os.sched_getaffinity(0))
    for flags in ((), ("--no-pin",)):
        out = run("scale.py", "--sizes", "10", "12", "--rounds", "3", *flags)
        assert f"workers: fl-sim default, {'--no-pin' if flags else 'pinned'}\n" in out
        rows = table(out, "| nodes |")
        assert [r[0] for r in rows] == ["10", "12"]
        assert rows[0][4] == "-"
        float(rows[1][4])  # RSS per extra node: a number (of either sign at these sizes)
        assert all(float(r[1]) >= 0 and r[2].endswith(" ms") and float(r[3]) > 0 for r in rows)
        for r in rows:  # two workers on two or more CPUs (fl-sim's default: five nodes or more each)
            placed = [[int(c) for c in worker.split(",")] for worker in r[6].split(" / ")]
            if flags:
                assert all(worker == cpus for worker in placed), r[6]
            elif len(cpus) >= len(placed) > 1:
                assert all(len(worker) == 1 for worker in placed), r[6]
                assert len({worker[0] for worker in placed}) == len(placed), r[6]  # each its own
