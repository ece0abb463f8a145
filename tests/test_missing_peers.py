"""Who a round names as missing: only a peer whose model really did not arrive.

The in-memory cases use no socket and a manual clock; the process cases
(marked ``faults``) restart, stop and crash real fl-node processes and check
each summary's ``missing_peers`` against what the other nodes' rows say they
got.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from flmesh.config import parse_federation
from flmesh.runtime.inbox import InboxKey

from conftest import tiny_raw, wait_until
from harness import Cluster
from procs import FL_NODE, federation_file, launch, read_results


def fed(**sections):
    return parse_federation(tiny_raw(**sections), source="tiny.toml")


def test_a_model_sent_again_after_its_destination_took_it_is_a_duplicate_not_a_failure():
    """A sender that crashed after delivering and before its checkpoint runs the round again:
    its destination, rounds further on, answers 'duplicate', so nobody is named."""
    f = fed(nodes=4, rounds=8)
    with Cluster(f, "memory") as c:
        sender = c.parts["node0"]
        dest = f.schedule().plan(2)["node0"].destination
        assert dest is not None
        notes: list[str] = []
        assert sender.peer_round.exchange.deliver_onward(2, dest, notes) == (dest, None)
        c.parts[dest].activity.finish_round(4, 0.5)  # it used the model in round 3, and went on
        c.parts[dest].inbox.prune(4)
        assert c.parts[dest].inbox.get(InboxKey(2, "node0", "trained")) is None
        assert sender.peer_round.exchange.deliver_onward(2, dest, notes) == (dest, None) and notes == []


def test_a_destination_that_went_on_without_a_late_model_is_not_named():
    """The sender was away (stopped) until its destination had finished the round that needed
    its model: the destination refuses it as too old; the sender names nobody and hands the
    model to no successor."""
    f = fed(nodes=4, rounds=8)
    with Cluster(f, "memory") as c:
        sender = c.parts["node0"]
        dest = f.schedule().plan(3)["node0"].destination
        assert dest is not None
        c.parts[dest].activity.finish_round(4, 0.5)
        notes: list[str] = []
        assert sender.peer_round.exchange.deliver_onward(3, dest, notes) == (None, None)
        assert notes == [f"{dest} finished round 4 before this node's model came; not sent on"]
        assert not any(n.inbox.held(InboxKey(3, "node0", "trained")) for n in c.parts.values())


def test_a_source_that_finished_while_this_node_was_away_is_not_named():
    """The source finished round 1 (its model went elsewhere while this node could not take
    it): round 2 trains the model it had, and names nobody; a source that never ran round 1
    is still named (tests/test_rounds.py)."""
    f = fed(nodes=3, rounds=3, federation={"round_timeout_s": 60})
    with Cluster(f, "memory") as c:
        me = c.parts["node1"]
        source = f.schedule().plan(2)["node1"].source
        assert source is not None
        c.parts[source].activity.finish_round(1, 0.5)
        report = me.peer_round.run(2)
    assert not report.received and report.missing is None and report.failed == ()
    assert f"{source} finished round 1 while this node could not take its model" in report.notes[0]



def test_a_source_that_sent_a_later_model_and_left_is_not_named():
    """The source's round-1 model went elsewhere while this node was away, and the source has
    since sent this node its round-2 model and left (its run over): it does not answer, but
    the later model says it finished round 1, so it is not named."""
    f = fed(nodes=3, rounds=4, federation={"round_timeout_s": 60})
    with Cluster(f, "memory") as c:
        me = c.parts["node1"]
        source = f.schedule().plan(2)["node1"].source
        assert source is not None and c.network is not None
        me.inbox.put(InboxKey(2, source, "trained"), c.parts[source].encode(round=2))
        c.network.take_down(source)
        report = me.peer_round.run(2)
    assert not report.received and report.missing is None and report.failed == ()
    assert f"{source} finished round 1 while this node could not take its model" in report.notes[0]

# ---------------------------------------------------------------- real processes
KILL_AFTER_ROW_2 = """
import os, signal
from pathlib import Path
_replace = os.replace
def _crash(src, dst, *args, **kwargs):
    # n3 dies after writing its round-2 row and before its round-2 checkpoint (once): it has
    # delivered its round-2 model, and runs round 2 again when resumed
    dst = Path(dst)
    marker = dst.parent / "crashed"
    if (dst.name == "checkpoint.flmesh" and dst.parent.name == "procs-n3" and not marker.exists()
            and (dst.parent / "rounds.jsonl").read_text().count("\\n") == 2):
        marker.write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    return _replace(src, dst, *args, **kwargs)
os.replace = _crash
"""


def _rows(tmp_path, node: str) -> list[dict]:
    from flmesh.reports.run_files import read_rows

    path = tmp_path / "runs" / f"procs-{node}" / "rounds.jsonl"
    return read_rows(path) if path.exists() else []


def _actually_missing(tmp_path, ids: list[str], away: str, rounds: int) -> dict[str, set[str]]:
    """Who each node should name, from what the others' rows say they got: a healthy node names
    ``away`` when a model of its from ``away`` or to ``away`` did not arrive (``away``'s own rows,
    for the models it should have got); ``away`` names nobody, every other peer being healthy."""
    rows = {i: {r["round"]: r["nodes"][i] for r in _rows(tmp_path, i)} for i in ids}
    out: dict[str, set[str]] = {i: set() for i in ids}
    for node in ids:
        if node == away:
            continue
        for t, entry in rows[node].items():
            if entry["source"] == away and entry["received_from"] != away:
                out[node].add(away)  # its model from the away node did not come
            if entry["destination"] == away and t < rounds and rows[away][t + 1]["received_from"] != node:
                out[node].add(away)  # its model did not reach the away node
    return out


def _finish(procs: dict) -> dict[str, str]:
    try:
        return {i: p.communicate(timeout=600)[1] for i, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()


@pytest.mark.faults
def test_a_node_killed_and_resumed_is_named_only_where_its_models_were_missing(tmp_path, monkeypatch):
    """CWT n1 -> n2 -> n3 -> n4 -> n1; n3 is killed after delivering its round-2 model and
    before its checkpoint, and resumed: it runs round 2 again and sends that model again to
    n4, which took it already and is a round further (a duplicate, not a failure)."""
    ids, rounds = ["n1", "n2", "n3", "n4"], 5
    fed = federation_file(tmp_path, ids, rounds=rounds, timeout=30)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_AFTER_ROW_2)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    procs = launch(tmp_path, fed, ids)
    try:
        assert procs["n3"].wait(timeout=300) == -signal.SIGKILL, procs["n3"].communicate()[1][-3000:]
        procs["n3"] = subprocess.Popen(
            [FL_NODE, "--id", "n3", "--federation", str(fed), "--listen",
             (tmp_path / "addr" / "n3.addr").read_text().strip(), "--peers-file",
             str(tmp_path / "addr" / "peers.json"), "--resume", "--insecure"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        errs = _finish(procs)
    assert all(p.returncode == 0 for p in procs.values()), errs
    assert "resuming after round 1" in errs["n3"] and "Traceback" not in "".join(errs.values())
    assert "duplicate trained model from n3 for round 2 ignored" in errs["n4"], "n3 sent it again"
    expected = _actually_missing(tmp_path, ids, "n3", rounds)
    assert expected["n4"] == set(), "n4 got n3's round-2 model (before the crash)"
    for i in ids:
        assert read_results(tmp_path / "runs" / f"procs-{i}")[1]["missing_peers"] == sorted(expected[i]), i


@pytest.mark.faults
def test_a_stopped_node_is_named_where_its_models_were_missing_and_names_nobody(tmp_path):
    """n3 is SIGSTOPped until n2 has handed a model to n4 (n3's successor) instead, then
    SIGCONTed: n2 names n3, n1 nobody, n4 n3 if it took n2's model in place of n3's; and n3
    names neither n2 (which finished its rounds while n3 could not take the models) nor n4
    (which went on without n3's late model)."""
    ids, rounds = ["n1", "n2", "n3", "n4"], 8
    fed = federation_file(tmp_path, ids, rounds=rounds, timeout=8)
    procs = launch(tmp_path, fed, ids)
    try:
        wait_until(lambda: len(_rows(tmp_path, "n3")) >= 2, timeout=300)
        procs["n3"].send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: any(r["nodes"]["n2"]["delivered_to"] == "n4" for r in _rows(tmp_path, "n2")),
                       timeout=300, interval=0.05)
        finally:
            procs["n3"].send_signal(signal.SIGCONT)
    finally:
        errs = _finish(procs)
    assert all(p.returncode == 0 for p in procs.values()), errs
    expected = _actually_missing(tmp_path, ids, "n3", rounds)
    assert expected["n1"] == set() and expected["n2"] == {"n3"} and expected["n4"] <= {"n3"}
    for i in ids:
        assert read_results(tmp_path / "runs" / f"procs-{i}")[1]["missing_peers"] == sorted(expected[i]), \
            errs[i][-3000:]
    notes = [n for r in _rows(tmp_path, "n3") for n in r["notes"]]
    assert any("n2 finished round" in n for n in notes), notes


AGGREGATOR_DIES_BEFORE_ITS_ROUND_2_CHECKPOINT = """
import os, signal
from pathlib import Path
_replace = os.replace
def _crash(src, dst, *args, **kwargs):
    # the aggregator dies after its round-2 row and before its round-2 checkpoint (once): it
    # had acknowledged every round-2 update, and the nodes do not send them again
    dst = Path(dst)
    marker = dst.parent / "crashed"
    if (dst.name == "checkpoint.flmesh" and dst.parent.name == "procs-aggregator" and not marker.exists()
            and (dst.parent / "rounds.jsonl").read_text().count("\\n") == 2):
        marker.write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    return _replace(src, dst, *args, **kwargs)
os.replace = _crash
"""


@pytest.mark.faults
def test_an_aggregator_killed_and_resumed_names_nobody_and_no_node_names_anyone(tmp_path, monkeypatch):
    """The aggregator is killed after acknowledging every round-2 update and before its
    round-2 checkpoint, and resumed: it runs round 2 again with the updates it kept, so it
    names no node, and the nodes, which reconnect, name nobody either."""
    ids = ["a", "b", "c"]
    fed = federation_file(tmp_path, ids, rounds=4, timeout=10, graph="complete",
                          extra='[aggregator]\nstrategy = "fedavg"\ndeadline_s = 10\n')
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(AGGREGATOR_DIES_BEFORE_ITS_ROUND_2_CHECKPOINT)
    monkeypatch.setenv("PYTHONPATH", str(hook))

    def aggregator(*extra: str) -> subprocess.Popen:
        return subprocess.Popen([FL_NODE, "--role", "aggregator", "--federation", str(fed), "--insecure",
                                 *extra], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)

    ready = tmp_path / "agg.addr"
    first = aggregator("--listen", "127.0.0.1:0", "--ready-file", str(ready))
    procs: dict[str, subprocess.Popen] = {}
    try:
        wait_until(lambda: ready.exists() or first.poll() is not None, timeout=120)
        address = ready.read_text().strip()
        procs = launch(tmp_path, fed, ids, "--aggregator", address)
        assert first.wait(timeout=300) == -signal.SIGKILL, first.communicate()[1][-3000:]
        procs["aggregator"] = aggregator("--listen", address, "--resume")
    finally:
        errs = _finish(procs)
        first.kill()
    assert all(p.returncode == 0 for p in procs.values()), errs
    assert "resuming after round 1" in errs["aggregator"] and "Traceback" not in "".join(errs.values())
    rows, summary = read_results(tmp_path / "runs" / "procs-aggregator")
    assert [(r["round"], r["missing"]) for r in rows] == [(t, []) for t in range(1, 5)], errs["aggregator"]
    assert summary["missing_peers"] == []
    for i in ids:
        assert read_results(tmp_path / "runs" / f"procs-{i}")[1]["missing_peers"] == [], i


def _core():
    import torch

    from flmesh.aggregator.core import AggregatorCore
    from flmesh.algorithms.fedavg import FedAvgServer
    from flmesh.clock import ManualClock
    from flmesh.format.codec import model_spec

    raw = tiny_raw(nodes=3, rounds=3, aggregator={"fraction": 1.0, "deadline_s": 30.0})
    state = {"w": torch.zeros(2)}
    return AggregatorCore(parse_federation(raw), initial=state, server=FedAvgServer(), strategy="fedavg",
                          model_spec=model_spec(state), update_spec={}, clock=ManualClock())


def _update(node: str, round: int, value: float):
    import torch

    from flmesh.format.codec import ModelMeta, encode

    meta = ModelMeta(round=round, sender=node, kind="update", num_samples=1, label_counts=(1, 0))
    return encode({"w": torch.full((2,), value)}, meta).chunks()


def test_an_update_is_stored_before_it_is_accepted_and_a_restarted_aggregator_takes_it_back(tmp_path):
    """An update the aggregator acknowledged is not sent again: a restarted aggregator takes
    back the kept ones of the round it opens, and does not name their nodes missing. One it
    cannot store is refused INTERNAL and not accepted."""
    from flmesh.aggregator.checkpoint import keep_update, kept_updates
    from flmesh.transports.errors import Refused

    blocked = tmp_path / "taken.txt"
    blocked.write_text("a file where the state folder should be")
    core = _core()
    core.keep = lambda update: keep_update(blocked, update)
    core.open_round(1)
    with pytest.raises(Refused) as refused:
        core.submit(None, _update("node0", 1, 1.0))
    assert refused.value.code == "INTERNAL" and f"aggregator: cannot store the update: {blocked}" in str(
        refused.value)
    core.keep = lambda update: keep_update(tmp_path / "out", update)
    assert core.submit(None, _update("node0", 1, 1.0)).accepted, "the retry is stored and accepted"
    assert core.submit(None, _update("node1", 1, 3.0)).accepted
    # the aggregator dies here, before its round-1 checkpoint; node0 and node1 will not send again
    again = _core()
    again.take_back(kept_updates(tmp_path / "out", 1, again.update_spec))
    again.open_round(1)
    again.wait_for_updates(1, deadline=again.clock.now() + 30)  # node2 never comes
    outcome = again.close_round(1)
    assert outcome.received == ["node0", "node1"] and outcome.missing == ["node2"]
    assert again.global_state["w"].tolist() == [2.0, 2.0]
