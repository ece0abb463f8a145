"""Federations trained on a CUDA device end where the same runs on the CPU end (``-m gpu``).

Each test runs one federation twice on the in-memory transport with a manual
clock, once with ``[training] device = "cuda"`` and once with ``"cpu"``, and
compares what they reached. After every round each node's own model (its
parameters and buffers) must still be on the device it trains on: what goes on
the wire is encoded from copies, and the node's model never moves to the CPU.

Tolerance, and why: the runs share every seed and draw their batch orders from
CPU generators, so they see the same samples in the same order; they differ
only in how CUDA kernels order their floating-point sums, a relative error of
about 1e-6 per operation. Over the few dozen SGD steps of these runs that drift
keeps parameters within ``PARAM_ATOL`` of each other, but a test sample that
lies near a class boundary can still fall on the other side, so accuracies may
differ by a sample or two per split: ``ACCURACY_ATOL`` is 0.05 (a node's test
split of the digits holds about 130 samples), the loss ``LOSS_RTOL`` 5%.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flmesh.config import Federation, parse_federation

from conftest import tiny_raw
from harness import Cluster

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]

DEVICE = "cuda"  # the device under test; the reference is always the CPU
ACCURACY_ATOL = 0.05
LOSS_RTOL = 0.05
PARAM_ATOL = 1e-3


def federation(device: str, **sections: dict[str, Any]) -> Federation:
    raw = tiny_raw(nodes=3, rounds=3, **sections)
    raw["training"]["device"] = device
    return parse_federation(raw, source=f"{device}.toml")


def continual(device: str) -> Federation:
    """Two tasks of novel targets, a round each, clients joining, the local replay buffer (no
    DP noise: OpenDP's noise is not seeded, so two runs would differ on any device)."""
    raw = tiny_raw(nodes=4, rounds=2, data={"partition": "iid"}, aggregator={"fraction": 1.0},
                   tasks={"scenario": "novel_targets", "tasks": 2, "rounds_per_task": 1,
                          "initial_clients": 2, "joining_clients": 2},
                   replay={"mode": "local"})
    raw["training"]["device"] = device
    return parse_federation(raw, source=f"continual-{device}.toml")


def on_device(cluster: Cluster, device: str) -> None:
    """Every node trains on ``device`` and its model (parameters and buffers) is still there."""
    for node in cluster.parts.values():
        assert node.model.device.type == device, node.node_id
        tensors = [*node.model.module.parameters(), *node.model.module.buffers()]
        assert tensors and all(t.device.type == device for t in tensors), \
            f"{node.node_id}: its model left {device}"


def peer_run(device: str) -> dict[str, Any]:
    torch.manual_seed(0)
    with Cluster(federation(device), "memory") as c:
        for t in range(1, c.federation.rounds + 1):
            reports = c.peer_round(t)
            on_device(c, device)
        assert any(r.received for r in reports.values()), "models went round the peers"
        return {"accuracy": {n: r.local.accuracy for n, r in reports.items()},
                "loss": {n: r.local.loss for n, r in reports.items()}, "states": c.states()}


def star_run(fed: Federation, device: str) -> dict[str, Any]:
    torch.manual_seed(0)
    with Cluster(fed, "memory") as c:
        assert c.aggregator is not None
        for t in range(1, fed.rounds + 1):
            row, reports = c.star_round(t)
            on_device(c, device)
            assert row.aggregated, f"round {t} was aggregated"
        local = {n: r.local for n, r in reports.items() if r.local is not None}
        assert local, "the nodes trained in the last round"
        return {"accuracy": {"global": row.accuracy, **{n: e.accuracy for n, e in local.items()}},
                "loss": {n: e.loss for n, e in local.items()},
                "tasks": row.task_accuracy or [], "states": c.states()}


def same_within_tolerance(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["accuracy"].keys() == want["accuracy"].keys()
    for name, accuracy in want["accuracy"].items():
        assert got["accuracy"][name] == pytest.approx(accuracy, abs=ACCURACY_ATOL), name
    for name, loss in want["loss"].items():
        assert got["loss"][name] == pytest.approx(loss, rel=LOSS_RTOL), name
    assert got.get("tasks", []) == pytest.approx(want.get("tasks", []), abs=ACCURACY_ATOL)
    for node, state in want["states"].items():
        for key, tensor in state.items():
            other = got["states"][node][key]
            assert other.device.type == "cpu", "Node.state_dict hands out CPU copies"
            if tensor.is_floating_point():
                assert torch.allclose(other, tensor, rtol=0, atol=PARAM_ATOL), f"{node} {key}"
            else:
                assert torch.equal(other, tensor), f"{node} {key}"


def test_a_peer_federation_on_cuda_matches_the_cpu():
    same_within_tolerance(peer_run(DEVICE), peer_run("cpu"))


def test_a_star_federation_with_fedcurv_on_cuda_matches_the_cpu():
    def fed(device: str) -> Federation:
        return federation(device, aggregator={"strategy": "fedcurv", "fraction": 1.0, "min_updates": 3,
                                              "deadline_s": 5, "params": {"lambda": 1.0}})

    same_within_tolerance(star_run(fed(DEVICE), DEVICE), star_run(fed("cpu"), "cpu"))


def test_a_continual_federation_on_cuda_matches_the_cpu():
    got, want = star_run(continual(DEVICE), DEVICE), star_run(continual("cpu"), "cpu")
    assert len(want["tasks"]) == 2, "the last round's global model is tested on both tasks"
    same_within_tolerance(got, want)
