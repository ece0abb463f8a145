"""The algorithms as pure functions, against numbers computed by hand.

FedAvg, Flashback (alpha, pi/gamma bookkeeping, dKD losses, distillation),
WSM, FedCurv (Fisher diagonal, penalty, u/v aggregates) and the forgetting and
rounds-to-target metrics.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from flmesh.algorithms import fedcurv_terms, flashback, wsm
from flmesh.algorithms.fedavg import fedavg
from flmesh.config import TrainingConfig
from flmesh.learning import distillation, forgetting
from flmesh.learning import fisher as fisher_mod
from flmesh.learning.arrays import ArrayData
from flmesh.learning.models import MLP
from flmesh.learning.objectives import cross_entropy
from flmesh.learning.trainer import train


def _t(*values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


# ------------------------------------------------------------------------ FedAvg

def test_fedavg_weights_by_sample_count_and_keeps_dtypes():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(1), "h": torch.tensor([0.5], dtype=torch.float16)}
    b = {"w": torch.tensor([5.0, 6.0]), "n": torch.tensor(4), "h": torch.tensor([1.5], dtype=torch.float16)}
    out = fedavg([a, b], [1, 3])
    # (1 * [1, 2] + 3 * [5, 6]) / 4 = [4, 5]; n: (1 + 12) / 4 = 3.25 -> 3; h: (0.5 + 4.5) / 4 = 1.25
    assert torch.equal(out["w"], torch.tensor([4.0, 5.0]))
    assert out["w"].dtype == torch.float32
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 3
    assert out["h"].dtype == torch.float16 and float(out["h"]) == 1.25
    assert list(out) == ["w", "n", "h"]
    # one state, or equal states, come back unchanged
    assert torch.equal(fedavg([a], [7])["w"], a["w"])
    # zero weight drops a state
    assert torch.equal(fedavg([a, b], [0, 2])["w"], b["w"])


def test_fedavg_is_exact_in_float64_then_cast():
    a = {"w": torch.tensor([0.1], dtype=torch.float32)}
    b = {"w": torch.tensor([0.2], dtype=torch.float32)}
    expected = ((0.1 * 2 + 0.2 * 5) / 7)
    got = fedavg([{"w": a["w"].double()}, {"w": b["w"].double()}], [2, 5])["w"]
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(float(a["w"].double()) * 2 / 7 + float(b["w"].double()) * 5 / 7,
                                       rel=1e-15)
    assert float(fedavg([a, b], [2, 5])["w"]) == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize("states, weights, match", [
    ([], [], "at least one state"),
    ([{"w": torch.zeros(2)}], [1, 2], "1 states but 2 weights"),
    ([{"w": torch.zeros(2)}, {"w": torch.zeros(2)}], [0, 0], "total weight must be positive"),
    ([{"w": torch.zeros(2)}, {"w": torch.zeros(2)}], [-1, 2], "weight of state 0"),
    ([{"w": torch.zeros(2)}], [math.nan], "finite"),
    ([{"w": torch.zeros(2)}, {"v": torch.zeros(2)}], [1, 1], "state 1 has different keys"),
    ([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}], [1, 1], r"'w' of shape \(3,\)"),
    ([{"w": torch.zeros(2)}, {"w": torch.zeros(2, dtype=torch.float64)}], [1, 1], "dtype"),
])
def test_fedavg_rejects_bad_input(states, weights, match):
    with pytest.raises(ValueError, match=match):
        fedavg(states, weights)


# --------------------------------------------------------------- Flashback alpha

def test_alpha_matrix_by_hand_with_a_class_nobody_holds():
    counts = torch.tensor([[2.0, 0, 0], [1, 3, 0]])
    alpha = flashback.alpha_matrix(counts, torch.tensor([1.0, 1, 0]))
    # denominators nu + sum_k mu_k = [4, 4, 0]; class 2 is 0/0 -> 0
    assert torch.equal(alpha, torch.tensor([[0.5, 0, 0], [0.25, 0.75, 0]]))
    assert alpha.dtype == torch.float32
    # a scalar nu is broadcast to every class
    assert torch.allclose(flashback.alpha_matrix(counts, 1.0), torch.tensor([[0.5, 0, 0], [0.25, 0.75, 0]]))
    with pytest.raises(ValueError, match="non-negative"):
        flashback.alpha_matrix(torch.tensor([[-1.0, 0]]), 0.0)
    with pytest.raises(ValueError, match="nu has 3 classes"):
        flashback.alpha_matrix(torch.ones(1, 2), torch.ones(3))


def test_client_alpha_uses_own_counts_as_nu_and_pi_as_teacher():
    alpha = flashback.client_alpha(torch.tensor([3, 1, 0]), torch.tensor([1.0, 3, 0]))
    assert torch.equal(alpha, torch.tensor([0.25, 0.75, 0.0]))  # pi / (own + pi), 0/0 -> 0
    assert torch.equal(flashback.client_alpha(torch.tensor([3, 1, 0]), torch.zeros(3)), torch.zeros(3))


def test_server_alphas_teachers_are_clients_then_previous_global():
    mu = torch.tensor([[2.0, 0, 0], [1, 3, 0]])
    # round 1: no previous-global teacher, nu = 0: denominators [3, 3, 0]
    first = flashback.server_alphas(mu, None)
    assert torch.allclose(first, torch.tensor([[2 / 3, 0, 0], [1 / 3, 1, 0]]))
    # round t > 1: nu = pi = [1, 1, 0] and w_{t-1} is a teacher with mu = pi: denominators [5, 5, 0]
    later = flashback.server_alphas(mu, torch.tensor([1.0, 1, 0]))
    assert torch.allclose(later, torch.tensor([[0.4, 0, 0], [0.2, 0.6, 0], [0.2, 0.2, 0]]))


def test_global_count_bookkeeping_with_gamma():
    state = flashback.FlashbackState.start(2, gamma=0.5)
    assert state.teacher_counts() is None
    # round 1: a and b, r = 1 each, 0.5 * 1 <= 1: pi = 0.5*[2,0] + 0.5*[0,4] = [1, 2]
    state = flashback.advance(state, ["a", "b"], torch.tensor([[2.0, 0], [0, 4]]))
    assert torch.equal(state.pi, _t(1, 2)) and state.rounds == 1
    assert torch.equal(state.teacher_counts(), _t(1, 2))
    # round 2: a (r = 2, 0.5 * 2 = 1 <= 1: still counts) and c (r = 1): + [1, 0] + [0.5, 0.5]
    state = flashback.advance(state, ["a", "c"], torch.tensor([[2.0, 0], [1, 1]]))
    assert torch.equal(state.pi, _t(2.5, 2.5))
    # round 3: a (r = 3, 1.5 > 1: no more) and b (r = 2): + [0, 2]
    state = flashback.advance(state, ["a", "b"], torch.tensor([[2.0, 0], [0, 4]]))
    assert torch.equal(state.pi, _t(2.5, 4.5))
    assert dict(state.participations) == {"a": 3, "b": 2, "c": 1}
    # the pure function directly; gamma = 0.1 admits r = 10 despite float rounding
    pi = flashback.update_global_counts(torch.zeros(2), torch.tensor([[10.0, 0], [0, 10]]), 0.1, [10, 11])
    assert torch.allclose(pi, _t(1, 0))
    with pytest.raises(ValueError, match="gamma"):
        flashback.update_global_counts(torch.zeros(2), torch.ones(1, 2), 0.0, [1])
    with pytest.raises(ValueError, match="distinct"):
        flashback.advance(state, ["a", "a"], torch.ones(2, 2))


# --------------------------------------------------------------- Flashback losses

def test_dkd_with_unit_alpha_is_plain_kl_teacher_to_student():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    expected = F.kl_div(F.log_softmax(student, 1), F.log_softmax(teacher, 1), reduction="batchmean",
                        log_target=True)
    assert torch.allclose(distillation.dkd_loss(student, teacher, torch.ones(4)), expected, atol=1e-6)
    assert float(distillation.dkd_loss(student, teacher, torch.zeros(4))) == 0.0


def test_dkd_weights_each_class_term_and_may_be_negative():
    # p = [0.5, 0.5], q = [0.9, 0.1]: class terms 0.5 ln(5/9) = -0.293893, 0.5 ln 5 = 0.804719
    student = torch.log(torch.tensor([[0.9, 0.1]]))
    teacher = torch.log(torch.tensor([[0.5, 0.5]]))
    assert float(distillation.dkd_loss(student, teacher, torch.tensor([1.0, 0.0]))) == pytest.approx(
        0.5 * math.log(5 / 9), abs=1e-6)
    assert float(distillation.dkd_loss(student, teacher, torch.tensor([0.5, 0.25]))) == pytest.approx(
        0.25 * math.log(5 / 9) + 0.125 * math.log(5), abs=1e-6)


def test_flashback_server_loss_adds_ce_and_every_teacher_term():
    g = torch.Generator().manual_seed(1)
    s, t1, t2 = (torch.randn(6, 3, generator=g) for _ in range(3))
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    a = torch.tensor([[0.2, 0.5, 0.0], [0.4, 0.1, 1.0]])
    ce = F.cross_entropy(s, y)
    server = distillation.multi_teacher_dkd_loss(s, [t1, t2], a, y)
    terms = distillation.dkd_loss(s, t1, a[0]) + distillation.dkd_loss(s, t2, a[1])
    assert torch.allclose(server, ce + terms)
    assert torch.equal(distillation.multi_teacher_dkd_loss(s, [], torch.zeros(0, 3), y), ce)
    with pytest.raises(ValueError, match="one row per teacher"):
        distillation.multi_teacher_dkd_loss(s, [t1], a, y)


def _blobs(n: int, num_classes: int = 3, dim: int = 4, seed: int = 0) -> ArrayData:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % num_classes
    x = torch.randn(n, dim, generator=g) + 2 * F.one_hot(y, dim).float()
    return ArrayData(x, y, num_classes)


def test_distill_follows_the_trainer_loop_and_leaves_teachers_alone():
    public = _blobs(40)
    cfg = TrainingConfig(epochs=1, batch_size=16, lr=0.1)
    torch.manual_seed(0)
    student = MLP((4,), 3, hidden=(8,))
    teachers = [MLP((4,), 3, hidden=(8,)) for _ in range(2)]
    before = [{k: v.clone() for k, v in t.state_dict().items()} for t in teachers]
    init = {k: v.clone() for k, v in student.state_dict().items()}
    twin = MLP((4,), 3, hidden=(8,))
    twin.load_state_dict(init)
    # with zero alphas the KL terms vanish: exactly the trainer with CE, same seed
    stats = distillation.distill(student, teachers, torch.zeros(2, 3), public, 1.5, cfg, seed=5)
    ref = train(twin, public, cfg, epochs=1.5, seed=5)
    # round(1.5 * 3 batches) = 4 steps: 16 + 16 + 8, then 16 samples
    assert (stats.steps, stats.samples) == (ref.steps, ref.samples) == (4, 56)
    assert stats.loss == pytest.approx(ref.loss)
    for p, q in zip(student.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p, q)
    for t, b in zip(teachers, before, strict=True):
        assert all(torch.equal(t.state_dict()[k], b[k]) for k in b)
        assert not t.training
    # non-zero alphas pull the student towards the teachers and change the result
    again = MLP((4,), 3, hidden=(8,))
    again.load_state_dict(init)
    distillation.distill(again, teachers, torch.ones(2, 3), public, 1.5, cfg, seed=5)
    assert not torch.allclose(again.net[1].weight, twin.net[1].weight)


# --------------------------------------------------------------------------- WSM

def test_wsm_equals_ce_when_all_proportions_are_equal():
    g = torch.Generator().manual_seed(2)
    logits, y = torch.randn(7, 5, generator=g), torch.randint(0, 5, (7,), generator=g)
    for props in (torch.full((5,), 0.2), torch.full((5,), 30.0)):
        assert torch.allclose(wsm.wsm_loss(logits, y, props), F.cross_entropy(logits, y))
    assert torch.allclose(wsm.WsmClient([1] * 5).objective(cross_entropy)(logits, y),
                          F.cross_entropy(logits, y))


def test_wsm_by_hand_and_absent_classes_have_no_effect():
    # logits 0, alpha = [0.25, 0.75, 0], label 0: CE on log alpha = -log 0.25 = ln 4
    props = torch.tensor([0.25, 0.75, 0.0])
    loss = wsm.wsm_loss(torch.zeros(1, 3), torch.tensor([0]), props)
    assert float(loss) == pytest.approx(math.log(4), abs=1e-6)
    objective = wsm.WsmClient(props).objective(cross_entropy)
    y = torch.tensor([0, 1, 1])
    for absent_logit in (-50.0, 0.0, 30.0):
        logits = torch.tensor([[1.0, 2.0, absent_logit], [0.5, -1.0, absent_logit],
                               [0.0, 0.3, absent_logit]], requires_grad=True)
        out = objective(logits, y)
        out.backward()
        plain = objective(torch.tensor([[1.0, 2, 0], [0.5, -1, 0], [0, 0.3, 0]]), y)
        assert float(out.detach()) == pytest.approx(float(plain), abs=1e-6)
        assert torch.all(logits.grad[:, 2] == 0)
        assert torch.isfinite(logits.grad).all()


def test_wsm_has_the_gradients_of_eq15():
    g = torch.Generator().manual_seed(3)
    props = torch.tensor([0.1, 0.6, 0.3])
    logits = torch.randn(4, 3, generator=g, requires_grad=True)
    y = torch.tensor([0, 1, 2, 1])
    wsm.wsm_loss(logits, y, props).backward()
    ours = logits.grad.clone()
    logits.grad = None
    picked = logits.gather(1, y[:, None]).squeeze(1)
    eq15 = -(picked - torch.logsumexp(logits + props.log(), dim=1)).mean()
    eq15.backward()
    assert torch.allclose(ours, logits.grad, atol=1e-6)


def test_wsm_objective_needs_usable_proportions():
    with pytest.raises(ValueError, match="all zero"):
        wsm.WsmClient([0, 0])
    objective = wsm.WsmClient([1, 2]).objective(cross_entropy)
    with pytest.raises(ValueError, match="2 classes"):
        objective(torch.zeros(1, 3), torch.tensor([0]))


# ----------------------------------------------------------------------- FedCurv

class _OneParam(nn.Module):
    """logits = [theta * x, 0]: the true-label NLL gradient is easy by hand."""

    def __init__(self, theta: float):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(theta))

    def forward(self, x):
        z = self.theta * x.reshape(-1)
        return torch.stack([z, torch.zeros_like(z)], dim=1)


def test_fisher_by_hand_is_the_mean_of_per_sample_squared_gradients():
    # theta = 0: sigma = 1/2, d/dtheta NLL = -x/2 for label 0 and +x/2 for label 1 -> squares x^2 / 4.
    # x = 1, 2, 3: (0.25 + 1 + 2.25) / 3 = 7/6 (the squared mean gradient would be (1/3)^2 = 1/9).
    data = ArrayData(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([0, 1, 0]), 2)
    model = _OneParam(0.0)
    for bs in (1, 2, 3):
        for method in ("vmap", "loop"):
            fisher = fisher_mod.fisher_diagonal(model, data, bs, method=method)
            assert float(fisher["theta"]) == pytest.approx(7 / 6, rel=1e-6)
    assert model.theta.grad is None and float(model.theta.detach()) == 0.0


def test_fisher_accumulates_over_batches_and_touches_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    model.train()
    data = _blobs(13)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    whole = fisher_mod.fisher_diagonal(model, data, 13)
    ones = fisher_mod.fisher_diagonal(model, data, 1)
    fives = fisher_mod.fisher_diagonal(model, data, 5, method="loop")
    assert set(whole) == {n for n, _ in model.named_parameters()}
    for name in whole:
        assert whole[name].dtype == torch.float32 and whole[name].shape == state[name].shape
        assert torch.allclose(whole[name], ones[name], rtol=1e-5, atol=1e-9)
        assert torch.allclose(whole[name], fives[name], rtol=1e-5, atol=1e-9)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    # per-sample (eval mode) by brute force for one weight
    model.eval()
    total = torch.zeros_like(model[3].weight)
    for i in range(len(data)):
        model.zero_grad()
        F.cross_entropy(model(data.x[i:i + 1]), data.y[i:i + 1]).backward()
        total += model[3].weight.grad ** 2
    assert torch.allclose(whole["3.weight"], total / len(data), rtol=1e-5, atol=1e-9)
    empty = fisher_mod.fisher_diagonal(model, data.subset(np.array([], dtype=int)), 4)
    assert all(float(v.abs().sum()) == 0 for v in empty.values())


def _peers(seed: int, n: int = 3):
    g = torch.Generator().manual_seed(seed)
    shapes = {"0.weight": (2, 3), "0.bias": (2,)}
    f64 = torch.float64
    fishers = [{k: torch.rand(s, generator=g, dtype=f64) for k, s in shapes.items()} for _ in range(n)]
    thetas = [{k: torch.randn(s, generator=g, dtype=f64) for k, s in shapes.items()} for _ in range(n)]
    return fishers, thetas


def _direct_penalty(model, fishers, thetas):
    params = dict(model.named_parameters())
    return sum(((params[k] - th[k]) ** 2 * fi[k]).sum() for fi, th in zip(fishers, thetas, strict=True)
               for k in fi)


def test_fedcurv_penalty_from_u_v_w_equals_the_direct_sum_over_peers():
    fishers, thetas = _peers(4)
    model = nn.Sequential(nn.Linear(3, 2)).double()
    u, v, w = fedcurv_terms.aggregate_uv(fishers, thetas)
    lam = 0.7
    with_w = fedcurv_terms.fedcurv_penalty(model, u, v, lam, w)
    direct = lam * _direct_penalty(model, fishers, thetas)
    assert float(with_w.detach()) == pytest.approx(float(direct.detach()), rel=1e-12)
    (g_direct,) = torch.autograd.grad(direct, [model[0].weight])
    no_w = fedcurv_terms.fedcurv_penalty(model, u, v, lam)
    w_sum = sum(float(x.sum()) for x in w.values())
    assert float(no_w.detach()) == pytest.approx(float(direct.detach()) - lam * w_sum)  # up to the constant
    (g_uv,) = torch.autograd.grad(no_w, [model[0].weight])
    assert torch.allclose(g_uv, g_direct, rtol=1e-12)


def test_others_terms_subtracts_the_own_node_and_is_ready_for_float32_models():
    fishers, thetas = _peers(5, n=3)
    u, v, w = fedcurv_terms.aggregate_uv(fishers, thetas)
    uo, vo, wo = fedcurv_terms.others_terms(u, v, w, fishers[0], thetas[0])
    eu, ev, ew = fedcurv_terms.aggregate_uv(fishers[1:], thetas[1:])
    for k in u:
        assert uo[k].dtype == torch.float32
        assert torch.allclose(uo[k].double(), eu[k], atol=1e-6)
        assert torch.allclose(vo[k].double(), ev[k], atol=1e-6)
        assert torch.allclose(wo[k].double(), ew[k], atol=1e-6)
    model = nn.Sequential(nn.Linear(3, 2))
    pen = fedcurv_terms.fedcurv_penalty(model, uo, vo, 1.0, wo)
    assert pen.dtype == torch.float32
    direct = _direct_penalty(model.double(), fishers[1:], thetas[1:]).detach()
    assert float(pen.detach()) == pytest.approx(float(direct), rel=1e-4)
    assert fedcurv_terms.others_terms(u, v, None, fishers[0], thetas[0])[2] is None


def test_others_terms_clamps_u_at_zero():
    u = {"p": _t(1.0, 2.0)}
    v = {"p": _t(0.5, 1.0)}
    w = {"p": _t(0.25, 0.5)}
    own_f = {"p": _t(1.0 + 1e-9, 0.5)}
    own_t = {"p": _t(0.5, 1.0)}
    uo, vo, wo = fedcurv_terms.others_terms(u, v, w, own_f, own_t, dtype=torch.float64)
    assert torch.equal(uo["p"], _t(0.0, 1.5))
    assert torch.allclose(vo["p"], _t(0.5 - (1 + 1e-9) * 0.5, 0.5))
    assert torch.equal(wo["p"], _t(0.0, 0.0))  # 0.25 - 0.25000000025 clamps; 0.5 - 0.5 = 0


def test_fedcurv_rejects_mismatched_aggregates():
    fishers, thetas = _peers(6, n=2)
    with pytest.raises(ValueError, match="2 Fisher diagonals but 1 models"):
        fedcurv_terms.aggregate_uv(fishers, thetas[:1])
    u, v, w = fedcurv_terms.aggregate_uv(fishers, thetas)
    with pytest.raises(ValueError, match="not a parameter"):
        fedcurv_terms.fedcurv_penalty(nn.Linear(3, 2), u, v, 1.0)
    with pytest.raises(ValueError, match="same parameters"):
        fedcurv_terms.fedcurv_penalty(nn.Sequential(nn.Linear(3, 2)), u, {}, 1.0)


# -------------------------------------------------------------------- forgetting

def test_per_class_accuracy_marks_absent_classes_nan():
    acc = forgetting.per_class_accuracy([3, 0, 1], [4, 0, 2])
    assert acc[0] == 0.75 and math.isnan(acc[1]) and acc[2] == 0.5
    with pytest.raises(ValueError, match="correct <= total"):
        forgetting.per_class_accuracy([3], [2])


def test_round_forgetting_counts_drops_positive_and_gains_as_zero():
    prev, cur = np.array([0.8, 0.5, 0.2]), np.array([0.6, 0.7, 0.2])
    # drops [0.2, 0, 0]: the gain on class 1 masks nothing
    assert forgetting.round_forgetting(prev, cur) == pytest.approx(0.2 / 3)
    assert forgetting.round_forgetting(cur, cur) == 0.0
    assert forgetting.round_forgetting(np.array([0.1, 0.2]), np.array([0.9, 1.0])) == 0.0
    assert forgetting.global_forgetting(prev, cur) == forgetting.local_forgetting(prev, cur)
    # NaN classes (absent from the test set) are skipped
    assert forgetting.round_forgetting(np.array([np.nan, 1.0]), np.array([0.5, 0.5])) == 0.5
    assert math.isnan(forgetting.round_forgetting(np.array([np.nan]), np.array([0.5])))


def test_client_forgetting_by_hand():
    before = [0.8, 0.6, 0.5]  # the round's starting global model on clients 0, 1, 2's test data
    after = np.array([[0.9, 0.3, 0.2],   # client 0's trained model on test sets 0, 1, 2
                      [0.5, 0.7, 0.4],
                      [0.8, 0.6, 0.9]])
    res = forgetting.client_forgetting(before, after)
    assert np.allclose(res.matrix, [[-0.1, 0.3, 0.3], [0.3, -0.1, 0.1], [0.0, 0.0, -0.4]])
    assert np.allclose(res.per_client, [0.3, 0.2, 0.0])  # F_k over the K - 1 other test sets
    assert res.mean == pytest.approx(0.5 / 3)
    per_start = forgetting.client_forgetting(np.tile(before, (3, 1)), after)
    assert np.allclose(per_start.matrix, res.matrix)
    assert math.isnan(forgetting.client_forgetting([0.5], np.array([[0.4]])).per_client[0])
    with pytest.raises(ValueError, match="square"):
        forgetting.client_forgetting(before, np.zeros((2, 3)))


def test_rounds_to_target_table1_with_a_dash():
    curves = {"a": [0.2, 0.5, 0.7, 0.9], "b": [0.1, 0.3, 0.6, 0.65]}
    # A = 0.95 * 0.9 = 0.855; goals 0.64125, 0.7695, 0.855
    assert forgetting.target_accuracy(curves) == pytest.approx(0.855)
    assert forgetting.rounds_to_target(curves) == {"a": {0.75: 3, 0.9: 4, 1.0: 4},
                                                   "b": {0.75: 4, 0.9: None, 1.0: None}}
    # unevaluated rounds (None / NaN) are skipped; the round number stays the position
    sparse = {"a": [None, math.nan, 0.5, 1.0]}
    assert forgetting.rounds_to_target(sparse, fractions=(0.5,), ref_fraction=1.0) == {"a": {0.5: 3}}
    with pytest.raises(ValueError, match="at least one accuracy"):
        forgetting.rounds_to_target({"a": []})


def test_distill_minimises_the_multi_teacher_loss():
    # lr = 0 keeps the student fixed, so the reported loss is Eq. 3's server loss on the public split
    public = _blobs(40)
    cfg = TrainingConfig(epochs=1, batch_size=64, lr=1e-12)
    torch.manual_seed(1)
    student = MLP((4,), 3, hidden=(8,))
    teachers = [MLP((4,), 3, hidden=(8,)) for _ in range(2)]
    alphas = torch.tensor([[0.2, 0.5, 0.0], [0.7, 0.1, 1.0]])
    stats = distillation.distill(student, teachers, alphas, public, 1, cfg, seed=0)
    with torch.no_grad():
        expected = distillation.multi_teacher_dkd_loss(student(public.x), [t(public.x) for t in teachers],
                                                     alphas, public.y)
    assert stats.loss == pytest.approx(float(expected), rel=1e-5)


class _NeedsItem(nn.Module):
    """A model torch.func.vmap cannot batch (``.item()`` on a per-sample tensor)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        scale = float(x.abs().max().item()) or 1.0
        return self.lin(x / scale)


class _Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        raise TypeError("a bug in the model, not a vmap limitation")


def test_fisher_falls_back_to_the_loop_only_when_vmap_cannot_batch(caplog):
    data = ArrayData(torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]), torch.tensor([0, 1, 0]), 2)
    torch.manual_seed(0)
    model = _NeedsItem()
    with caplog.at_level("WARNING", logger="flmesh.learning"):
        auto = fisher_mod.fisher_diagonal(model, data, 2)
    assert "vmap cannot batch _NeedsItem" in caplog.text and "using the per-sample loop" in caplog.text
    loop = fisher_mod.fisher_diagonal(model, data, 2, method="loop")
    assert all(torch.allclose(auto[k], loop[k]) for k in loop)
    with pytest.raises(TypeError, match="a bug in the model"):
        fisher_mod.fisher_diagonal(_Broken(), data, 2)
