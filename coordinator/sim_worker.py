"""One worker process of ``fl-sim --workers K``: some of the nodes, each a real gRPC server.

    python -m flmesh.coordinator.sim_worker     (started by fl-sim; talks JSON lines)

The parent writes one JSON line on stdin: the federation (as parsed, with its
overrides, so this process parses the same one), the ids of the nodes to run
here and, with ``--tls``, the folder of their certificates. The worker builds
those nodes on 127.0.0.1 port 0 and prints their addresses; the parent answers
with every node's address. Then each node runs its rounds on a thread
(``Node.run``), and after each evaluated round the worker prints the node's
report and its model's evaluation on every node's test split (this process
holds every test split, as the parent does), or with ``[federation]
eval_sample`` on the splits the seeded draw names (null for the others: the
draw depends on seed, round and node only, so it is the in-process driver's). ``{"stop": true}`` on stdin, or
stdin closing, stops the nodes. Errors are one JSON line ``{"error": ...}``
and a non-zero exit. Nothing is pickled: the messages are JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path
from typing import Any

from flmesh.node.reports import EvalResult, RoundReport, TrainStats


def report_json(report: RoundReport, evals: list[EvalResult | None]) -> dict[str, Any]:
    return {"report": dataclasses.asdict(report),
            "evals": [None if e is None else dataclasses.asdict(e) for e in evals]}


def _eval(d: dict[str, Any]) -> EvalResult:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return EvalResult(**fields)


def report_from_json(d: dict[str, Any]) -> tuple[RoundReport, list[EvalResult | None]]:
    r = dict(d["report"])
    r["train"] = TrainStats(**r["train"])
    r["local"] = _eval(r["local"])
    r["notes"] = tuple(r["notes"])
    return RoundReport(**r), [None if e is None else _eval(e) for e in d["evals"]]


def _say(message: dict[str, Any], lock: threading.Lock) -> None:
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def main() -> int:
    order = json.loads(sys.stdin.readline())
    from flmesh.coordinator.sim_peer import reported_own
    from flmesh.node.learning.data import federation_data, load_dataset
    from flmesh.node.learning.trainer import evaluate, host_nodes
    from flmesh.node.node import Node
    from flmesh.node.wire.limits import StreamLimits
    from flmesh.topology import parse_federation
    from flmesh.topology.sampling import eval_splits

    fed = parse_federation(order["federation"], source=order["source"], base_dir=Path(order["base_dir"]))
    lock = threading.Lock()
    host_nodes(len(order["ids"]))
    dataset = load_dataset(fed.data)
    data = federation_data(fed, dataset)
    tests = [data[n].test for n in fed.node_ids]
    tls_dir = order.get("tls_dir")
    nodes = []
    for nid in order["ids"]:
        tls = None
        if tls_dir:
            from flmesh.node.wire.tls import load_tls

            certs = Path(tls_dir)
            tls, _ = load_tls(certs / "ca.pem", certs / f"{nid}.pem", certs / f"{nid}.key", expected_id=nid)
        node = Node.from_federation(fed, nid, data=data[nid], dataset=dataset, listen="127.0.0.1:0", tls=tls)
        node.stream_limits = StreamLimits.for_simulation(len(fed.nodes), fed.round_timeout_s)
        nodes.append(node)
    _say({"addresses": {n.node_id: n.start() for n in nodes}}, lock)
    peers = json.loads(sys.stdin.readline())["peers"]
    for n in nodes:
        n.connect(peers)

    def run(node: Node) -> None:
        def on_round(report: Any) -> None:
            t = report.round
            if t % fed.eval_every and t != fed.rounds:
                return
            cols = set(eval_splits(fed, t, node.node_id, getattr(report, "task", None)))
            with node.model_lock:
                evals = [reported_own(report, test is node.data.test) or
                         evaluate(node.model, test, device=node.device) if j in cols else None
                         for j, test in enumerate(tests)]
            _say({"node": node.node_id, **report_json(report, evals)}, lock)

        try:
            node.run(on_round=on_round)
        except Exception as exc:  # a peer that failed for good: one line to the parent
            _say({"error": f"{node.node_id}: {exc}"}, lock)
            raise

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    stop = threading.Event()

    def watch_stdin() -> None:  # the parent says stop, or goes away
        for line in sys.stdin:
            if json.loads(line).get("stop"):
                break
        stop.set()
        for n in nodes:
            n.cancel()

    threading.Thread(target=watch_stdin, daemon=True).start()
    for t in threads:
        t.join()
    _say({"done": True}, lock)
    stop.wait()  # keep serving: nodes of other workers may still rewind to these
    for n in nodes:
        n.stop(grace=0.5)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # before the rounds: bad input reaches the parent as one line
        sys.stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        sys.exit(1)
