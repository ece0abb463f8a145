"""WSM's mechanism on digits: how strong its training signal is at the initial model, per class.

    python benchmarks/wsm_mechanism.py                                    # seeds 1-3, M_0 only
    python benchmarks/wsm_mechanism.py --runs runs/benchmarks/wsm-e1.json # + per-class accuracy
    python benchmarks/wsm_mechanism.py --quick                            # one seed

For each seed, on the split and initial model M_0 that ``benchmarks/wsm.py``'s
federation of that seed uses (no training here; seconds):

- the gradient ratio: the norm of the federation-mean WSM gradient (Eq. 15,
  each node's gradient over its whole training split, weighted by its sample
  count as FedAvg weights updates) over the norm of the same mean for plain
  cross-entropy; and the mean over nodes of each node's own ratio;
- the mean softmax probability M_0 gives a sample's own class (0.1 = uniform);
- the per-class signal s_c: the mean of 1 - alpha_{k,c} over the class-c
  training samples, alpha_k the class proportions of the node k holding the
  sample. At M_0's near-uniform softmax a class-c sample pushes its own logit
  up by about 1 - p_c under cross-entropy (about 0.9 for every class) and by
  about 1 - alpha_{k,c} under WSM: a node's dominant class teaches little;
- the split's shape: shares holding a single class, classes per share, the
  smallest and largest training share.

With ``--runs`` (a JSON written by ``benchmarks/wsm.py``; its nodes, split,
alpha and seeds are used) it adds the last 5 rounds' per-class accuracy of
each method at ``--fraction`` and, per seed, the Pearson correlation over the
classes between that accuracy and s_c; FedAvg's correlation is the control
(its cross-entropy gives every class about the same signal).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from _common import add_json_flag, pm, stats, write_json
from wsm import METHODS, federation, parser


def measure(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The gradient ratio, the per-class signal and the split's shape at seed ``seed``'s M_0."""
    import torch
    from torch.nn import functional as F

    from flmesh.algorithms.wsm import wsm_loss
    from flmesh.config import parse_federation
    from flmesh.learning.data import federation_data
    from flmesh.learning.models import federation_model

    fed = parse_federation(federation("FedAvg", 1.0, seed, args), source="wsm_mechanism")
    shares = [d.train for d in federation_data(fed).values()]
    classes = shares[0].num_classes
    _, _, model = federation_model(fed, shares[0].input_shape, classes)
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(len(s) for s in shares)
    mean_grad = {"ce": [torch.zeros_like(p) for p in params], "wsm": [torch.zeros_like(p) for p in params]}
    node_ratios: list[float] = []
    signal_sum, signal_n = [0.0] * classes, [0] * classes
    with torch.no_grad():  # how near uniform M_0's softmax is: the mean probability of the true class
        true_p = torch.cat([F.softmax(model(s.x), dim=1).gather(1, s.y[:, None]).squeeze(1) for s in shares])
    for share in (s for s in shares if len(s)):
        counts = share.label_counts()
        grads = {}
        for name, loss_fn in (("ce", F.cross_entropy),
                              ("wsm", lambda z, y, c=counts: wsm_loss(z, y, torch.tensor(c)))):
            grads[name] = torch.autograd.grad(loss_fn(model(share.x), share.y), params)
            for acc, g in zip(mean_grad[name], grads[name], strict=True):
                acc += g * (len(share) / total)
        node_ratios.append(_norm(grads["wsm"]) / _norm(grads["ce"]))
        for c, n in enumerate(counts):
            signal_sum[c] += n * (1 - n / len(share))
            signal_n[c] += n
    held = [sum(1 for n in s.label_counts() if n) for s in shares]
    return {"seed": seed, "grad_ratio": _norm(mean_grad["wsm"]) / _norm(mean_grad["ce"]),
            "node_ratio_mean": statistics.fmean(node_ratios), "true_class_p": float(true_p.mean()),
            "signal": [s / n if n else None for s, n in zip(signal_sum, signal_n, strict=True)],
            "single_class_shares": sum(1 for h in held if h == 1), "shares": len(held),
            "classes_per_share": statistics.fmean(held),
            "share_sizes": {"min": min(len(s) for s in shares), "max": max(len(s) for s in shares)}}


def _norm(grads: Any) -> float:
    return float(sum(float((g * g).sum()) for g in grads)) ** 0.5


def accuracy(runs: dict[str, Any], fraction: float, method: str) -> list[list[float | None]]:
    """The per-class accuracy (last rounds, one list per seed) of ``method`` at ``fraction``."""
    for cell in runs["cells"]:
        if cell["fraction"] == fraction and cell["method"] == method:
            return list(cell["per_class_last"])
    raise SystemExit(f"--runs has no cell for C = {fraction:g}, {method}")


def correlation(xs: list[float | None], ys: list[float | None]) -> float | None:
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if x is not None and y is not None]
    if len(pairs) < 3 or len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
        return None
    return statistics.correlation([x for x, _ in pairs], [y for _, y in pairs])


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=Path, metavar="JSON",
                   help="a benchmarks/wsm.py result: add its per-class accuracy")
    p.add_argument("--fraction", type=float, default=1.0, help="the C of --runs' cells to use (default 1)")
    add_json_flag(p, "wsm_mechanism")
    args = p.parse_args(argv)
    runs = None
    if args.runs is not None:
        try:
            doc = json.loads(args.runs.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--runs {args.runs}: cannot read a JSON result: {exc}") from None
        if doc.get("benchmark") != "wsm":
            raise SystemExit(f"--runs {args.runs}: not a benchmarks/wsm.py result")
        runs = doc["results"]
        for key in ("nodes", "partition", "alpha", "epochs"):
            setattr(args, key, runs[key])
        seeds = list(doc["seeds"])
    else:
        seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    found = [measure(seed, args) for seed in seeds]
    if runs is not None:
        for i, got in enumerate(found):
            got["accuracy"] = {m: accuracy(runs, args.fraction, m)[i] for m in METHODS}
            got["correlation"] = {m: correlation(got["signal"], got["accuracy"][m]) for m in METHODS}
    share = "equal-size" if args.partition == "dirichlet_equal" else "unequal-size"
    print(f"\nDigits, {args.nodes} nodes, {share} Dirichlet(alpha = {args.alpha:g}) shares, at M_0; "
          f"seeds {', '.join(map(str, seeds))}\n")
    print("| seed | ‖mean WSM grad‖ / ‖mean CE grad‖ | mean of each node's ratio | M_0's p(true class) "
          "| single-class shares "
          "| classes per share | training samples per share |"
          + (" r(signal, FedAvg acc) | r(signal, WSM acc) |" if runs else ""))
    print("|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if runs else ""))
    for got in found:
        line = (f"| {got['seed']} | {got['grad_ratio']:.3f} | {got['node_ratio_mean']:.3f} "
                f"| {got['true_class_p']:.3f} "
                f"| {got['single_class_shares']} of {got['shares']} | {got['classes_per_share']:.1f} "
                f"| {got['share_sizes']['min']}-{got['share_sizes']['max']} |")
        if runs is not None:
            line += "".join(f" {'n/a' if r is None else f'{r:.2f}'} |" for r in got["correlation"].values())
        print(line)
    classes = len(found[0]["signal"])
    print("\n| class | signal s_c |" + (f" FedAvg accuracy (%), C = {args.fraction:g} | WSM accuracy (%) |"
                                        if runs else ""))
    print("|---:|---:|" + ("---:|---:|" if runs else ""))
    for c in range(classes):
        cells = [pm([g["signal"][c] for g in found if g["signal"][c] is not None], scale=1.0)]
        if runs is not None:
            cells += [pm([v for g in found if (v := g["accuracy"][m][c]) is not None]) for m in METHODS]
        print(f"| {c} | " + " | ".join(cells) + " |")
    mean = {"grad_ratio": stats([g["grad_ratio"] for g in found]),
            "node_ratio_mean": stats([g["node_ratio_mean"] for g in found])}
    if runs is not None:
        rs = {m: [r for g in found if (r := g["correlation"][m]) is not None] for m in METHODS}
        mean["correlation"] = {m: stats(v) if v else None for m, v in rs.items()}
    print(f"\ngradient ratio {pm([g['grad_ratio'] for g in found], scale=1.0, digits=3)}")
    write_json(args.json, "wsm_mechanism",
               {"nodes": args.nodes, "partition": args.partition, "alpha": args.alpha,
                "fraction": args.fraction if runs is not None else None,
                "runs": str(args.runs) if args.runs else None, "per_seed": found, "mean": mean}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
