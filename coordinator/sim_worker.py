"""One worker process of ``fl-sim --workers K``: some of the nodes, each a real gRPC server.

    python -m flmesh.coordinator.sim_worker     (started by fl-sim; talks JSON lines)

On Linux fl-sim forks its workers once it has imported torch and split the
data (:func:`forked`; :mod:`flmesh.coordinator.sim_fork`), so a worker starts
in milliseconds with the parsed federation and the data in its parent's
memory. Elsewhere, or from a process that already runs threads or gRPC, it
starts this module as a fresh interpreter (:func:`main`), and the first line
it reads is the order: the federation (as parsed, with its overrides, so this
process parses the same one), the ids of its nodes and, with ``--tls``, the
folder of their certificates. Then, either way, over a pair of pipes in JSON
lines (nothing is pickled):

- a star federation's aggregator address comes first (the aggregator runs in
  fl-sim); the worker builds its nodes on 127.0.0.1 port 0 and says their
  addresses; the parent answers with every node's address;
- each node runs its rounds on a thread (``Node.run``). Between peers, at an
  evaluated round, the node waits until every node of every worker has
  trained the round (the workers keep that lock-step among themselves:
  :mod:`~flmesh.coordinator.sim_mesh`), evaluates its model on every node's
  test split (or on the splits the seeded ``eval_sample`` draw names, null
  for the others: the draw depends on seed, round and node only), says the
  report with those evaluations, and waits again before the next round. In a
  star federation it says each report as the round ends;
- ``{"stop": true}``, or the parent's end of the pipe closing, stops the
  nodes; the worker says ``done`` once they have. Errors are one line
  ``{"error": ...}`` and a non-zero exit.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from flmesh.coordinator.sim_cpus import pin
from flmesh.coordinator.sim_mesh import Mesh
from flmesh.node.reports import EvalResult, RoundReport, StarReport, TrainStats

if TYPE_CHECKING:
    from flmesh.node.learning.data import ArrayData, NodeData
    from flmesh.node.node import Node
    from flmesh.topology import Federation

    Shared = tuple[ArrayData, dict[str, NodeData]]  # the data set and every node's split


def report_json(report: RoundReport | StarReport, evals: list[EvalResult | None]) -> dict[str, Any]:
    return {"report": _fields(report), "star": isinstance(report, StarReport),
            "evals": [None if e is None else _fields(e) for e in evals]}


def _fields(obj: Any) -> dict[str, Any]:
    """A report's or evaluation's fields for json.dumps, nested ones too: what
    ``dataclasses.asdict`` gives, without deep-copying every tuple (0.3 ms a report)."""
    return {f.name: _fields(v) if dataclasses.is_dataclass(v := getattr(obj, f.name)) else v
            for f in dataclasses.fields(obj)}


def _eval(d: dict[str, Any]) -> EvalResult:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return EvalResult(**fields)


def report_from_json(d: dict[str, Any]) -> tuple[RoundReport | StarReport, list[EvalResult | None]]:
    r = dict(d["report"])
    r["notes"] = tuple(r["notes"])
    evals = [None if e is None else _eval(e) for e in d["evals"]]
    if d.get("star"):  # a node that was not sampled trained and evaluated nothing
        r["train"] = TrainStats(**r["train"]) if r["train"] is not None else None
        r["start"] = _eval(r["start"]) if r["start"] is not None else None
        r["local"] = _eval(r["local"]) if r["local"] is not None else None
        return StarReport(**r), evals
    r["train"] = TrainStats(**r["train"])
    r["local"] = _eval(r["local"])
    return RoundReport(**r), evals


def _say(message: dict[str, Any], out: IO[str], lock: threading.Lock) -> None:
    with lock:
        out.write(json.dumps(message) + "\n")
        out.flush()


def update_evals_here(fed: Federation) -> bool:
    """Whether a star federation's workers evaluate their own updates for the aggregator's row:
    when models travel bit for bit (``[wire] dtype = "native"``; compression is lossless), so
    a node's model is the update the aggregator decoded."""
    return fed.aggregator is not None and fed.wire.dtype == "native"


def leave_signals_to_the_parent() -> None:
    """Ignore SIGINT and SIGTERM: fl-sim gets them too (Ctrl-C, or a stop sent to the process
    group) and stops its workers over the pipe after the round in progress, so the rows
    stay whole; a worker that died of the signal first would be a failed run instead. A
    worker whose parent is gone sees its pipe close and stops; fl-sim kills one that does
    not exit when told."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def main() -> int:
    """A worker started as a fresh interpreter: the order on stdin, messages on stdout."""
    from flmesh.topology import parse_federation

    leave_signals_to_the_parent()
    order = json.loads(sys.stdin.readline())
    fed = parse_federation(order["federation"], source=order["source"], base_dir=Path(order["base_dir"]))
    return serve(fed, order["ids"], order.get("tls_dir"), order["mesh"], sys.stdin, sys.stdout,
                 cpus=order.get("cpus"))


def forked(fed: Federation, ids: list[str], tls_dir: str | None, mesh: dict[str, Any], data: Shared,
           inbox: IO[str], outbox: IO[str], cpus: list[int] | None = None) -> int:
    """A worker forked from fl-sim: the parent's parsed federation and data, its pipes."""
    leave_signals_to_the_parent()
    try:
        return serve(fed, ids, tls_dir, mesh, inbox, outbox, data, cpus)
    except Exception as exc:  # before the rounds: bad input reaches the parent as one line
        _say({"error": f"{type(exc).__name__}: {exc}"}, outbox, threading.Lock())
        return 1


def serve(fed: Federation, ids: list[str], tls_dir: str | None, mesh: dict[str, Any], inbox: IO[str],
          outbox: IO[str], data: Shared | None = None, cpus: list[int] | None = None) -> int:
    """Run ``ids``'s nodes until the parent says stop. Blocks. ``mesh``: this worker's ends of
    the lock-step's pipes (:meth:`~flmesh.coordinator.sim_mesh.MeshPipes.ends`). ``data``: the
    data set and every node's split, when the parent has them already (fork); else this
    process loads them. ``cpus``: keep this process on them (:func:`~flmesh.coordinator.sim_cpus.pin`,
    before any thread starts); None: where the OS puts it."""
    placed = pin(cpus)
    import torch

    from flmesh.node.learning import trainer
    from flmesh.node.learning.data import federation_data, load_dataset

    trainer.host_nodes(len(ids))
    torch.set_num_threads(1)  # with one node too: fl-sim runs about one worker per core
    if data is None:
        dataset = load_dataset(fed.data)
        data = (dataset, federation_data(fed, dataset))
    aggregator = json.loads(inbox.readline())["aggregator"] if fed.aggregator is not None else None
    worker = Worker(fed, outbox, aggregator, Mesh(mesh, len(ids)))
    nodes = worker.build(ids, tls_dir, *data)
    worker.say({"addresses": {n.node_id: n.start() for n in nodes}, "cpus": placed})
    peers = json.loads(inbox.readline())["peers"]
    for n in nodes:
        n.connect(peers)
    threads = [threading.Thread(target=worker.run, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    threading.Thread(target=worker.follow_parent, args=(inbox, nodes), daemon=True).start()
    for t in threads:
        t.join()
    worker.say({"done": True})
    worker.stopped.wait()  # keep serving: nodes of other workers may still rewind to these
    for n in nodes:
        n.stop(grace=0.5)
    return 0


class Worker:
    """This worker's side of the protocol: it builds the nodes, reports their rounds, keeps them
    in lock-step with the other workers' and follows the parent's messages. ``say`` is
    thread-safe; the rest runs on the threads :func:`serve` starts."""

    def __init__(self, fed: Federation, outbox: IO[str], aggregator: str | None, mesh: Mesh):
        self.fed, self.aggregator = fed, aggregator
        self._outbox, self._lock = outbox, threading.Lock()
        self.stopped = threading.Event()
        # as fl-sim's in-process driver: the N x N evaluation of round t waits until every node
        # has finished round t ("trained"), and round t+1 until every node is done with round t
        # ("round_over")
        self.mesh = mesh
        self.tests: list[ArrayData] = []

    def say(self, message: dict[str, Any]) -> None:
        _say(message, self._outbox, self._lock)

    def build(self, ids: list[str], tls_dir: str | None, dataset: ArrayData,
              splits: dict[str, NodeData]) -> list[Node]:
        """This worker's nodes on 127.0.0.1 port 0, each with its certificate (``tls_dir``)."""
        from flmesh.node.node import Node
        from flmesh.node.wire.limits import StreamLimits

        fed = self.fed
        self.tests = [splits[n].test for n in fed.node_ids]
        nodes = []
        for nid in ids:
            tls = None
            if tls_dir:
                from flmesh.node.wire.tls import load_tls

                certs = Path(tls_dir)
                tls, _ = load_tls(certs / "ca.pem", certs / f"{nid}.pem", certs / f"{nid}.key",
                                  expected_id=nid)
            node = Node.from_federation(fed, nid, data=splits[nid], dataset=dataset, listen="127.0.0.1:0",
                                        aggregator=self.aggregator, tls=tls)
            node.stream_limits = StreamLimits.for_simulation(len(fed.nodes), fed.round_timeout_s)
            nodes.append(node)
        return nodes

    def run(self, node: Node) -> None:
        """One node's rounds (its thread); a failure goes to the parent as one line."""
        try:
            node.run(on_round=lambda report: self.on_round(node, report))
        except Exception as exc:  # a peer that failed for good
            self.say({"error": f"{node.node_id}: {exc}"})
            raise

    def on_round(self, node: Node, report: RoundReport | StarReport) -> None:
        """Report ``node``'s round: at once in a star federation (the aggregator evaluates, and
        its rounds pace the nodes); between peers, at an evaluated round, after every node has
        finished it, with the model's evaluations; then wait for every node to be done."""
        from flmesh.coordinator.sim_peer import reported_own
        from flmesh.node.learning import trainer
        from flmesh.topology.sampling import eval_splits

        if self.stopped.is_set():
            return  # interrupted mid-round: what the nodes did is incomplete; keep it out
        if self.aggregator is not None:
            assert isinstance(report, StarReport)
            self.say({"node": node.node_id, **report_json(report, self.update_evals(node, report))})
            return
        fed, t = self.fed, report.round
        if t % fed.eval_every == 0 or t == fed.rounds:
            if not self.mesh.meet("trained", t):
                return
            cols = set(eval_splits(fed, t, node.node_id, report.task))
            with node.model_lock:
                evals = [reported_own(report, test is node.data.test) or
                         trainer.evaluate(node.model, test, device=node.device) if j in cols else None
                         for j, test in enumerate(self.tests)]
            self.say({"node": node.node_id, **report_json(report, evals)})
        self.mesh.meet("round_over", t)

    def update_evals(self, node: Node, report: StarReport) -> list[EvalResult | None]:
        """At an evaluated round, the model ``node`` submitted on every node's test split: the
        evaluations the aggregator's row takes for FA/FF/PFA, made here, beside the other
        workers', instead of one after another in fl-sim while every worker waits. Only when
        the update travelled exactly (``update_evals_here``), so these are the aggregator's
        numbers; else none, and the aggregator evaluates what it received."""
        from flmesh.coordinator.sim_peer import reported_own
        from flmesh.node.learning import trainer

        fed, t = self.fed, report.round
        if not (update_evals_here(fed) and report.submitted and not report.late
                and (t % fed.eval_every == 0 or t == fed.rounds)):
            return []
        with node.model_lock:  # the own split's evaluation is the report's (sim_peer.reported_own)
            return [reported_own(report, test is node.data.test and report.task is None) or
                    trainer.evaluate(node.model, test.up_to_task(report.task), device=node.device)
                    for test in self.tests]

    def follow_parent(self, inbox: IO[str], nodes: list[Node]) -> None:
        """The parent's messages (its thread): stop, or the pipe closing (the parent is gone)."""
        for line in inbox:
            if json.loads(line).get("stop"):
                break
        self.stopped.set()
        self.mesh.stop()
        for n in nodes:
            n.cancel()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # before the rounds: bad input reaches the parent as one line
        sys.stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        sys.exit(1)
