"""Sampled cross-evaluation (``[federation] eval_sample = K``): parsing, the seeded draw, FA/FF/PFA
over a partial matrix, the row peer_row builds from it, and fl-sim peer runs end to end.

Bad values (and star federations) are rows of docs/reliability.md, in tests/test_bad_input.py.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from flmesh.cli.fl_sim import main
from flmesh.config import load_federation, parse_federation
from flmesh.learning.metrics import (
    federation_metrics,
    sampled_federation_accuracy,
    sampled_federation_fairness,
    sampled_federation_metrics,
)
from flmesh.reports.results import Matrix, SparseMatrix, matrix_values
from flmesh.runtime.reports import EvalResult, RoundReport, TrainStats
from flmesh.sim.peer import evaluated_columns, peer_row
from flmesh.topology.sampling import eval_columns, eval_sampled, eval_splits

from conftest import tiny_raw

NAN = math.nan

# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("value", "expected"), [(None, 0), (0, 0), (2, 2), (3, 3), (4, 4), (1024, 1024)])
def test_eval_sample_parses_and_defaults_to_exact(value, expected):
    raw = tiny_raw(nodes=4) if value is None else tiny_raw(nodes=4, federation={"eval_sample": value})
    fed = parse_federation(raw, source="f.toml")
    assert fed.eval_sample == expected
    assert eval_sampled(fed) == (0 < expected < 4)  # K >= N is the exact evaluation


def test_eval_sample_zero_is_allowed_in_a_star_federation():
    fed = parse_federation(tiny_raw(federation={"eval_sample": 0}, aggregator={"strategy": "fedavg"}),
                           source="f.toml")
    assert fed.eval_sample == 0 and fed.aggregator is not None


# ----------------------------------------------------------------------------- the draw


def test_eval_columns_hold_the_own_split_and_k_minus_1_others_reproducibly():
    n, k = 10, 4
    for round_ in (1, 2, 7):
        for index in range(n):
            cols = eval_columns(5, round_, index, n, k)
            assert index in cols and len(cols) == k and len(set(cols)) == k
            assert cols == sorted(cols) and all(0 <= c < n for c in cols)
            assert cols == eval_columns(5, round_, index, n, k)  # a function of (seed, round, index)
    draws = {tuple(eval_columns(5, r, i, n, k)) for r in range(1, 6) for i in range(n)}
    assert len(draws) > n  # rounds and nodes draw different splits
    assert eval_columns(5, 1, 0, n, k) != eval_columns(6, 1, 0, n, k) or \
        eval_columns(5, 2, 0, n, k) != eval_columns(6, 2, 0, n, k)  # the seed matters


@pytest.mark.parametrize("k", [0, 10, 11, 1024])
def test_eval_columns_are_every_split_when_exact(k):
    assert eval_columns(5, 3, 2, 10, k) == list(range(10))


def test_eval_columns_draw_only_from_the_eligible_splits():
    for round_ in range(1, 20):
        cols = eval_columns(1, round_, 0, 8, 3, eligible=[0, 1, 2, 3])
        assert 0 in cols and len(cols) == 3 and set(cols) <= {0, 1, 2, 3}
    assert eval_columns(1, 1, 0, 8, 5, eligible=[0, 1, 2]) == [0, 1, 2]  # fewer present than K


def test_the_joint_model_is_evaluated_on_every_split():
    fed = parse_federation(tiny_raw(nodes=4, federation={"eval_sample": 2}), source="f.toml")
    assert evaluated_columns(fed, 1, "joint", None) == {0, 1, 2, 3}
    assert evaluated_columns(fed, 1, "node1", None) == set(eval_splits(fed, 1, "node1"))


# ----------------------------------------------------------------------------- metrics


def test_sampled_metrics_equal_federation_metrics_when_nothing_is_missing():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5):
        acc = rng.random((n, n))
        assert sampled_federation_metrics(acc) == federation_metrics(acc)


def test_sampled_metrics_weigh_the_diagonal_as_one_nth_of_the_pairs_and_pfa_is_the_diagonal():
    acc = np.array([[0.9, NAN, 0.3],
                    [NAN, 0.8, 0.5],
                    [0.1, NAN, 0.7]])
    diag, off = [0.9, 0.8, 0.7], [0.3, 0.5, 0.1]
    mean = sum(diag) / 3 / 3 + sum(off) / 3 * 2 / 3  # the diagonal is 3 of the 9 pairs
    square = sum(d * d for d in diag) / 3 / 3 + sum(o * o for o in off) / 3 * 2 / 3
    std = math.sqrt((square - mean * mean) * 9 / 8)  # Eq. 6: N^2 - 1 in the denominator
    m = sampled_federation_metrics(acc)
    assert m.fa == pytest.approx(mean) == sampled_federation_accuracy(acc)
    assert m.ff == pytest.approx(std) == sampled_federation_fairness(acc)
    assert m.pfa == pytest.approx((0.9 + 0.8 + 0.7) / 3)


def test_sampled_fa_is_unbiased_over_every_draw_of_the_other_splits():
    """Averaged over every way of drawing one other split per model (K = 2 of N = 4), the
    estimate is the exact N x N FA; the plain mean of the evaluated pairs is not."""
    rng = np.random.default_rng(3)
    full = rng.uniform(0.0, 1.0, (4, 4))
    estimates, plain = [], []
    for picks in itertools.product(*[[j for j in range(4) if j != i] for i in range(4)]):
        acc = np.full((4, 4), NAN)
        for i, j in enumerate(picks):
            acc[i, i], acc[i, j] = full[i, i], full[i, j]
        estimates.append(sampled_federation_accuracy(acc))
        plain.append(float(np.nanmean(acc)))
    assert np.mean(estimates) == pytest.approx(federation_metrics(full).fa, abs=1e-12)
    assert abs(np.mean(plain) - federation_metrics(full).fa) > 1e-3


def test_sampled_metrics_need_the_diagonal_and_a_square_matrix():
    with pytest.raises(ValueError, match="own test split"):
        sampled_federation_metrics(np.array([[NAN, 0.5], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="square"):
        sampled_federation_metrics(np.zeros((2, 3)))
    assert sampled_federation_metrics(np.array([[0.4]])).ff == 0.0  # one pair: no spread


# ----------------------------------------------------------------------------- peer_row


def _eval(correct: tuple[int, ...], total: tuple[int, ...]) -> EvalResult:
    """An evaluation with one class and per-task counts."""
    return EvalResult(sum(correct), sum(total), 0.0, (sum(correct),), (sum(total),), correct, total)


def _report(node: str, task: int | None) -> RoundReport:
    return RoundReport(node, 1, None, None, False, None, False, 10, TrainStats(0.1, 1, 10), _eval((1,), (2,)),
                       0.1, task=task)


def test_peer_row_with_a_partial_matrix_uses_only_the_evaluated_pairs():
    """A continual federation (2 tasks, all 4 nodes present), K = 2: model i on its own split and
    split (i + 1) % 4. Task accuracy, matrix, cross accuracy and per-class use those pairs only."""
    raw = tiny_raw(nodes=4, rounds=4, federation={"eval_sample": 2},
                   tasks={"tasks": 2, "rounds_per_task": 2, "initial_clients": 4,
                          "joining_clients": 0})
    fed = parse_federation(raw, source="f.toml")
    ids = fed.node_ids
    finished = {}
    counts = {}
    for i, node in enumerate(ids):
        evals: dict[int, EvalResult] = {}
        for j in (i, (i + 1) % 4):
            counts[i, j] = ((i + j) % 5, 1 + j), (10, 10)
            evals[j] = _eval(*counts[i, j])
        finished[node] = (_report(node, 1), evals)
    row = peer_row(fed, 1, ids, finished)
    assert row.eval_sample == 2
    assert isinstance(row.accuracy_matrix, SparseMatrix), "a sampled row keeps only the evaluated pairs"
    pairs = row.accuracy_matrix.pairs
    for i in range(4):
        assert set(pairs[ids[i]]) == {ids[i], ids[(i + 1) % 4]}
        assert pairs[ids[i]][ids[i]] == pytest.approx(sum(counts[i, i][0]) / sum(counts[i, i][1]))
        assert set(row.nodes[ids[i]].cross_accuracy) == {ids[i], ids[(i + 1) % 4]}
    acc = {(i, j): sum(c) / sum(t) for (i, j), (c, t) in counts.items()}
    diag = [acc[i, i] for i in range(4)]
    off = [a for (i, j), a in acc.items() if i != j]
    mean = sum(diag) / 4 / 4 + sum(off) / 4 * 3 / 4  # the diagonal is 4 of the 16 pairs
    square = sum(d * d for d in diag) / 4 / 4 + sum(o * o for o in off) / 4 * 3 / 4
    assert row.fa == pytest.approx(mean)
    assert row.ff == pytest.approx(math.sqrt((square - mean * mean) * 16 / 15))
    assert row.pfa == pytest.approx(sum(acc[i, i] for i in range(4)) / 4)
    for k in range(2):  # per task: each model pooled over its evaluated splits, then the mean of models
        per_model = [sum(counts[i, j][0][k] for j in (i, (i + 1) % 4))
                     / sum(counts[i, j][1][k] for j in (i, (i + 1) % 4)) for i in range(4)]
        assert row.task_accuracy[k] == pytest.approx(sum(per_model) / 4)
    pooled = sum(sum(c) for c, _ in counts.values()) / sum(sum(t) for _, t in counts.values())
    assert row.per_class_accuracy == [pytest.approx(pooled, abs=1e-6)]


def test_peer_row_of_a_full_matrix_says_nothing_was_sampled():
    fed = parse_federation(tiny_raw(nodes=3), source="f.toml")
    finished = {n: (_report(n, None), {j: _eval((i + j,), (10,)) for j in range(3)})
                for i, n in enumerate(fed.node_ids)}
    row = peer_row(fed, 1, fed.node_ids, finished)
    acc = np.array([[(i + j) / 10 for j in range(3)] for i in range(3)])
    exact = federation_metrics(acc)
    assert row.eval_sample is None and (row.fa, row.ff, row.pfa) == (exact.fa, exact.ff, exact.pfa)
    assert isinstance(row.accuracy_matrix, Matrix)
    assert all(v is not None for r in row.accuracy_matrix.values for v in r)


# ----------------------------------------------------------------------------- fl-sim end to end

FOUR = """
[federation]
name = "four"
seed = 11
rounds = 2
round_timeout_s = 30
{sample}

[topology]
nodes = 4
graph = "ring"

[training]
epochs = 0.5
batch_size = 16
lr = 0.05

[data]
alpha = 0.5

[model]
hidden = [16]
"""

SAME = ("round", "fa", "ff", "pfa", "accuracy_matrix", "per_class_accuracy", "eval_sample")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    """The same 4-node federation exact, with K = 2 (twice) and with K = 4 = N."""
    root = tmp_path_factory.mktemp("eval_sample")
    out = {}
    for name, sample in (("exact", ""), ("k2", "eval_sample = 2"), ("k2-again", "eval_sample = 2"),
                         ("k4", "eval_sample = 4")):
        path = root / f"{name}.toml"
        path.write_text(FOUR.format(sample=sample))
        assert main([str(path), "--out", str(root / name), "--quiet"]) == 0
        rows = [json.loads(line) for line in (root / name / "rounds.jsonl").read_text().splitlines()]
        out[name] = (path, rows)
    return out


def test_a_sampled_run_evaluates_each_model_on_its_split_and_one_drawn_other(runs):
    path, rows = runs["k2"]
    fed = load_federation(path)
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["eval_sample"] == 2
        matrix = row["accuracy_matrix"]
        assert matrix["rows"] == matrix["cols"] == fed.node_ids
        assert "values" not in matrix and sum(len(p) for p in matrix["pairs"].values()) == 4 * 2
        values = matrix_values(matrix)
        diag, off = [], []
        for i, node in enumerate(matrix["rows"]):
            evaluated = [j for j, v in enumerate(values[i]) if v is not None]
            assert i in evaluated and len(evaluated) == 2
            assert evaluated == eval_splits(fed, row["round"], node)  # the seeded draw, nothing else
            assert set(row["nodes"][node]["cross_accuracy"]) == {fed.node_ids[j] for j in evaluated}
            assert row["nodes"][node]["accuracy"] == pytest.approx(values[i][i], abs=1e-6)
            diag.append(values[i][i])
            off += [values[i][j] for j in evaluated if j != i]
        assert row["fa"] == pytest.approx(np.mean(diag) / 4 + np.mean(off) * 3 / 4, abs=1e-6)
        full = np.array([[np.nan if v is None else v for v in r] for r in values])
        assert row["ff"] == pytest.approx(sampled_federation_fairness(full), abs=1e-6)
        assert row["pfa"] == pytest.approx(np.mean([values[i][i] for i in range(4)]), abs=1e-6)


def test_a_sampled_run_is_reproducible(runs):
    (_, a), (_, b) = runs["k2"], runs["k2-again"]
    assert [[r[k] for k in SAME] for r in a] == [[r[k] for k in SAME] for r in b]
    assert [{n: e["cross_accuracy"] for n, e in r["nodes"].items()} for r in a] == \
        [{n: e["cross_accuracy"] for n, e in r["nodes"].items()} for r in b]


def test_eval_sample_of_n_or_more_gives_the_exact_numbers(runs):
    (_, exact), (_, full) = runs["exact"], runs["k4"]
    assert [[r[k] for k in SAME] for r in exact] == [[r[k] for k in SAME] for r in full]
    assert all(r["eval_sample"] is None for r in full)
    assert all(v is not None for r in full for row in r["accuracy_matrix"]["values"] for v in row)
