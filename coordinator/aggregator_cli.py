"""``fl-node --role aggregator``: run the aggregator of a star federation as a process.

    fl-node --role aggregator --federation FILE [--listen HOST:PORT] [--out DIR]
            [--join-timeout S] [--set KEY=VALUE ...]

Serves the ``Aggregator`` service, waits (up to ``--join-timeout``) for the
federation's nodes to join, then runs every round: sample a fraction C of the
nodes, publish the global model, close the round when all sampled updates are
in or at ``[aggregator] deadline_s``, aggregate with the strategy, evaluate the
global model and each update on the nodes' test splits through their
``Evaluate`` RPC. Writes DIR/rounds.jsonl and DIR/summary.json like ``fl-sim``.
Exit codes: 0 done, 1 run failed, 2 bad input, 130/143 stopped by SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path

import torch

from flmesh.coordinator.aggregator import AggregatorCore
from flmesh.coordinator.aggregator_service import serve
from flmesh.coordinator.results import RunWriter
from flmesh.coordinator.star_sim import star_row, star_summary
from flmesh.coordinator.strategies import make_strategy
from flmesh.node import extras
from flmesh.node.cli import INPUT_ERRORS, UsageError
from flmesh.node.client import PeerClient, PeerError
from flmesh.node.codec import ModelMeta, encode, model_spec
from flmesh.node.data import SEED_MODEL, derive_seed, load_dataset, public_data
from flmesh.node.device import select_device
from flmesh.node.models import build_model
from flmesh.node.trainer import EvalResult
from flmesh.topology import load_federation

log = logging.getLogger("flmesh.aggregator")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fl-node --role aggregator",
                                description="Run the aggregator of a star federation.")
    p.add_argument("--federation", required=True, type=Path, help="federation file (TOML)")
    p.add_argument("--listen", help="HOST:PORT to serve on (default: [aggregator] address)")
    p.add_argument("--out", type=Path, help="results folder (default runs/<federation>-aggregator)")
    p.add_argument("--join-timeout", type=float, default=120.0,
                   help="seconds to wait for every node to join before round 1 (default 120)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s fl-node aggregator: %(message)s", datefmt="%H:%M:%S")
    prog = "fl-node aggregator"
    stopped: list[str] = []
    try:
        fed = load_federation(args.federation, args.overrides)
        if fed.aggregator is None:
            raise UsageError(f"{fed.source}: no [aggregator] section: this federation has no aggregator")
        agg = fed.aggregator
        listen = args.listen or agg.address
        if not listen:
            raise UsageError("no address to listen on: pass --listen HOST:PORT or set [aggregator] address")
        dataset = load_dataset(fed.data)
        public = public_data(fed, dataset)
        device = select_device(fed.training.device)
        input_shape, num_classes = tuple(dataset.x.shape[1:]), dataset.num_classes

        def factory() -> torch.nn.Module:
            return build_model(fed.model, input_shape, num_classes, seed=derive_seed(fed.seed, SEED_MODEL))

        initial = factory()
        spec = model_spec(initial.state_dict())
        strategy = make_strategy(agg, initial, num_classes, model_factory=factory, public=public,
                                 training=fed.training, seed=fed.seed, device=device)
    except (*INPUT_ERRORS, UsageError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2

    clients: dict[str, PeerClient] = {}

    def evaluator(state: dict[str, torch.Tensor]) -> dict[str, EvalResult]:
        """The model on every joined node's test split, through the nodes' Evaluate RPC."""
        message = encode(state, ModelMeta(sender="aggregator", kind="eval"))
        out = {}
        for node_id, address in sorted(core.addresses().items()):
            client = clients.setdefault(node_id, PeerClient(node_id, address, timeout=fed.round_timeout_s))
            try:
                out[node_id] = client.evaluate(message)
            except PeerError as exc:
                log.warning("cannot evaluate on %s: %s", node_id, exc)
        return out

    core = AggregatorCore(federation=fed.name, node_ids=fed.node_ids, initial=initial.state_dict(),
                          strategy=strategy, rounds=fed.rounds, fraction=agg.fraction,
                          min_updates=agg.min_updates, deadline_s=agg.deadline_s, seed=fed.seed,
                          evaluator=evaluator)
    try:
        server, address = serve(core, listen, extras.submit_spec(agg.strategy, spec,
                                                                 extras.trainable_spec(initial)),
                                int(fed.max_model_mib * 2**20), fed.round_timeout_s)
    except OSError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, _frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        core.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = args.out or Path("runs") / f"{fed.name}-aggregator"
    writer = RunWriter(out)
    started = time.monotonic()
    rows: list[dict] = []
    done = 0
    try:
        log.info("serving %s on %s; waiting for %d nodes to join", agg.strategy, address, len(fed.nodes))
        deadline = time.monotonic() + args.join_timeout
        while len(core.status()["joined"]) < len(fed.nodes) and time.monotonic() < deadline and not stopped:
            time.sleep(0.2)  # a poll interval, not a wait for a result
        joined = core.status()["joined"]
        if len(joined) < len(fed.nodes):
            log.warning("starting without %s (not joined within %gs)",
                        ", ".join(n for n in fed.node_ids if n not in joined), args.join_timeout)
        prev_global = None
        for t in range(1, fed.rounds + 1):
            if stopped:
                break
            outcome = core.run_round(t)
            row, prev_global = star_row(outcome, fed.node_ids, num_classes, prev_global)
            rows.append(row)
            writer.write_round(row)
            done = t
            log.info("round %d/%d: global accuracy %.1f%%, %d/%d updates%s", t, fed.rounds,
                     100 * row["accuracy"], len(outcome.received), len(outcome.selected),
                     f"; missing {', '.join(outcome.missing)}" if outcome.missing else "")
    finally:
        writer.close()
        summary = star_summary(fed, rows, done, time.monotonic() - started, out)
        writer.write_summary(summary)
        if rows:
            summary["pictures"] = [str(p) for p in writer.draw()]
            writer.write_summary(summary)
        server.stop(1.0).wait()
        for client in clients.values():
            client.close()
    if stopped:
        print(f"{prog}: stopped by {stopped[0]} after round {done} of {fed.rounds}; results in {out}",
              file=sys.stderr)
        return 143 if stopped[0] == "SIGTERM" else 130
    print(f"{prog}: done, {done} rounds, global accuracy {100 * rows[-1]['accuracy']:.1f}%; "
          f"results in {out}", file=sys.stderr)
    return 0
