"""A federation from Python, with the model, learner and data passed as objects.

1. :class:`flmesh.Simulation` runs peer.toml with a model factory and a learner given here
   (they replace the file's ``[model]`` and ``[training] learner``).
2. Three :class:`flmesh.Node` objects serve over gRPC with mTLS on 127.0.0.1 in this process
   (certificates from ``fl-certs``, read with :func:`flmesh.load_tls_identity`), each with its
   own :class:`flmesh.NodeData` made from arrays (nodes.toml's ids and settings; its data
   files are not read).

    python examples/custom/embedded.py [OUT_DIR]      (default: examples/custom/runs/embedded)
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch
from flmesh_custom_example.data import generate
from flmesh_custom_example.learner import ClippedLearner
from flmesh_custom_example.model import wave_cnn

import flmesh

HERE = Path(__file__).resolve().parent


def simulate(out: Path) -> None:
    federation = flmesh.load_federation(HERE / "peer.toml")
    model = functools.partial(wave_cnn, channels=8)  # called with input_shape= and num_classes=
    with flmesh.Simulation(federation, out, model=model, learner=ClippedLearner(max_norm=0.5)) as sim:
        sim.draw_pictures = False
        summary = sim.run()
    if summary.error is not None or summary.final is None:
        raise SystemExit(f"embedded.py: the simulation failed: {summary.error}")
    print(f"Simulation: {summary.rounds} rounds, FA (macro-F1) {summary.final.fa:.3f}")


def arrays(n: int, seed: int, mix: tuple[float, ...]) -> flmesh.ArrayData:
    x, y = generate(n, seed=seed, weights=mix)
    return flmesh.ArrayData(torch.from_numpy(x), torch.from_numpy(y), num_classes=4)


def nodes(rounds: int) -> None:
    torch.set_num_threads(1)  # three nodes train in this process: one torch thread each
    federation = flmesh.load_federation(HERE / "nodes.toml")
    mixes = [(4, 4, 1, 1), (1, 4, 4, 1), (1, 1, 4, 4)]
    pki = Path(tempfile.mkdtemp(prefix="embedded-pki-"))  # a throwaway CA, one certificate per node
    subprocess.run([str(Path(sys.executable).with_name("fl-certs")), "federation", str(HERE / "nodes.toml"),
                    "--out", str(pki)], check=True, stdout=subprocess.DEVNULL)
    started = [flmesh.Node.from_federation(
        federation, node_id, listen="127.0.0.1:0", model=wave_cnn, learner=ClippedLearner(),
        tls=flmesh.load_tls_identity(pki / "ca.pem", pki / f"{node_id}.pem", pki / f"{node_id}.key", node_id),
        data=flmesh.NodeData(arrays(200, 300 + i, mixes[i]), arrays(50, 400 + i, mixes[i])))
        for i, node_id in enumerate(federation.node_ids)]
    try:
        addresses = {node.node_id: node.start() for node in started}
        for node in started:
            node.connect(addresses)
        reports: dict[str, list[Any]] = {}
        failures: list[BaseException] = []

        def run(node: flmesh.Node) -> None:
            try:
                reports[node.node_id] = node.run(rounds)
            except BaseException as exc:  # reported below; the other nodes' rounds then time out
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(node,)) for node in started]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise SystemExit(f"embedded.py: a node failed: {failures[0]!r}")
    finally:
        for node in started:
            node.stop()
        shutil.rmtree(pki, ignore_errors=True)
    for node_id, done in reports.items():
        last = done[-1].local
        print(f"Node {node_id}: {len(done)} rounds, accuracy {last.accuracy:.3f}, "
              f"macro-F1 {last.metrics['macro_f1']:.3f}")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "runs" / "embedded"
    simulate(out)
    nodes(rounds=3)
