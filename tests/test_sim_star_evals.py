"""fl-sim's star driver with workers takes the updates' evaluations from the workers' reports
(coordinator/sim_star_procs.py); what it does when some do not come."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from flmesh.coordinator.aggregator_core import RoundOutcome
from flmesh.coordinator.sim_star_procs import ProcessStarDriver
from flmesh.coordinator.sim_tls import SimIdentities
from flmesh.node.algorithms.base import Update
from flmesh.node.reports import EvalResult
from flmesh.topology import parse_federation

from conftest import tiny_raw, wait_until


def _result(correct: int) -> EvalResult:
    return EvalResult(correct, 10, 0.5, (correct,), (10,), (), ())


def _driver(round_timeout_s: float) -> tuple[ProcessStarDriver, list[str]]:
    fed = parse_federation(tiny_raw(nodes=2, rounds=2, federation={"round_timeout_s": round_timeout_s},
                                    aggregator={"fraction": 1.0}), source="s.toml")
    driver = ProcessStarDriver(fed, 2, SimIdentities((), enabled=False))
    evaluated: list[str] = []

    def evaluate(state, task):  # what fl-sim's own evaluator would do: recorded, and a result
        evaluated.append(state["who"])
        return {"node0": _result(1), "node1": _result(1)}

    driver.aggregator = SimpleNamespace(evaluate=evaluate, stop=lambda: None)  # type: ignore[assignment]
    return driver, evaluated


def _outcome(*nodes: str) -> RoundOutcome:
    updates = [Update(n, 1, {"who": n}, 10, (10,)) for n in nodes]  # type: ignore[dict-item]
    return RoundOutcome(1, list(nodes), list(nodes), [], True, updates, {}, {})


def test_an_update_whose_evaluations_do_not_come_is_evaluated_by_fl_sim():
    driver, evaluated = _driver(round_timeout_s=0.5)
    from_worker = {"node0": _result(7), "node1": _result(8)}
    driver._update_evals[1] = {"node0": from_worker}
    got = driver._evaluated_by_workers(_outcome("node0", "node1"), None)
    assert got["node0"] == from_worker, "taken from the worker's report"
    assert evaluated == ["node1"] and got["node1"]["node0"] == _result(1), "evaluated here after the wait"
    assert 1 not in driver._update_evals


def test_a_stop_ends_the_wait_for_the_workers_evaluations():
    driver, evaluated = _driver(round_timeout_s=600)
    done: list[dict] = []
    def wait() -> None:
        done.append(driver._evaluated_by_workers(_outcome("node0"), None))

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    wait_until(lambda: len(driver._evals_in._waiters) == 1)  # type: ignore[attr-defined]  # in its wait
    driver.stop()
    waiting.join(10)
    assert not waiting.is_alive() and evaluated == ["node0"] and len(done) == 1
