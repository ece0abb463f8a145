"""fl-sim's compute gate (trainer.serialize_compute): one thread of a process computes at a time,
and the numbers are those of an ungated run."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from flmesh.config import TrainingConfig
from flmesh.learning import trainer
from flmesh.learning.data import ArrayData


@pytest.fixture
def gate() -> Iterator[None]:
    trainer.serialize_compute()
    yield
    trainer.serialize_compute(False)


def _data(seed: int = 0) -> ArrayData:
    gen = torch.Generator().manual_seed(seed)
    return ArrayData(torch.randn(64, 1, 2, 2, generator=gen), torch.randint(0, 3, (64,), generator=gen), 3)


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def _taken_elsewhere() -> bool:
    """Whether another thread finds the gate taken (it tries without waiting)."""
    got: list[bool] = []

    def attempt() -> None:
        with trainer.compute(blocking=False) as granted:
            got.append(granted)

    probe = threading.Thread(target=attempt)
    probe.start()
    probe.join()
    return not got[0]


def test_a_training_step_holds_the_gate_and_releases_it_after(gate):
    seen: list[bool] = []

    def regularizer(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        seen.append(_taken_elsewhere())  # inside a step: no other thread may compute now
        return logits.sum() * 0

    cfg = TrainingConfig(epochs=1, batch_size=16, lr=0.1)
    stats = trainer.train(_model(), _data(), cfg, seed=3, regularizers=[regularizer])
    assert stats.steps == 4 and seen == [True] * 4
    assert not _taken_elsewhere(), "the gate is free once training returned"


def test_an_evaluation_inside_the_gate_reenters_and_other_threads_wait(gate):
    with trainer.compute():
        result = trainer.evaluate(_model(), _data())  # the same thread: reentrant, no deadlock
        assert _taken_elsewhere()
    assert result.total == 64 and not _taken_elsewhere()


def test_the_gate_changes_no_number():
    cfg = TrainingConfig(epochs=2, batch_size=16, lr=0.1, optimizer="sgd", momentum=0.9)
    states = []
    for on in (False, True):
        trainer.serialize_compute(on)
        try:
            model = _model()
            trainer.train(model, _data(), cfg, seed=5)
            states.append({k: v.clone() for k, v in model.state_dict().items()})
        finally:
            trainer.serialize_compute(False)
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_without_the_gate_compute_is_a_no_op():
    trainer.serialize_compute(False)
    with trainer.compute() as granted:
        assert granted and not _taken_elsewhere()


def test_a_process_hosting_several_nodes_gates_compute_and_one_hosting_one_does_not():
    threads = torch.get_num_threads()
    try:
        trainer.host_nodes(1)
        with trainer.compute():
            assert not _taken_elsewhere() and torch.get_num_threads() == threads
        trainer.host_nodes(3)
        with trainer.compute():
            assert _taken_elsewhere() and torch.get_num_threads() == 1
    finally:
        trainer.serialize_compute(False)
        torch.set_num_threads(threads)
