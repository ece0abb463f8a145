"""What fl-sim prints: a line per round under its header, and the final table, for both kinds."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from flmesh.cli.sim_console import columns, final_line, final_table, header, key, pct, round_line, title
from flmesh.config import parse_federation
from flmesh.reports.pictures import accuracy_labels
from flmesh.reports.results import Final, NodeRound, RoundRow, Summary
from flmesh.reports.run_files import read_rows

from conftest import tiny_raw

FL_SIM = str(Path(sys.executable).with_name("fl-sim"))


def _peer():
    return parse_federation(tiny_raw(), source="tiny.toml")


def _star():
    raw = tiny_raw(aggregator={"strategy": "fedavg", "fraction": 0.67, "deadline_s": 60})
    return parse_federation(raw, source="star.toml")


def test_a_round_line_sits_under_its_header_in_both_kinds():
    peer = RoundRow(1, "peer", "fl-sim", fa=0.5, ff=0.25, pfa=None, wall_s=1.234, missing=["b"],
                    nodes={"a": NodeRound("a", 1, missing="b"), "b": NodeRound("b", 1)})
    assert columns(_peer()) == "round    FA %    FF %   PFA %  missing       s"
    assert round_line(peer) == "    1   50.00   25.00       -        1    1.23"
    star = RoundRow(2, "star", "fl-sim", accuracy=0.875, global_forgetting=0.0, selected=["a", "b"],
                    received=["a"], wall_s=0.5, task=1, task_accuracy=[0.5, None])
    assert columns(_star()) == "round   acc %   F_t %   F_k %  updates       s"
    assert round_line(star) == "    2   87.50    0.00       -      1/2    0.50     1  50.00 -"
    assert len(columns(_peer())) == len(round_line(peer))  # the columns line up


def test_the_header_keys_the_metrics_and_which_way_is_better():
    peer = key(_peer())
    assert "\n" not in peer
    assert "FA: mean accuracy of every model on every node's test split (higher is better)" in peer
    assert "FF: their standard deviation, how unevenly the models serve the nodes (lower is better)" in peer
    assert "PFA: mean accuracy of each model on its own node's split (higher is better)" in peer
    assert "F_t:" in key(_star()) and "lower is better" in key(_star())
    out = io.StringIO()
    Console(file=out, width=400).print(header(_peer()), style="bold")
    assert out.getvalue().splitlines() == [peer, columns(_peer())]  # the key, then the columns


def test_the_title_names_the_kind_and_the_results_folder():
    line = title(_peer(), "runs/x")
    assert "3 nodes, schedule cwt, graph complete" in line and line.endswith("  ->  runs/x")
    assert "aggregator fedavg (C=0.67)" in title(_star(), "runs/y")
    assert pct(None) == "     -" and pct(0.1234) == " 12.34"


def _rendered(table) -> str:
    out = io.StringIO()
    Console(file=out, width=120).print(table)
    return out.getvalue()


def test_the_final_table_has_each_kinds_columns_and_none_without_a_round():
    summary = Summary("peer", "fl-sim", "tiny", "tiny.toml", 1, 0, 2, False)
    assert final_table(_peer(), summary) is None
    summary.rounds, summary.final = 2, Final(2, fa=0.5, ff=0.1, pfa=0.6)
    summary.best_fa = {"round": 1, "fa": 0.55}
    text = _rendered(final_table(_peer(), summary))
    assert "after round 2" in text and "best FA %" in text and "55.00 (r1)" in text
    summary.kind, summary.final, summary.mean_global_forgetting = "star", Final(2, accuracy=0.9), 0.02
    text = _rendered(final_table(_star(), summary))
    assert "accuracy %" in text and "mean F_t %" in text and "90.00" in text and "2.00" in text


CONTINUAL = """
[federation]
name = "cont"
seed = 3
rounds = 4
round_timeout_s = 20
[topology]
nodes = 4
graph = "complete"
schedule = "cwt"
[rewind]
mode = "previous"
lambda = 0.1
[training]
epochs = 1
batch_size = 16
lr = 0.05
[data]
dataset = "digits"
[model]
name = "mlp"
hidden = [16]
[tasks]
scenario = "novel_inputs"
tasks = 2
rounds_per_task = 2
initial_clients = 2
joining_clients = 2
"""


@pytest.mark.parametrize("transport", [[], ["--transport", "grpc", "--tls"]], ids=["memory", "grpc"])
def test_a_rewind_target_without_data_yet_is_a_note_in_the_row_not_a_warning(tmp_path, transport):
    # node0 rewinds to node3 ("previous" on the ring), which joins only in task 1
    fed = tmp_path / "cont.toml"
    fed.write_text(CONTINUAL)
    out = tmp_path / "run"
    done = subprocess.run([FL_SIM, str(fed), "--no-pictures", "--out", str(out), *transport],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert "WARNING" not in printed and "Train asks" not in printed, printed
    rows = read_rows(out / "rounds.jsonl")
    node0 = rows[1]["nodes"]["node0"]
    assert node0["notes"] == ["node3 holds no training data yet; trained its 4 steps locally"]
    assert node0["rewound_to"] is None


def _dp(star: bool = False, mode: str = "client"):
    raw = tiny_raw(nodes=4, rounds=2, data={"partition": "iid"},
                   tasks={"scenario": "novel_targets", "tasks": 2, "rounds_per_task": 1, "initial_clients": 2,
                          "joining_clients": 2, "participation": "full"},
                   **({"aggregator": {"fraction": 1.0, "deadline_s": 60}} if star else {}))
    raw["replay"] = {"mode": mode, "epsilon": 10.0}
    return parse_federation(raw, source="dp.toml")


def test_a_dp_run_gets_the_eps_column_keyed_as_the_per_client_max():
    fed = _dp()
    assert "eps: the most DP epsilon any one client has released so far (per client max" in key(fed)
    assert columns(fed) == "round    FA %    FF %   PFA %  missing       s     eps  task  per-task acc %"
    row = RoundRow(2, "peer", "fl-sim", fa=0.5, ff=0.25, pfa=0.5, wall_s=1.0, task=1, task_accuracy=[0.5],
                   privacy_spent={"node0": 10.0, "node1": 20.0, "node2": 0.0})
    assert round_line(row) == "    2   50.00   25.00   50.00        0    1.00   20.00     1  50.00"
    at = columns(fed).index("eps")
    assert round_line(row)[at - 3:at + 3] == " 20.00"  # right-aligned under its name
    assert "eps" in columns(_dp(star=True)) and "eps" in columns(_dp(star=True, mode="local"))
    assert "eps" not in columns(_dp(mode="local")) and "eps" not in key(_peer())  # nothing released
    summary = Summary("peer", "fl-sim", "dp", "dp.toml", 3, 2, 2, False, final=Final(2, fa=0.5),
                      privacy_spent={"node0": 10.0, "node1": 20.0})
    table = _rendered(final_table(fed, summary))
    assert "max eps" in table and "20.00" in table


DP_PEER = CONTINUAL.replace("rounds = 4", "rounds = 2").replace("rounds_per_task = 2",
                                                               "rounds_per_task = 1") + """
[replay]
mode = "client"
host = "node2"
epsilon = 10.0
"""


DP_STAR = DP_PEER.replace('host = "node2"\n', "") + """
[aggregator]
fraction = 1.0
deadline_s = 60
"""


@pytest.mark.parametrize("text", [DP_PEER, DP_STAR], ids=["peer", "star"])
def test_a_dp_run_folder_holds_the_ledger_and_the_privacy_picture(tmp_path, text):
    fed = tmp_path / "dp.toml"
    fed.write_text(text)
    out = tmp_path / "run"
    done = subprocess.run([FL_SIM, str(fed), "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    assert {(r["client"], r["task"], r["epsilon"]) for r in ledger["releases"]} == {
        ("node0", 0, 10.0), ("node1", 0, 10.0)}
    assert ledger["spent"] == {"node0": 10.0, "node1": 10.0}
    rows = read_rows(out / "rounds.jsonl")
    assert max(rows[-1]["privacy_spent"].values()) == 10.0
    lines = done.stdout.splitlines()
    head = next(line for line in lines if line.startswith("round "))
    assert "eps" in head
    last = next(line for line in lines if line.startswith("    2  "))
    at = head.index("eps")
    assert last[at - 3:at + 3] == " 10.00"  # the eps column, right-aligned under its name
    summary = json.loads((out / "summary.json").read_text())
    assert str(out / "privacy.png") in summary["pictures"] and (out / "privacy.png").stat().st_size > 0
    from PIL import Image

    from flmesh.reports.pictures import run_title

    title = Image.open(out / "privacy.png").text["Title"]
    assert title == run_title(out, rows)  # titled like the run's other pictures


class _Driver:
    """A driver whose replay host holds a ledger; its run ends after one row, or fails."""

    rounds_done = 1

    def __init__(self, fail: bool):
        from flmesh.replay.ledger import PrivacyLedger

        self.fail, self.ledger = fail, PrivacyLedger(None)
        self.ledger.record("node0", 0, 10.0)

    def rows(self):
        yield RoundRow(1, "peer", "fl-sim", privacy_spent={"node0": 10.0})
        if self.fail:
            raise RuntimeError("the run's own error")

    def replay_host(self):
        return self

    def config(self):
        return {}

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


@pytest.mark.parametrize("fail", [False, True], ids=["ended", "failed"])
def test_a_ledger_that_cannot_be_written_is_one_line_and_hides_no_error(tmp_path, caplog, fail):
    import tomllib

    from flmesh.reports.pictures import PicturesError
    from flmesh.sim.simulation import Simulation

    sim = Simulation(parse_federation(tomllib.loads(DP_PEER), source="dp.toml"), tmp_path / "run")
    sim.driver, sim.draw_pictures = _Driver(fail), False
    (tmp_path / "run" / "privacy_ledger.json").mkdir(parents=True)  # a folder where the ledger goes
    expected = RuntimeError if fail else PicturesError  # fl-sim says a PicturesError in one line
    with pytest.raises(expected, match="the run's own error" if fail else "privacy ledger") as raised:
        sim.run()
    ledger = f"cannot write the privacy ledger in {tmp_path / 'run'}: "
    said = str(raised.value) if not fail else caplog.records[-1].getMessage()
    assert said.startswith(ledger) and "\n" not in said, said
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds"] == 1


def test_a_federation_metric_names_the_pictures_the_quiet_line_and_fl_nodes_log():
    rows = [{"round": 1, "kind": "peer", "metric": "balanced_accuracy", "fa": 0.5, "ff": 0.1, "pfa": 0.6}]
    labels = accuracy_labels(rows)
    assert labels["fa"] == "FA (federation balanced_accuracy)" and labels["y"] == "balanced_accuracy (%)"
    assert labels["pfa"] == "PFA (personalized over balanced_accuracy)"
    star = [{**rows[0], "kind": "star", "accuracy": 0.7}]
    assert accuracy_labels(star)["y"] == "balanced_accuracy; accuracy (%)"
    assert accuracy_labels([{**rows[0], "metric": "accuracy"}])["y"] == "accuracy (%)"
    summary = Summary("peer", "fl-sim", "tiny", "tiny.toml", 1, 2, 2, False,
                      final=Final(2, fa=0.5, ff=0.1, pfa=0.6))
    line = final_line(summary, "balanced_accuracy")
    assert "FA balanced_accuracy 50.00 %, FF balanced_accuracy 10.00 %" in line
    assert "FA 50.00 %, FF 10.00 %, PFA 60.00 %" in final_line(summary)


def test_a_round_under_way_shows_what_the_nodes_are_doing(tmp_path):
    from types import SimpleNamespace

    from flmesh.cli.sim_run import InRound
    from flmesh.sim.simulation import Simulation

    shown = InRound(SimpleNamespace(node_states=lambda: {"training": 7, "waiting": 3, "idle": 1}))
    assert shown.render(None).plain == "7 training, 3 waiting"  # type: ignore[arg-type]
    with Simulation(_peer(), tmp_path / "run") as sim:
        states = sim.node_states()
        assert sum(states.values()) == 3 and set(states) <= {"starting", "idle"}, states
        sim.run()
        assert set(sim.node_states()) <= {"idle", "done"}
