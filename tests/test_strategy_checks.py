"""A strategy from outside flmesh is tried before round 1, and what any strategy returns is
checked every round: a mistake is one line naming the strategy, never a traceback mid-run."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf
from flmesh.algorithms.checks import StrategyError, checked_global, try_strategy
from flmesh.algorithms.fedavg import fedavg
from flmesh.config.parser import parse_federation
from flmesh.testing import run

from conftest import tiny_raw

FL_SIM = str(Path(sys.executable).with_name("fl-sim"))


class _Half(ServerHalf):
    def __init__(self, aggregate):
        self._aggregate = aggregate

    def aggregate(self, round, global_state, updates):
        return self._aggregate(round, global_state, updates)


def _mean(updates):
    return fedavg([u.state for u in updates], [u.num_samples for u in updates])


def _strategy(name: str, aggregate) -> type[Algorithm]:
    return type(name, (Algorithm,), {"name": name.lower(), "kind": "strategy",
                                     "server": lambda self, ctx: _Half(aggregate)})


# what users write by mistake, each named by its import path in the tests below
Values = _strategy("Values", lambda r, g, us: _mean(us).values())
Reshaped = _strategy("Reshaped", lambda r, g, us: {k: v.reshape(-1) for k, v in _mean(us).items()})
Partial = _strategy("Partial", lambda r, g, us: dict(list(_mean(us).items())[1:]))
Raises = _strategy("Raises", lambda r, g, us: 1 // 0)
NaNLater = _strategy("NaNLater", lambda r, g, us: _mean(us) if r < 2
                     else {k: torch.full_like(v, math.nan) for k, v in _mean(us).items()})
Doubles = _strategy("Doubles", lambda r, g, us: {k: v.double() if v.is_floating_point() else v
                                                 for k, v in _mean(us).items()})
Mean = _strategy("Mean", lambda r, g, us: _mean(us))


def star(strategy: str, rounds: int = 2):
    return parse_federation(tiny_raw(nodes=3, rounds=rounds,
                                     aggregator={"strategy": f"test_strategy_checks:{strategy}",
                                                 "fraction": 1.0}), source="star.toml")


@pytest.mark.parametrize(("strategy", "said"), [
    ("Values", r"returned a dict_values, not a mapping of tensor names to tensors"),
    ("Reshaped", r"returned '[\w.]+' of shape \(\d+,\); the global model's is \(\d+, \d+\)"),
    ("Partial", r"returned a model without '[\w.]+' \(the global model's tensors are"),
    ("Raises", r"raised ZeroDivisionError before round 1, aggregating two copies of the initial model"),
])
def test_a_broken_strategy_is_refused_before_round_1_in_one_line(strategy, said):
    with pytest.raises(StrategyError, match=r"^star\.toml: \[aggregator\] strategy: .*" + said) as caught:
        run(star(strategy))
    assert "\n" not in str(caught.value)


FILE = ('[federation]\nname = "s"\nrounds = {rounds}\n[topology]\nnodes = 3\n[data]\ndataset = "digits"\n'
        '[model]\nname = "mlp"\nhidden = [8]\n[training]\nepochs = 0.2\n'
        '[aggregator]\nstrategy = "test_strategy_checks:{strategy}"\nfraction = 1.0\n')


def fl_sim(tmp_path, strategy: str, rounds: int) -> subprocess.CompletedProcess[str]:
    """fl-sim as a user runs it, with this module importable (it holds the strategies)."""
    fed = tmp_path / "star.toml"
    fed.write_text(FILE.format(rounds=rounds, strategy=strategy))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    return subprocess.run([FL_SIM, str(fed), "--out", str(tmp_path / "out"), "--quiet", "--no-pictures"],
                          capture_output=True, text=True, env=env, timeout=300)


def test_fl_sim_says_it_in_one_line_and_exits_2(tmp_path):
    done = fl_sim(tmp_path, "Values", rounds=2)
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "dict_values" in err[0] and "star.toml" in err[0], err


def test_a_strategy_that_goes_wrong_later_stops_the_run_in_one_line(tmp_path):
    with pytest.raises(StrategyError, match=r"^strategy 'test_strategy_checks:NaNLater'.aggregate returned "
                                            r"non-finite values in '[\w.]+'$"):
        run(star("NaNLater", rounds=3))
    done = fl_sim(tmp_path, "NaNLater", rounds=3)
    assert done.returncode == 1
    assert "non-finite values" in done.stderr and "results so far" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_good_strategy_runs_as_the_built_in_and_another_float_dtype_is_cast():
    want = run(parse_federation(tiny_raw(nodes=3, rounds=2,
                                         aggregator={"strategy": "fedavg", "fraction": 1.0})))
    for strategy in ("Mean", "Doubles"):
        got = run(star(strategy))
        assert got.keys() == want.keys()
        for node, state in want.items():
            for key, tensor in state.items():
                same = got[node][key].dtype == tensor.dtype and torch.equal(got[node][key], tensor)
                assert same, (strategy, key)


def test_the_check_leaves_the_random_state_and_the_strategy_alone():
    drawn = []

    def aggregate(r, g, us):
        drawn.append(torch.rand(1))
        return _mean(us)

    plugin = _strategy("Draws", aggregate)()
    initial = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    ctx = ServerContext(star("Mean"), lambda: torch.nn.Linear(3, 2), {}, 3, None, torch.device("cpu"))
    before = torch.get_rng_state()
    try_strategy(plugin, ctx, initial, 3, "f.toml: [aggregator] strategy")
    assert drawn, "the check ran aggregate"
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(initial["w"], torch.ones(2, 3)), "the initial model is not touched"


def test_checked_global_refuses_what_is_not_the_model():
    start = {"w": torch.zeros(2, 2), "n": torch.zeros((), dtype=torch.int64)}
    with pytest.raises(StrategyError, match=r"returned a list for 'w', not a tensor"):
        checked_global({"w": [0, 0], "n": start["n"]}, start, "strategy 's'")
    with pytest.raises(StrategyError, match=r"'n' as torch.float32; the global model's is torch.int64"):
        checked_global({"w": start["w"], "n": torch.zeros(())}, start, "strategy 's'")
    with pytest.raises(StrategyError, match=r"with unknown 'x'"):
        checked_global({**start, "x": torch.zeros(1)}, start, "strategy 's'")
    assert list(checked_global({"n": start["n"], "w": start["w"]}, start, "s")) == ["w", "n"]
