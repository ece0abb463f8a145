"""The learner protocol: a user's loop, loss, optimizer and metrics, within flmesh's step budget.

A learner that only adds a metric trains exactly as the default does; a learner's own loss
changes the numbers; its metrics reach rounds.jsonl, the summary's rows and FA when the file
names one; the optimizer may come from an import path; and every way a learner can be wrong
is one line before any training."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping

import pytest
import torch
from torch import nn

import flmesh
from flmesh.config import FederationError, TrainingConfig, parse_federation
from flmesh.learning.learner import LearnerError
from flmesh.learning.task import Task
from flmesh.learning.trainer import TrainingStopped, train
from flmesh.sim.simulation import Simulation
from flmesh.testing import run
from flmesh.user_code import UserCodeError

from conftest import tiny_raw

Batch = tuple[torch.Tensor, torch.Tensor]


class MacroRecall(flmesh.Learner):
    """The default loop, and the mean per-class recall as an extra metric."""

    def evaluate(self, model: nn.Module, batches: Iterable[Batch],
                 context: flmesh.EvalContext) -> Mapping[str, float]:
        hits = torch.zeros(context.num_classes)
        seen = torch.zeros(context.num_classes)
        for x, y in batches:
            right = model(x).argmax(1) == y
            hits += torch.bincount(y[right], minlength=context.num_classes)
            seen += torch.bincount(y, minlength=context.num_classes)
        present = seen > 0
        return {"macro_recall": float((hits[present] / seen[present]).mean())}


class Smoothed(MacroRecall):
    """Its own loss (label smoothing), the algorithm's extra terms added, and a train metric."""

    def train(self, model: nn.Module, batches: Iterable[Batch],
              context: flmesh.TrainContext) -> Mapping[str, float]:
        losses = []
        for x, y in batches:
            context.optimizer.zero_grad()
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y, label_smoothing=0.2)
            loss = loss + context.extra_loss(model, x, logits)
            loss.backward()
            context.optimizer.step()
            losses.append(float(loss.detach()))
        return {"loss": sum(losses) / len(losses), "batches": len(losses)}


def fed(rounds: int = 2, star: bool = False, **training):
    raw = tiny_raw(rounds=rounds, **({"aggregator": {"strategy": "fedavg"}} if star else {}))
    raw.setdefault("training", {}).update(training)
    return parse_federation(raw, source="tiny.toml")


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_learner_that_only_adds_a_metric_trains_as_the_default_does():
    plain = run(fed())
    measured = run(fed(), task=Task.of(fed(), learner=MacroRecall()))
    assert plain.keys() == measured.keys()
    assert all(states_equal(plain[n], measured[n]) for n in plain)


def test_an_own_loss_changes_the_models():
    plain = run(fed())
    smoothed = run(fed(), task=Task.of(fed(), learner=Smoothed()))
    assert not all(states_equal(plain[n], smoothed[n]) for n in plain)


@pytest.mark.parametrize("star", [False, True])
def test_metrics_reach_the_rows_and_fa_is_over_the_named_one(tmp_path, star):
    federation = fed(rounds=2, star=star)
    with Simulation(federation, tmp_path / "acc", learner=Smoothed()) as sim:
        by_accuracy = sim.run()
    named = parse_federation({**federation.raw, "federation": {**federation.raw["federation"],
                                                               "metric": "macro_recall"}}, source="tiny.toml")
    with Simulation(named, tmp_path / "recall", learner=Smoothed()) as sim:
        by_recall = sim.run()
    rows = [json.loads(line) for line in (tmp_path / "recall" / "rounds.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["metric"] == "macro_recall"
    for entry in last["nodes"].values():
        if entry.get("accuracy") is None:
            continue  # a star node the last round did not sample
        assert 0.0 <= entry["metrics"]["macro_recall"] <= 1.0
        if not star:
            assert entry["metrics"]["train_batches"] >= 1
    if not star:  # the summary carries each node's last metrics
        assert set(by_recall.final.node_metrics) == set(federation.node_ids)
        assert all("macro_recall" in m for m in by_recall.final.node_metrics.values())
    # the same models either way: only what FA averages differs
    assert by_accuracy.final.accuracy == by_recall.final.accuracy
    assert by_accuracy.final.fa != by_recall.final.fa
    assert 0.0 <= by_recall.final.fa <= 1.0


def test_the_step_budget_is_flmeshs():
    model = nn.Linear(4, 3)
    data = flmesh.ArrayData(torch.randn(50, 4), torch.arange(50) % 3, 3)
    cfg = TrainingConfig(batch_size=8, lr=0.1)
    stats = train(model, data, cfg, steps=11, learner=Smoothed())
    # one pass of 7 batches (the last holds 2 samples), then 4 of the next pass
    assert (stats.steps, stats.samples, dict(stats.metrics)) == (11, 50 + 4 * 8, {"batches": 11.0})
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(TrainingStopped):
        train(model, data, cfg, steps=11, learner=Smoothed(), stop=stop)


def test_an_optimizer_from_an_import_path():
    sgd = run(fed())
    same = run(fed(optimizer="torch.optim:SGD"))  # lr and weight_decay as "sgd" gets them
    assert all(states_equal(sgd[n], same[n]) for n in sgd)
    other = run(fed(optimizer="torch.optim:Adagrad"))
    assert not all(states_equal(sgd[n], other[n]) for n in sgd)


LEARNERS = "flmesh_test_learners"
SOURCE = '''
import sys

import torch
from flmesh import Learner


class NoMapping(Learner):
    def evaluate(self, model, batches, context):
        return 0.5


class BadValue(Learner):
    def train(self, model, batches, context):
        super().train(model, batches, context)
        return {"loss": "low"}


class Raises(Learner):
    def evaluate(self, model, batches, context):
        raise RuntimeError("no GPU here")


class NotALearner:
    pass


class QuitsAtOnce(Learner):
    def __init__(self):
        sys.exit(0)


class QuitsInTheCheck(Learner):
    def evaluate(self, model, batches, context):
        raise SystemExit


class QuitsMidRun(Learner):
    def train(self, model, batches, context):
        if context.steps > 1:  # not in the one-batch check before round 1
            sys.exit(0)
        return super().train(model, batches, context)


class Diverges(Learner):
    def train(self, model, batches, context):
        out = super().train(model, batches, context)
        if context.steps > 1:
            with torch.no_grad():
                next(model.parameters())[0, 0] = float("nan")
        return out


def make_sgd(params, lr, weight_decay):
    return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)


def not_an_optimizer(params, lr, weight_decay):
    return "sgd"
'''


@pytest.fixture
def learners(tmp_path, monkeypatch):
    (tmp_path / f"{LEARNERS}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield LEARNERS
    sys.modules.pop(LEARNERS, None)


@pytest.mark.parametrize(("training", "error", "expected"), [
    ({"learner": "no_such_module:L"}, LearnerError, "no module named 'no_such_module'"),
    ({"learner": f"{LEARNERS}:Missing"}, LearnerError, "has no attribute 'Missing'"),
    ({"learner": f"{LEARNERS}:NotALearner"}, LearnerError, "no train(model, batches, context) method"),
    ({"learner": f"{LEARNERS}:NoMapping"}, LearnerError, "NoMapping.evaluate returned a float"),
    ({"learner": f"{LEARNERS}:BadValue"}, LearnerError, "returned loss = 'low', not a number"),
    ({"learner": f"{LEARNERS}:Raises"}, LearnerError, "raised RuntimeError: no GPU here"),
    ({"learner": f"{LEARNERS}:QuitsAtOnce"}, LearnerError, "calling it raised SystemExit: 0"),
    ({"learner": f"{LEARNERS}:QuitsInTheCheck"}, LearnerError, "a check on one batch raised SystemExit"),
    ({"optimizer": f"{LEARNERS}:not_an_optimizer"}, UserCodeError, "returned a str, not a torch.optim"),
])
def test_a_bad_learner_or_optimizer_is_one_line_before_training(learners, training, error, expected):
    with pytest.raises(error) as exc:
        run(fed(**training))
    message = str(exc.value)
    assert "\n" not in message and message.startswith("tiny.toml: ") and expected in message


MID_RUN = {
    "QuitsMidRun": rf"user code raised SystemExit: 0 at .*{LEARNERS}\.py:\d+ \(in train\)",
    "Diverges": r"node\d: round 1: the model holds NaN or infinity in its trained weights "
                r"\(tensor '[\w.]+'\); every peer refuses such a model",
}


@pytest.mark.parametrize("star", [False, True], ids=["peer", "star"])
@pytest.mark.parametrize("learner", MID_RUN)
def test_a_learner_that_exits_or_diverges_mid_run_ends_fl_sim_with_exit_1_in_one_line(
        tmp_path, capsys, learners, learner, star):
    """sys.exit(0) in train, or NaN weights after it: not exit 0 with nothing said, not a model every
    peer refuses sent round after round."""
    from flmesh.cli import fl_sim

    fed = tmp_path / "f.toml"
    fed.write_text('[federation]\nname = "f"\nrounds = 2\n[topology]\nnodes = 3\n[model]\nhidden = [8]\n'
                   f'[training]\nlearner = "{LEARNERS}:{learner}"\n'
                   + ('[aggregator]\nstrategy = "fedavg"\nfraction = 1.0\n' if star else ""))
    assert fl_sim.main([str(fed), "--out", str(tmp_path / "out"), "--quiet", "--no-pictures"]) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("fl-sim: error: ")]
    assert len(said) == 1 and "Traceback" not in err, err
    out = re.escape(str(tmp_path / "out"))
    assert re.fullmatch(rf"fl-sim: error: {MID_RUN[learner]}; results so far in {out}", said[0]), said[0]


@pytest.mark.parametrize("learner", MID_RUN)
def test_a_learner_that_exits_or_diverges_mid_run_ends_fl_node_with_exit_1_in_one_line(
        tmp_path, capsys, learners, learner):
    from flmesh.cli.node import main as node_main

    from procs import federation_file

    fed = federation_file(tmp_path, ["node0", "node1"], rounds=2)
    assert node_main(["--id", "node0", "--federation", str(fed), "--listen", "127.0.0.1:0", "--insecure",
                      "--out", str(tmp_path / "out"), "--set", 'federation.baseline="standalone"',
                      "--set", f'training.learner="{LEARNERS}:{learner}"']) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "error:" in line]
    assert len(said) == 1 and "Traceback" not in err, err
    assert re.fullmatch(rf"fl-node node0: error: {MID_RUN[learner]}", said[0]), said[0]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] and re.fullmatch(MID_RUN[learner], summary["error"])


def test_an_optimizer_callable_from_the_file_works(learners):
    sgd = run(fed())
    made = run(fed(optimizer=f"{LEARNERS}:make_sgd"))
    assert all(states_equal(sgd[n], made[n]) for n in sgd)


def test_a_metric_the_learner_does_not_return_is_refused(learners):
    raw = tiny_raw(rounds=1)
    raw["federation"]["metric"] = "f1"
    raw["training"] = {"learner": "flmesh.learning.learner:Learner"}
    with pytest.raises(LearnerError, match=r"\[federation\] metric = 'f1', but Learner.evaluate returns no"):
        run(parse_federation(raw, source="tiny.toml"))


@pytest.mark.parametrize(("section", "key", "value", "expected"), [
    ("training", "optimizer", "rmsprop", "'sgd', 'adam', or an import path"),
    ("training", "learner", "not a path", "one of .default., or an import path package.module:name"),
    ("federation", "metric", "macro-f1", "'accuracy' or the name of a metric"),
])
def test_the_file_keys_are_checked(section, key, value, expected):
    raw = tiny_raw(rounds=1)
    raw.setdefault(section, {})[key] = value
    with pytest.raises(FederationError, match=expected):
        parse_federation(raw, source="tiny.toml")


def test_rewind_with_an_optimizer_from_user_code_is_refused():
    raw = tiny_raw(rounds=1)
    raw["training"] = {"optimizer": "torch.optim:AdamW"}
    raw["rewind"] = {"mode": "previous"}
    with pytest.raises(FederationError, match=r"\[training\] optimizer: \[rewind\] carries the optimizer"):
        parse_federation(raw, source="tiny.toml")
