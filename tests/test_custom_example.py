"""examples/custom: a user's package (a 1-D CNN, a data source, a learner, an algorithm registered
by entry point) installed beside flmesh and run by its run.sh: fl-sim peer and star, three fl-node
processes on their own files, and the embedded script.

The package is installed into a throwaway environment that sees this one's packages (a ``.pth``
file adds them), so its entry point never reaches the other tests; run.sh runs in a copy of the
example, with that environment's bin/ first on PATH."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flmesh
from flmesh.reports.run_files import read_rows

from conftest import REPO

EXAMPLE = REPO / "examples" / "custom"
IDS = ("wave0", "wave1", "wave2")


def throwaway_env(root: Path) -> Path:
    """A venv at ``root`` that imports what this interpreter imports, with flmesh's commands in
    its bin/ run by its own python; its bin/."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # addsitedir (not a plain path line) so that the .pth files there, an editable flmesh's, run too
    lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()]
    (Path(purelib) / "_parent_env.pth").write_text("\n".join(lines) + "\n")
    for script in importlib.metadata.distribution("flmesh").entry_points:
        if script.group == "console_scripts":
            module, _, function = script.value.partition(":")
            command = root / "bin" / script.name
            command.write_text(f"#!{python}\nimport sys\nfrom {module} import {function}\n"
                               f"sys.exit({function}())\n")
            command.chmod(0o755)
    return root / "bin"


def algorithms() -> set[str]:
    """The algorithm entry points this environment's packages declare."""
    return {e.value for e in importlib.metadata.entry_points(group="flmesh.algorithms")}


def rows(run: Path) -> list[dict]:
    return read_rows(run / "rounds.jsonl")


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def assert_macro_f1(rows: list[dict], nodes: int, train_metric: bool) -> None:
    """The learner's metrics in the last row: macro-F1 from evaluate for every node (and the
    train metric, which peer rows carry), and FA over macro-F1."""
    last = rows[-1]
    assert last["metric"] == "macro_f1" and 0.0 <= last["fa"] <= 1.0
    measured = [e["metrics"] for e in last["nodes"].values() if e.get("accuracy") is not None]
    assert len(measured) == nodes
    assert all(0.0 <= m["macro_f1"] <= 1.0 for m in measured), measured
    if train_metric:
        assert all(m["train_grad_norm"] > 0 for m in measured), measured


def test_its_rfa_strategy_is_not_dragged_by_one_far_update(monkeypatch):
    """The package's aggregation rule, imported from the source tree (no entry point involved)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    try:
        from flmesh_custom_example.algorithm import RfaServer
    finally:
        for name in [m for m in sys.modules if m.startswith("flmesh_custom_example")]:
            del sys.modules[name]  # another test imports it from its own installation
    points = [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (100.0, 100.0)]  # the last one is far off
    updates = [flmesh.Update(f"n{i}", 1, {"w": torch.tensor(p), "steps": torch.tensor(7)}, 10, ())
               for i, p in enumerate(points)]
    state = RfaServer(iterations=50, nu=1e-6).aggregate(1, {}, updates)
    assert torch.linalg.vector_norm(state["w"]) < 1.0, state  # the mean is at (25.25, 25.25)
    assert state["w"].dtype == torch.float32 and int(state["steps"]) == 7
    few = RfaServer(iterations=0, nu=1e-6).aggregate(1, {}, updates)
    assert torch.allclose(few["w"], torch.tensor([25.25, 25.25])), "no iteration: the weighted mean"


@pytest.mark.slow
def test_the_custom_example_installs_and_runs_everywhere(tmp_path):
    before = algorithms()
    bin_dir = throwaway_env(tmp_path / "env")
    example = tmp_path / "custom"
    shutil.copytree(EXAMPLE, example,
                    ignore=shutil.ignore_patterns("runs", "data", "dist", "build", "*.egg-info"))
    out = tmp_path / "runs"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(out)}
    done = subprocess.run(["bash", str(example / "run.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]

    peer, star = summary(out / "peer"), summary(out / "star")
    assert peer["config"]["model"] == star["config"]["model"] == "flmesh_custom_example.model:wave_cnn"
    assert peer["config"]["dataset"] == "flmesh_custom_example.data:waveforms"
    assert star["config"]["strategy"] == "rfa", "the strategy came from the package's entry point"
    assert peer["rounds"] == star["rounds"] == 8
    assert_macro_f1(rows(out / "peer"), 3, train_metric=True)
    assert_macro_f1(rows(out / "star"), 3, train_metric=False)

    for node in IDS:
        run = out / f"nodes-{node}"
        data = summary(run)["config"]["data"]
        assert data["own"] and data["origin"].endswith(f"data/{node}.npz")
        assert (data["train_samples"], data["test_samples"]) == (240, 60)
        node_rows = rows(run)
        assert [r["round"] for r in node_rows] == [1, 2, 3, 4]
        assert 0.0 <= node_rows[-1]["nodes"][node]["metrics"]["macro_f1"] <= 1.0
    assert "round 4/4: macro_f1 " in done.stderr, "fl-node logs the federation's metric"

    assert summary(out / "embedded")["rounds"] == 8
    for node in IDS:
        assert f"Node {node}: 3 rounds, accuracy " in done.stdout
    assert algorithms() == before, "installed into the throwaway environment only"
