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
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from flmesh.reports.run_files import read_rows

from conftest import wait_until

FL_NODE = str(Path(sys.executable).with_name("fl-node"))


#: A star federation's aggregator (FedAvg, no public split): ``extra`` of :func:`federation_file`.
STAR = """
[aggregator]
strategy = "fedavg"
deadline_s = 60
public_fraction = 0.0
"""
#: Two tasks of novel targets (two nodes, then four) with DP replay by clients.
CONTINUAL_REPLAY = """
[tasks]
scenario = "novel_targets"
tasks = 2
rounds_per_task = 1
initial_clients = 2
joining_clients = 2
participation = "full"
[replay]
mode = "client"
epsilon = 10.0
"""


def federation_file(tmp_path: Path, ids: list[str], *, rounds: int, extra: str = "",
                    node_extra: dict[str, str] | None = None, timeout: float = 60,
                    graph: str = "ring", schedule: str = "cwt") -> Path:
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
schedule = "{schedule}"

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
    plain = [] if any(e.startswith("--tls") for e in extra) else ["--insecure"]  # mTLS: the caller's flags
    procs = {i: subprocess.Popen([FL_NODE, "--id", i, "--federation", str(fed), "--listen", "127.0.0.1:0",
                                  "--ready-file", str(work / f"{i}.addr"), "--peers-file",
                                  str(work / "peers.json"), *plain, *extra],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in ids}
    wait_until(lambda: all((work / f"{i}.addr").exists() or procs[i].poll() is not None for i in ids),
               timeout=120)
    addresses = {i: (work / f"{i}.addr").read_text().strip() for i in ids}
    (work / ".peers.json").write_text(json.dumps(addresses))
    os.replace(work / ".peers.json", work / "peers.json")
    return procs


Star = tuple[subprocess.Popen, str, str, dict[str, subprocess.Popen], dict[str, str]]


def run_star(tmp_path: Path, fed: Path, ids: list[str]) -> Star:
    """An ``fl-node --role aggregator`` on port 0 and one fl-node per id joining it, run to their
    end: (aggregator, its stdout, its stderr, the nodes, each node's stderr)."""
    ready = tmp_path / "agg.addr"
    agg = subprocess.Popen([FL_NODE, "--role", "aggregator", "--federation", str(fed), "--listen",
                            "127.0.0.1:0", "--insecure", "--ready-file", str(ready)], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs: dict[str, subprocess.Popen] = {}
    try:
        wait_until(lambda: ready.exists() or agg.poll() is not None, timeout=120)
        procs = launch(tmp_path, fed, ids, "--aggregator", ready.read_text().strip())
        agg_out, agg_err = agg.communicate(timeout=300)
        errs = {i: p.communicate(timeout=300)[1] for i, p in procs.items()}
    finally:
        for p in [agg, *procs.values()]:
            p.kill()
    return agg, agg_out, agg_err, procs, errs


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a /metrics page: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def metrics_url(proc: subprocess.Popen) -> str:
    """The URL the process announced on stdout (its first line, before 'listening on')."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "metrics on http://" in line, line
    return line.split("metrics on ", 1)[1].strip()
