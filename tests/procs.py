"""fl-node processes for tests: a federation file, launching nodes on port 0, reading results.

No port is guessed: every process binds port 0 and announces the address it
got (``--ready-file``); :func:`launch` collects them into the peers file the
nodes read while they wait for each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flmesh.node.results import read_rows

from conftest import wait_until

FL_NODE = str(Path(sys.executable).with_name("fl-node"))


def federation_file(tmp_path: Path, ids: list[str], *, rounds: int, extra: str = "",
                    node_extra: dict[str, str] | None = None, timeout: float = 60,
                    graph: str = "ring") -> Path:
    nodes = "".join(f"[nodes.{i}]\n{(node_extra or {}).get(i, '')}\n" for i in ids)
    path = tmp_path / "fed.toml"
    path.write_text(f"""
[federation]
name = "procs"
seed = 4
rounds = {rounds}
round_timeout_s = {timeout}

[topology]
graph = "{graph}"

[training]
epochs = 1
batch_size = 16
lr = 0.05

[data]
alpha = 0.5

[model]
hidden = [16]
{extra}
{nodes}""")
    return path


def read_results(run_dir: Path):
    return read_rows(run_dir / "rounds.jsonl"), json.loads((run_dir / "summary.json").read_text())


def launch(tmp_path: Path, fed: Path, ids: list[str], *extra: str) -> dict[str, subprocess.Popen]:
    """Start one fl-node per id on port 0; once all announced, write the peers file they read."""
    work = tmp_path / "addr"
    work.mkdir(exist_ok=True)
    procs = {i: subprocess.Popen([FL_NODE, "--id", i, "--federation", str(fed), "--listen", "127.0.0.1:0",
                                  "--ready-file", str(work / f"{i}.addr"), "--peers-file",
                                  str(work / "peers.json"), *extra],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in ids}
    wait_until(lambda: all((work / f"{i}.addr").exists() or procs[i].poll() is not None for i in ids),
               timeout=120)
    addresses = {i: (work / f"{i}.addr").read_text().strip() for i in ids}
    (work / ".peers.json").write_text(json.dumps(addresses))
    os.replace(work / ".peers.json", work / "peers.json")
    return procs


