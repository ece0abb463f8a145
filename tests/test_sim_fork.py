"""fl-sim's worker processes forked after the imports (coordinator/sim_fork.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from flmesh.coordinator.sim_cpus import worker_cpus
from flmesh.coordinator.sim_fork import ForkedWorker, can_fork
from flmesh.node.wire.channels import grpc_started, make_channel

DEADLINE_S = 60.0  # a wait that ends much sooner, unless the behaviour under test is broken


def shout(inbox: IO[str], outbox: IO[str]) -> int:
    outbox.write(inbox.readline().upper())
    outbox.flush()
    return 3


def until_closed(inbox: IO[str], outbox: IO[str]) -> int:
    for _ in inbox:
        pass
    return 0


def test_a_forked_worker_talks_over_its_pipes_and_exits_with_its_code():
    worker = ForkedWorker(shout)
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write("hello\n")
    worker.stdin.flush()
    assert worker.stdout.readline() == "HELLO\n"
    assert worker.wait(timeout=DEADLINE_S) == 3


def test_a_later_worker_does_not_hold_an_earlier_ones_pipe_open():
    """The second child is forked while the first one's pipe ends are open here; unless it
    closes them, the first never sees its parent's end close and never exits."""
    first = ForkedWorker(until_closed)
    second = ForkedWorker(until_closed)
    assert first.stdin is not None and second.stdin is not None
    first.stdin.close()
    assert first.wait(timeout=DEADLINE_S) == 0
    second.stdin.close()
    assert second.wait(timeout=DEADLINE_S) == 0


def test_a_worker_that_does_not_exit_times_out_and_can_be_killed():
    worker = ForkedWorker(until_closed)
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(timeout=0.2)
    worker.kill()
    assert worker.wait(timeout=DEADLINE_S) < 0, "ended by a signal"


def test_no_fork_once_this_process_has_made_grpc():
    make_channel("127.0.0.1:9").close()
    assert grpc_started() and not can_fork()


def test_a_fresh_process_can_fork():
    code = "from flmesh.coordinator.sim_fork import can_fork; print(can_fork())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.stdout.strip() == ("True" if sys.platform == "linux" else "False"), done.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fl-sim forks its workers on Linux only")
@pytest.mark.parametrize("kind", ["peer", "star"])
def test_fl_sim_forks_its_workers_and_gives_the_numbers_of_one_process(tmp_path: Path, kind: str):
    """A fresh fl-sim forks its two workers (TLS on, rewinds between them; with an aggregator
    in fl-sim for the star) and its rows are those of the single-process run. The peer run's
    workers keep to a CPU each (as ``worker_cpus`` shares them out); the star run's, with
    ``--no-pin``, may run on every CPU: the rows do not depend on it."""
    from test_sim import STAR, TINY

    file = tmp_path / "federation.toml"
    file.write_text(TINY if kind == "peer" else STAR)
    allowed = sorted(os.sched_getaffinity(0))
    rows = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        fl_sim = str(Path(sys.executable).parent / "fl-sim")
        done = subprocess.run([fl_sim, str(file), "--workers", str(workers), "--tls", "--rounds", "3",
                               "--out", str(out), "--quiet", "--set", 'rewind.mode="previous"',
                               *(["--no-pin"] if kind == "star" else [])],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        rows[workers] = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
        config = json.loads((out / "summary.json").read_text())["config"]
        assert config.get("workers_started") == (None if workers == 1 else "fork")
        if workers == 2:
            pinned = worker_cpus(allowed, 2) if kind == "peer" else [allowed, allowed]
            assert config["worker_cpus"] == pinned
    same = ("round", "fa", "ff", "pfa", "accuracy_matrix", "accuracy", "selected")
    assert [[r.get(k) for k in same] for r in rows[1]] == [[r.get(k) for k in same] for r in rows[2]]


def _children(pid: int, helper: bool = False) -> list[int]:
    """fl-sim's worker processes (``helper``: its picture helper instead, forked or launched)."""
    from flmesh.coordinator.picture_helper import FORK_NAME

    path = Path(f"/proc/{pid}/task/{pid}/children")
    found = [int(c) for c in path.read_text().split()] if path.exists() else []
    return [c for c in found if helper == (b"picture_helper" in Path(f"/proc/{c}/cmdline").read_bytes()
                                           or Path(f"/proc/{c}/comm").read_text().strip() == FORK_NAME)]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fl-sim forks its workers on Linux only")
def test_a_worker_that_dies_mid_run_ends_the_run_with_one_line(tmp_path: Path):
    """A worker killed mid-run: the others would wait at the round's lock-step for its nodes
    forever; fl-sim instead stops, says which worker ended and how, keeps the rows so far,
    and exits 1."""
    import os
    import signal

    from test_sim import TINY

    from conftest import wait_until

    file, out = tmp_path / "tiny.toml", tmp_path / "run"
    file.write_text(TINY)
    fl_sim = str(Path(sys.executable).parent / "fl-sim")
    proc = subprocess.Popen([fl_sim, str(file), "--workers", "2", "--rounds", "100000", "--out", str(out),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows = out / "rounds.jsonl"
    try:
        wait_until(lambda: proc.poll() is not None or rows.exists() and rows.read_text().count("\n") >= 2,
                   timeout=DEADLINE_S)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        workers = _children(proc.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 1
    lines = [line for line in err.splitlines() if line.startswith("fl-sim: error:")]
    said = f"pid {workers[0]}) exited before its nodes finished (exit code -9)"
    assert len(lines) == 1 and said in lines[0], err
    assert rows.read_text().count("\n") >= 2, "the rows so far are kept"


LOCKSTEP_PROBE = """
import json, os, sys, time
import flmesh.coordinator.sim_cli, flmesh.coordinator.sim_worker as sim_worker, flmesh.node.node
from flmesh.node.learning import trainer
from flmesh.node.node import Node

def note(kind, node, round):  # one O_APPEND write per line, from every process
    line = json.dumps([time.monotonic(), kind, node, round]) + "\\n"
    os.write(LOG, line.encode())

LOG = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
run_round, finish_round, evaluate, report_json = (Node.run_round, Node.finish_round, trainer.evaluate,
                                                  sim_worker.report_json)
def run_round_(self, round):
    note("start", self.node_id, round)
    return run_round(self, round)
def finish_round_(self, round, accuracy):
    note("finish", self.node_id, round)
    finish_round(self, round, accuracy)
def evaluate_(*args, **kwargs):  # fl-sim's cross-evaluation only: the nodes bound theirs at import
    note("eval", None, None)
    return evaluate(*args, **kwargs)
def report_json_(report, evals):
    note("reported", report.node, report.round)
    return report_json(report, evals)
Node.run_round, Node.finish_round, trainer.evaluate = run_round_, finish_round_, evaluate_
sim_worker.report_json = report_json_
sys.exit(flmesh.coordinator.sim_cli.main(sys.argv[2:]))
"""


EVALUATIONS_PROBE = """
import os, sys
import flmesh.coordinator.aggregator as aggregator, flmesh.coordinator.sim_cli
from flmesh.node.learning import trainer

LOG = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
evaluate = trainer.evaluate
def worker_evaluate(*args, **kwargs):  # every evaluation in the workers
    os.write(LOG, b"e")
    return evaluate(*args, **kwargs)
trainer.evaluate = worker_evaluate
calls = []
make = aggregator.local_evaluator
def local_evaluator(*args, **kwargs):  # fl-sim's in-process evaluator, counted
    evaluate = make(*args, **kwargs)
    def counted(state, task):
        calls.append(1)
        return evaluate(state, task)
    return counted
aggregator.local_evaluator = local_evaluator
code = flmesh.coordinator.sim_cli.main(sys.argv[2:])
print("evaluations in fl-sim:", len(calls))
sys.exit(code)
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fl-sim forks its workers on Linux only")
def test_star_workers_evaluate_their_own_updates_when_models_travel_exactly(tmp_path: Path):
    """fl-sim (the aggregator) evaluates only the global models when the wire is exact: the
    workers send each update's evaluations with the reports (the numbers are those of one
    process: test_fl_sim_forks_its_workers_and_gives_the_numbers_of_one_process), each on
    the other nodes' splits, its own split's being the node's own report's. With a lossy
    wire the update the aggregator holds is not the node's model, so it evaluates each."""
    from test_sim import STAR

    file = tmp_path / "star.toml"
    file.write_text(STAR)
    counts, updates, in_workers = {}, {}, {}
    for dtype in ("native", "float16"):
        out, log = tmp_path / dtype, tmp_path / f"{dtype}.log"
        done = subprocess.run([sys.executable, "-c", EVALUATIONS_PROBE, str(log), str(file), "--workers", "2",
                               "--rounds", "3", "--out", str(out), "--quiet",
                               "--set", f'wire.dtype="{dtype}"'], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        counts[dtype] = int(done.stdout.split("evaluations in fl-sim:")[1].split()[0])
        in_workers[dtype] = len(log.read_bytes()) if log.exists() else 0
        rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
        updates[dtype] = sum(len(r["received"]) for r in rows)
        assert all(r["fa"] is not None for r in rows)
    assert updates["native"] >= 3 and updates["float16"] >= 3
    assert counts["native"] == 1 + 3, "the starting model and each round's global model only"
    assert counts["float16"] == 1 + 3 + updates["float16"]
    # a trained node evaluates its start and trained models on its own split; with an exact
    # wire its worker adds the update on the 2 other nodes' splits (its own is the report's)
    assert in_workers["float16"] == 2 * updates["float16"]
    assert in_workers["native"] == (2 + 2) * updates["native"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fl-sim forks its workers on Linux only")
def test_workers_keep_the_rounds_in_lock_step(tmp_path: Path):
    """As in one process (tests/test_sim.py): across the two forked workers no model is
    cross-evaluated before every node has finished the round, and no node starts a round
    before every node has reported the last one. The workers inherit the probes by fork and
    log to one file; the order is the monotonic clock's, which every process shares."""
    from test_sim import TINY

    file, log = tmp_path / "tiny.toml", tmp_path / "events.jsonl"
    file.write_text(TINY)
    done = subprocess.run([sys.executable, "-c", LOCKSTEP_PROBE, str(log), str(file), "--workers", "2",
                           "--rounds", "4", "--out", str(tmp_path / "run"), "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    events = sorted(json.loads(line) for line in log.read_text().splitlines())
    finished: dict[str, int] = {}
    reported: dict[str, int] = {}
    evals = starts = 0
    for _, kind, node, round in events:
        if kind == "finish":
            finished[node] = round
        elif kind == "reported":
            reported[node] = round
        elif kind == "eval":
            evals += 1
            assert len(finished) == 3 and len(set(finished.values())) == 1, finished
        elif kind == "start" and round > 1:
            starts += 1
            assert len(reported) == 3 and set(reported.values()) == {round - 1}, (node, round, reported)
    assert evals == 4 * 3 * 2, "4 rounds x 3 models x the 2 other splits (the diagonal is reported)"
    assert starts == 3 * 3


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fl-sim forks its workers on Linux only")
def test_sigterm_to_the_process_group_stops_the_run_cleanly(tmp_path: Path):
    """A stop sent to fl-sim's whole process group (a service manager, a container runtime)
    reaches the workers too. They leave it to fl-sim, which stops them after the round in
    progress: exit 130, the rows so far and an interrupted summary, no error, no process
    left (a worker that died of the signal had made it a failed run)."""
    import os
    import signal

    from test_sim import TINY

    from conftest import wait_until

    file, out = tmp_path / "tiny.toml", tmp_path / "run"
    file.write_text(TINY)
    fl_sim = str(Path(sys.executable).parent / "fl-sim")
    proc = subprocess.Popen([fl_sim, str(file), "--workers", "2", "--rounds", "100000", "--out", str(out),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    rows = out / "rounds.jsonl"
    try:
        wait_until(lambda: proc.poll() is not None or rows.exists() and rows.read_text().count("\n") >= 2,
                   timeout=DEADLINE_S)
        workers, helper = _children(proc.pid), _children(proc.pid, helper=True)
        assert proc.poll() is None and len(workers) == 2 and len(helper) == 1
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert not [line for line in err.splitlines() if line.startswith("fl-sim: error")], err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["rounds"] == rows.read_text().count("\n") >= 2
    assert not any(Path(f"/proc/{w}").exists() for w in workers), "every worker exited"
    assert not Path(f"/proc/{helper[0]}").exists(), "the picture helper too (after drawing)"
    assert sorted(summary["pictures"]) == sorted(str(out / n) for n in ("accuracy.png", "per_class.png"))


def test_a_process_that_exits_without_stopping_its_workers_does_not_hang():
    """Workers ignore SIGTERM (fl-sim stops them over the pipe), so multiprocessing's exit
    handler, which sends SIGTERM to daemonic children and waits for them, would wait for ever
    for a worker nobody stopped (an interrupt while they started): they are killed instead."""
    code = """
import signal
from flmesh.coordinator.sim_fork import ForkedWorker

def deaf(inbox, outbox):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    outbox.write("ready\\n")
    outbox.flush()
    for _ in inbox:
        pass
    return 0

worker = ForkedWorker(deaf)
assert worker.stdout.readline() == "ready\\n"
print(worker.pid, flush=True)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "the worker is gone"
