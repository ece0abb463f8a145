"""A simulation's compute gate (flmesh.learning.compute): one of its threads computes at a time,
the numbers are those of an ungated run, and two simulations in one process do not share it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from flmesh.config import TrainingConfig, parse_federation
from flmesh.learning import compute as compute_module
from flmesh.learning import trainer
from flmesh.learning.arrays import ArrayData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.sim.simulation import Simulation

from conftest import tiny_raw


@pytest.fixture
def gate() -> Iterator[Compute]:
    yield Compute(gate=True)


def _data(seed: int = 0) -> ArrayData:
    gen = torch.Generator().manual_seed(seed)
    return ArrayData(torch.randn(64, 1, 2, 2, generator=gen), torch.randint(0, 3, (64,), generator=gen), 3)


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def _taken_elsewhere(compute: Compute) -> bool:
    """Whether another thread finds ``compute``'s gate taken (it tries without waiting)."""
    got: list[bool] = []

    def attempt() -> None:
        with compute.step(blocking=False) as granted:
            got.append(granted)

    probe = threading.Thread(target=attempt)
    probe.start()
    probe.join()
    return not got[0]


def test_a_training_step_holds_the_gate_and_releases_it_after(gate):
    seen: list[bool] = []

    def regularizer(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        seen.append(_taken_elsewhere(gate))  # inside a step: no other thread may compute now
        return logits.sum() * 0

    cfg = TrainingConfig(epochs=1, batch_size=16, lr=0.1)
    stats = trainer.train(_model(), _data(), cfg, seed=3, regularizers=[regularizer], compute=gate)
    assert stats.steps == 4 and seen == [True] * 4
    assert not _taken_elsewhere(gate), "the gate is free once training returned"


def test_an_evaluation_inside_the_gate_reenters_and_other_threads_wait(gate):
    with gate.step():
        result = trainer.evaluate(_model(), _data(), compute=gate)  # the same thread: reentrant
        assert _taken_elsewhere(gate)
    assert result.total == 64 and not _taken_elsewhere(gate)


def test_a_turn_hands_the_gate_to_a_waiting_thread_and_takes_it_back(gate, monkeypatch):
    monkeypatch.setattr(compute_module, "TURN_S", 0.0)  # every call between steps may hand over
    entered = threading.Event()

    def other() -> None:
        with gate.step():  # blocks while the turn holds the gate
            entered.set()

    waiter = threading.Thread(target=other)
    with gate.turn() as between:
        waiter.start()
        deadline = time.monotonic() + 30
        while not entered.is_set() and time.monotonic() < deadline:
            between()  # the steps of a long training call
        assert entered.is_set(), "the waiting thread got the gate within the turn"
        assert _taken_elsewhere(gate), "the turn holds the gate again after handing it over"
    waiter.join()
    assert not _taken_elsewhere(gate)


def test_a_thread_waiting_for_the_gate_gets_it_between_two_steps_of_a_training(gate, monkeypatch):
    monkeypatch.setattr(compute_module, "TURN_S", 0.0)
    entered = threading.Event()

    def other() -> None:
        with gate.step():
            entered.set()

    waiter = threading.Thread(target=other)

    def regularizer(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if not waiter.is_alive() and not entered.is_set():
            waiter.start()  # from inside the first step, while the training holds the gate
        return logits.sum() * 0

    cfg = TrainingConfig(epochs=1, batch_size=16, lr=0.1)
    with pytest.raises(trainer.TrainingStopped):  # stops once the other thread has had the gate
        trainer.train(_model(), _data(), cfg, steps=10_000, seed=3, regularizers=[regularizer],
                      compute=gate, stop=entered.is_set)
    waiter.join()


def test_a_turn_keeps_the_gate_between_its_steps_while_nobody_waits(gate):
    with gate.turn() as between:
        between()
        assert _taken_elsewhere(gate)
    assert not _taken_elsewhere(gate)


def test_the_gate_changes_no_number():
    cfg = TrainingConfig(epochs=2, batch_size=16, lr=0.1, optimizer="sgd", momentum=0.9)
    states = []
    for compute in (UNGATED, Compute(gate=True)):
        model = _model()
        trainer.train(model, _data(), cfg, seed=5, compute=compute)
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_without_the_gate_compute_is_a_no_op():
    with UNGATED.step() as granted:
        assert granted and not _taken_elsewhere(UNGATED)


def test_a_process_hosting_several_nodes_gates_compute_and_one_hosting_one_does_not():
    threads = torch.get_num_threads()
    one, three = Compute.for_nodes(1), Compute.for_nodes(3)
    with one.applied(), one.step():
        assert not _taken_elsewhere(one) and torch.get_num_threads() == threads
    with three.applied(), three.step():
        assert _taken_elsewhere(three) and torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads, "the thread count is put back"


def test_two_simulations_in_one_process_do_not_share_their_gate(tmp_path):
    fed = parse_federation(tiny_raw(nodes=3, rounds=1), source="t.toml")
    threads = torch.get_num_threads()
    first, second = Simulation(fed, tmp_path / "a"), Simulation(fed, tmp_path / "b")
    assert first.compute.gate is not None and second.compute.gate is not None
    with first.compute.step():
        assert _taken_elsewhere(first.compute) and not _taken_elsewhere(second.compute)
    with first, second:  # both started: each applies its own thread count, and gives it back
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
