"""Every kept benchmark runs in its --quick mode and writes the JSON result its README promises:
the figures it prints, the command line, the seeds and the host."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def run(tmp_path: Any, script: str, *args: str) -> dict[str, Any]:
    """The ``results`` of ``benchmarks/SCRIPT --quick ARGS``, after checking the envelope."""
    path = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--quick", *args,
                           "--json", str(path)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == script.removesuffix(".py")
    assert doc["command"][1:] == [str(REPO / "benchmarks" / script), "--quick", *args, "--json", str(path)]
    assert doc["seeds"] and all(isinstance(s, int) for s in doc["seeds"])
    host = doc["host"]
    assert host["python"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(host["torch"], str) and isinstance(host["cpu_count"], int) and host["cpu_count"] >= 1
    return doc["results"]


def number(value: Any, low: float = -math.inf) -> bool:
    """A finite int or float (not a bool) of at least ``low``."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= low


def share(value: Any) -> bool:
    return number(value) and 0 <= value <= 1


def one_seed(cell: dict[str, Any], check: Any = share) -> bool:
    """A mean ± std cell over one seed: the mean is its only value, no std."""
    return cell["std"] is None and len(cell["values"]) == 1 and cell["values"][0] == cell["mean"] \
        and check(cell["mean"])


def test_overhead(tmp_path):
    results = run(tmp_path, "overhead.py", "--rounds", "1")
    assert results["repeats"] == 1 and results["rounds"] == 1
    assert set(results["jobs"]) == {"fedavg", "quickstart"}
    for job in results["jobs"].values():
        ways = job["ways"]
        assert set(ways) == {"plain", "plain, 1 thread", "fl-sim", "fl-sim, factory"}
        for way in ways.values():
            assert number(way["wall_s"], 0) and number(way["cpu_s"], 0) and number(way["peak_pss_mib"], 1)
            assert share(way["final_accuracy"]) and len(way["runs"]) == 1
        # the same computation: the same final accuracy
        assert len({round(w["final_accuracy"], 6) for w in ways.values()}) == 1
        ratios = job["ratios"]
        assert ratios["wall_vs_plain"] == ways["fl-sim"]["wall_s"] / ways["plain"]["wall_s"]
        assert ratios["cpu_vs_plain_1_thread"] == ways["fl-sim"]["cpu_s"] / ways["plain, 1 thread"]["cpu_s"]
        assert ratios["factory_wall_vs_plain"] == ways["fl-sim, factory"]["wall_s"] / ways["plain"]["wall_s"]
        assert ratios["pss_vs_plain"] == ways["fl-sim"]["peak_pss_mib"] / ways["plain"]["peak_pss_mib"]
    large = results["large_per_round"]
    assert large["hidden"] == "[1024, 1024]" and large["rounds"] == [1, 5]
    cpu = large["cpu_s_per_round"]
    for way in ("plain, 1 thread", "fl-sim", "fl-sim, factory"):
        runs = large["runs"]
        assert cpu[way] == (runs["long"]["ways"][way]["cpu_s"] - runs["short"]["ways"][way]["cpu_s"]) / 4
    assert large["cpu_vs_plain_1_thread"] == cpu["fl-sim"] / cpu["plain, 1 thread"]


def test_scale(tmp_path):
    results = run(tmp_path, "scale.py", "--nodes", "4", "6", "--cores", "1", "--devices", "--calls",
                  "--eval-sample", "3", "--repeat", "2")
    assert results["rounds"] == 3 and len(results["cpus"]) == 1
    small, _, _, _, big, _, _, _ = results["sizes"]
    assert [s["nodes"] for s in results["sizes"]] == [4] * 4 + [6] * 4
    assert [s["devices"] for s in results["sizes"]] == [False, True, True, False] * 2  # in turns
    assert small["rss_per_extra_node_mib"] is None and number(big["rss_per_extra_node_mib"])
    for size in results["sizes"]:
        assert size["eval_sample"] == 3  # FA/FF from sampled pairs at every size
        assert len(size["round_walls_s"]) == 1 and size["s_per_round"] == size["round_walls_s"][0] > 0
        assert size["ms_per_node_round"] == pytest.approx(1000 * size["s_per_round"] / size["nodes"])
        assert number(size["peak_rss_mib"], 1) and number(size["whole_run_s"], 0)
        assert number(size["user_ms_per_node"], 0) and number(size["system_ms_per_node"], 0)
        assert size["switches_per_node"] > 0
        assert size["user_ms_per_node"] + size["system_ms_per_node"] == pytest.approx(
            1000 * size["cpu_s"] / size["nodes"])
    # a node's Python calls in a round: the same work at both sizes (3 evaluations each)
    assert number(small["calls_per_node_round"], 100) and number(big["calls_per_node_round"], 100)
    assert big["calls_per_node_round"] == pytest.approx(small["calls_per_node_round"], rel=0.1)


def test_sim_breakdown(tmp_path):
    results = run(tmp_path, "sim_breakdown.py")
    phases = ["start", "import torch", "import torch._dynamo", "set-up", "rounds", "pictures", "exit"]
    (only,) = results["runs"]
    assert list(only) == [*phases, "whole run"] and all(number(only[p], 0) for p in only)
    assert only["rounds"] > 0 and only["pictures"] > 0, "two rounds ran and their pictures were drawn"
    assert results["median"] == only
    second = results["second_process"]
    assert number(second["cpu_s"], 0) and number(second["pss_mib"], 1), "a second process was priced"


def test_fl_node(tmp_path):
    results = run(tmp_path, "fl_node.py")
    assert (results["nodes"], results["rounds"], results["runs"]) == (3, 3, 1)
    node, sim = results["ways"]["fl-node"], results["ways"]["fl-sim"]
    assert set(node) == {"listening_s", "whole_s", "round_s"} and set(sim) == {"whole_s", "round_s"}
    assert all(number(v["min"], 0) and v["min"] == v["median"] for v in [*node.values(), *sim.values()])


def test_startup(tmp_path):
    rows = run(tmp_path, "startup.py")["rows"]
    assert [r["what"] for r in rows] == [
        "fl-sim --help", "fl-node --help", "fl-certs --help", "fl-node launch to health SERVING",
        "control: python -c 'import torch'"]
    assert [r["target_s"] for r in rows] == [0.5, 0.5, 0.5, 2.0, None]
    assert all(r["values_s"] == [r["min_s"]] and r["min_s"] == r["median_s"] > 0 for r in rows)


def test_compression(tmp_path):
    results = run(tmp_path, "compression.py")
    rows = results["rows"]
    assert results["rounds"] == 2
    assert [r["wire"] for r in rows] == ["native", "float16", "bfloat16", "zstd", "float16 + zstd"]
    assert {r["file"] for r in rows} == {"quickstart.toml"}
    assert rows[0]["vs_native"] == 1 and rows[0]["change_points"] == 0
    assert all(number(r["bytes_per_round"], 1) and share(r["final_fa"]) for r in rows)
    assert rows[1]["vs_native"] < 0.6  # half the bytes of each float, plus the headers
    assert rows[3]["final_fa"] == rows[0]["final_fa"]  # zstd is lossless


def test_edge_memory(tmp_path):
    (build,) = run(tmp_path, "edge_memory.py")["builds"]
    assert build["torch"].split()[-1] in ("cpu", "cuda")
    assert number(build["import_torch_mib"], 1)
    assert set(build["nodes"]) == {"a", "b"}
    assert all(n["exit_code"] == 0 and number(n["peak_rss_mib"], 1) for n in build["nodes"].values())


def test_fedrewind(tmp_path):
    results = run(tmp_path, "fedrewind.py", "--rounds", "2", "--epochs", "1", "2")
    cells = results["cells"]
    methods = {c["method"] for c in cells}
    assert len(methods) == 11 and {"CWT", "CWT + Rewind", "FedAvg (C = 1)", "Joint"} <= methods
    main = [c for c in cells if c["alpha"] == 0.25]
    assert len(main) == 11 * 2 and {(c["epochs"], c["rounds"]) for c in main} == {(1.0, 2), (2.0, 2)}
    sweep = [c for c in cells if c["alpha"] != 0.25]
    assert sorted((c["method"], c["alpha"]) for c in sweep) == [
        ("CWT", 0.1), ("CWT", 0.5), ("CWT + Rewind", 0.1), ("CWT + Rewind", 0.5)]
    assert all(one_seed(c[k]) for c in cells for k in ("fa", "ff", "pfa"))
    assert all(one_seed(c["steps"], lambda v: number(v, 1)) for c in cells)
    # every federated row trains the same steps per node per round
    assert len({(c["epochs"], c["steps"]["mean"]) for c in main if c["method"] != "Joint"}) == 2


def test_fedcurv(tmp_path):
    (table,) = run(tmp_path, "fedcurv.py", "--rounds", "2", "--epochs", "2", "--nodes", "6")["tables"]
    assert table["epochs"] == 2 and share(table["best_of_any_row"])
    assert [r["method"] for r in table["rows"]] == [
        "FedAvg", "FedCurv, lambda = 0 (control: plain mean, no penalty)", "FedCurv, lambda = 1",
        "FedCurv, lambda = 10"]
    for row in table["rows"]:
        assert set(row["rounds_to"]) == {"0.85", "0.9", "0.95"}
        assert all(r is None or r in (1, 2) for r in row["rounds_to"].values())
        assert one_seed(row["best"]) and one_seed(row["final"])


def test_forgetting(tmp_path):
    (table,) = run(tmp_path, "forgetting.py", "--rounds", "2", "--nodes", "10")["tables"]
    assert table["scenario"] == "Dirichlet alpha = 0.1" and share(table["target"])
    assert [r["method"] for r in table["rows"]] == [
        "FedAvg (2.5% held out, unused)", "FedAvg + FT on 2.5% (control)", "Flashback, 2.5% public",
        "FedAvg (10% held out, unused)", "FedAvg + FT on 10% (control)", "Flashback, 10% public",
        "FedAvg + Rewind (10% held out)", "FedAvg + Rewind, chain scope"]
    for row in table["rows"]:
        assert set(row["rounds_to"]) == {"0.75", "0.9", "1"}
        assert one_seed(row["final"]) and one_seed(row["mean_global_forgetting"], lambda v: number(v, -1))


def test_dishonest(tmp_path):
    results = run(tmp_path, "dishonest.py", "--nodes", "4", "--ring", "3")
    assert [(c["kind"], c["defence"]) for c in results["cells"]] == [
        ("star", "FedAvg"), ("star", "median"), ("star", "trimmed mean (0.2)"),
        ("star", "FedAvg + clip_norm 1"),
        ("peer", "CWT, no guard"), ("peer", "CWT, distance_guard 5")]
    for cell in results["cells"]:
        assert one_seed(cell["honest"]) and one_seed(cell["dishonest"])
        assert cell["refused_honest"] == 0 and isinstance(cell["refused_dishonest"], int)


def test_distance_guard(tmp_path):
    results = run(tmp_path, "distance_guard.py")
    assert [(c["attack"], c["guard"]) for c in results["cells"]] == [
        ("none", 0.0), ("none", 5.0), ("boosted x -10", 0.0), ("boosted x -10", 5.0),
        ("bias shift x 4", 0.0), ("bias shift x 4", 5.0)]
    for cell in results["cells"]:
        assert one_seed(cell["honest_accuracy"]) and one_seed(cell["honest_fa"])
    refused = {(c["attack"], c["guard"]): c["refused"] for c in results["cells"]}
    assert refused[("none", 5.0)] == 0 and refused[("boosted x -10", 5.0)] > 0
    assert refused[("bias shift x 4", 5.0)] == 0, "under the bound: taken"


def test_gossip(tmp_path):
    results = run(tmp_path, "gossip.py")
    table = results["sizes"]["4"]
    assert "Epidemic, s = 4" not in table  # s must leave a node someone it does not send to
    assert set(table) >= {"local only", "D-PSGD, ring", "D-PSGD, complete", "push-sum, directed ring",
                          "CWT, ring", "star FedAvg"}
    for way in table.values():
        assert all(share(v) for v in way["mean"]) and all(share(v) for v in way["min"])
        assert way["min"][0] <= way["mean"][0]
    # averaging on the complete graph leaves one model; training alone leaves them apart
    assert table["D-PSGD, complete"]["consensus"][0] < 1e-5 < table["local only"]["consensus"][0]
    assert table["local only"]["bytes_per_node_per_round"] == [0.0]
    assert set(results["poisoning"]) == {"none", "x -10", "bias shift x 4"}  # the control, two attacks
    for attack in results["poisoning"].values():
        assert set(attack) == {"dpsgd", "median", "trimmed_mean", "krum"}
        assert all(one_seed(s) for s in attack.values())


def test_round_parts(tmp_path):
    results = run(tmp_path, "round_parts.py")
    assert results["rounds"] == [2, 4]
    for way in ("plain loop", "fl-sim"):
        parts = results["per_round"][way]
        # each figure is the difference of two short runs' CPU seconds: the start-up's spread can
        # exceed two rounds' work, so a quick run's figures may come out below 0, the whole too
        assert all(number(v) for v in parts.values())
        assert {"whole process", "evaluations", "local training", "moving models"} <= set(parts)
    per_round = results["per_round"]
    assert per_round["plain loop"]["moving models"] == 0  # the loop moves no model


@pytest.fixture(scope="module")
def wsm_quick(tmp_path_factory: Any) -> tuple[Any, dict[str, Any]]:
    """benchmarks/wsm.py --quick at 2 rounds of 20 nodes (C = 0.1: 2 participants): its folder
    and results."""
    tmp = tmp_path_factory.mktemp("wsm")
    return tmp, run(tmp, "wsm.py", "--rounds", "2", "--nodes", "20")


def test_wsm(wsm_quick):
    results = wsm_quick[1]
    assert [(c["fraction"], c["method"]) for c in results["cells"]] == [
        (0.1, "FedAvg"), (0.1, "FedAvg + WSM"), (0.5, "FedAvg"), (0.5, "FedAvg + WSM")]
    assert (results["epochs"], results["partition"], results["rounds"]) == (1.0, "dirichlet_equal", 2)
    for cell in results["cells"]:
        assert one_seed(cell["first"]) and one_seed(cell["mid"]) and one_seed(cell["last"])
        assert one_seed(cell["fk"], lambda v: number(v, -1)) and one_seed(cell["ft"], lambda v: number(v, -1))
        assert one_seed(cell["steps"], lambda v: number(v, 1))
        [curve] = cell["curves"]
        assert len(curve) == 2 and all(share(a) for a in curve)
        assert sum(curve) / 2 == pytest.approx(cell["last"]["mean"])
        [per_class] = cell["per_class_last"]
        assert len(per_class) == 10 and all(a is None or share(a) for a in per_class)


def test_wsm_more_local_epochs_take_more_steps(tmp_path, wsm_quick):
    results = run(tmp_path, "wsm.py", "--rounds", "2", "--nodes", "20", "--fractions", "0.1", "--epochs", "3")
    assert [(c["fraction"], c["method"]) for c in results["cells"]] == [
        (0.1, "FedAvg"), (0.1, "FedAvg + WSM")]
    assert results["epochs"] == 3
    one_epoch = wsm_quick[1]["cells"][0]["steps"]["mean"]
    assert all(c["steps"]["mean"] > 2 * one_epoch for c in results["cells"])


def test_wsm_mechanism_at_m0(tmp_path):
    results = run(tmp_path, "wsm_mechanism.py", "--nodes", "20")
    assert results["partition"] == "dirichlet_equal" and results["runs"] is None
    [got] = results["per_seed"]
    assert 0 < got["grad_ratio"] < 1 and 0 < got["node_ratio_mean"] < 1 and share(got["true_class_p"])
    assert len(got["signal"]) == 10 and all(s is None or 0 <= s < 1 for s in got["signal"])
    assert got["shares"] == 20 and 0 <= got["single_class_shares"] <= 20
    assert 1 <= got["classes_per_share"] <= 10
    assert got["share_sizes"]["max"] - got["share_sizes"]["min"] <= 1  # equal-size shares
    assert "accuracy" not in got


def test_wsm_mechanism_unequal_split(tmp_path):
    results = run(tmp_path, "wsm_mechanism.py", "--nodes", "20", "--partition", "dirichlet")
    [got] = results["per_seed"]
    assert got["share_sizes"]["max"] > got["share_sizes"]["min"] + 1


def test_wsm_mechanism_joins_a_wsm_result(tmp_path, wsm_quick):
    runs = wsm_quick[0] / "result.json"
    results = run(tmp_path, "wsm_mechanism.py", "--runs", str(runs), "--fraction", "0.5")
    assert results["nodes"] == 20 and results["fraction"] == 0.5
    [got] = results["per_seed"]
    cells = {c["method"]: c for c in wsm_quick[1]["cells"] if c["fraction"] == 0.5}
    assert got["accuracy"] == {m: c["per_class_last"][0] for m, c in cells.items()}
    assert set(got["correlation"]) == {"FedAvg", "FedAvg + WSM"}
    assert all(r is None or -1 <= r <= 1 for r in got["correlation"].values())


def test_dp_replay(tmp_path):
    results = run(tmp_path, "dp_replay.py", "--tasks", "2", "--rounds-per-task", "1")
    assert results["tasks"] == 2 and results["rounds_per_task"] == 1
    gains = results["gains"]
    assert len(gains) == 2 * 2 * 3 * 2 * 2  # scenario, participation, epsilon, model, mode
    assert {g["epsilon"] for g in gains} == {1.0, 10.0, 100.0}
    assert all(one_seed(g["gain"], lambda v: number(v, -1) and v <= 1) for g in gains)
    finals = results["task_accuracy"]
    assert len(finals) == 2 * 4 * 3 and all(len(f["tasks"]) == 2 for f in finals)


def test_dp_replay_protocol(tmp_path):
    results = run(tmp_path, "dp_replay_protocol.py", "--rounds-per-task", "1", "--only", "1,4")
    assert results["rounds_per_task"] == 1
    low, full = results["rows"]
    assert low["protocol"].startswith("p = 0.05") and full["protocol"] == "full participation"
    for row in (low, full):
        assert set(row["gain"]) == {"Client Training", "Aggregator Training"}
        assert all(one_seed(g, lambda v: number(v, -1) and v <= 1) for g in row["gain"].values())
        assert one_seed(row["baseline_accuracy"]) and one_seed(row["baseline_old_tasks"])
        assert one_seed(row["rounds_with_earlier_client"])
    # With full participation every earlier client takes part in every round of the last task.
    assert full["rounds_with_earlier_client"]["mean"] == 1.0
    assert full["last_round_with_earlier_client"] == [True]


def test_dp_replay_protocol_rejects_an_unknown_row(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dp_replay_protocol.py"), "--only", "9"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "--only takes row numbers 1..8" in proc.stderr


def test_heterogeneity(tmp_path):
    results = run(tmp_path, "heterogeneity.py")
    assert results["nodes"] == 8 and results["rounds"] == 6
    table = results["results"]
    assert set(table) == {"sync D-PSGD", "barrier-free D-PSGD", "CWT", "sync FedAvg", "FedBuff"}
    for way in table.values():
        assert set(way) == {"all fast", "heterogeneous"}
        fast, slow = way["all fast"], way["heterogeneous"]
        assert all(number(v, 0) for v in fast["final"] + slow["final"] + fast["bytes"])
        # the same rounds on slower devices and thinner links take longer in simulated time
        assert all(s > f > 0 for f, s in zip(fast["sim_time_s"], slow["sim_time_s"], strict=True))
