"""The replay host refuses what no honest client sends: a release or a withheld marker for a task
the client has not left, metadata of the wrong type, a bad wait, and (under mTLS) anyone acting
for another client. Through a real ReplayBuffer server on 127.0.0.1:0 and the in-memory
transport; every refusal is one line and leaves the buffer and the privacy ledger alone."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from flmesh.config import parse_federation
from flmesh.format.codec import EncodedModel, ModelMeta, encode
from flmesh.replay.buffer import ReplayBufferCore
from flmesh.transports.errors import PeerError
from flmesh.transports.grpc.channels import make_channel
from flmesh.transports.grpc.replay_client import GrpcReplayTransport
from flmesh.transports.grpc.replay_service import SERVICE_NAME, add_replay
from flmesh.transports.grpc.server import serve
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.memory.network import MemoryNetwork, MemoryReplayTransport
from flmesh.v1 import replay_pb2, replay_pb2_grpc

from conftest import identities, tiny_raw

SHAPE = (1, 8, 8)


class Host:
    """A replay buffer whose clients can be in at most round ``latest`` (the host's progress)."""

    def __init__(self) -> None:
        raw = tiny_raw(nodes=4, rounds=6, data={"partition": "iid"},
                       tasks={"tasks": 3, "rounds_per_task": 2, "initial_clients": 2, "joining_clients": 1})
        raw["replay"] = {"mode": "client", "epsilon": 10.0, "min_count": 3}
        self.latest = 1
        self.core = ReplayBufferCore(parse_federation(raw, source="r.toml"), SHAPE, 10,
                                     progress=lambda: self.latest)

    def serve(self, tls: Tls | None = None) -> tuple[grpc.Server, str]:
        server, _, address = serve(lambda s: add_replay(s, self.core), SERVICE_NAME, "127.0.0.1:0", tls=tls)
        return server, address

    def untouched(self) -> bool:
        status = self.core.status(None)
        return self.core.ledger.releases == [] and status.version == 0 and not status.contributions


def release(sender: str = "node0", **metadata: Any) -> EncodedModel:
    """A release of class 0 (task 0's), or a withheld marker (no means) with ``withheld=True``."""
    metadata = {"task": 0, "epsilon": 10.0, "withheld": False, **metadata}
    means, counts = torch.zeros((10, *SHAPE)), torch.zeros(10, dtype=torch.long)
    if metadata["withheld"] is not True:
        means[0], counts[0] = 0.5, 5
    metadata = {k: v for k, v in metadata.items() if v is not None}  # None: leave the key out
    return encode({"means": means, "counts": counts}, ModelMeta(sender=sender, kind="contribution",
                                                                  metadata=metadata))


BAD_RELEASES = [
    ("future-task", release(), "node0 has not reached the end of task 0: its release comes in round 3, "
     "and no client is past round 1"),
    ("future-withheld", release(withheld=True), "node0 has not reached the end of task 0: its release comes "
     "in round 3, and no client is past round 1"),
    ("last-task", release(task=2), "task 2 is the stream's last: no release follows it"),
    ("task-text", release(task="0"), "metadata task: expected an integer, got '0' (str)"),
    ("task-bool", release(task=True), "metadata task: expected an integer, got 'True' (bool)"),
    ("task-missing", release(task=None), "metadata task: missing"),
    ("task-negative", release(task=-1), "task -1 is not a task of the stream (0..2)"),
    ("epsilon-text", release(epsilon="ten"), "metadata epsilon: expected a number, got 'ten' (str)"),
    ("epsilon-nan", release(epsilon=float("nan")), "epsilon nan differs from the federation's 10"),
    ("withheld-text", release(withheld="no"), "metadata withheld: expected true or false, got 'no' (str)"),
    ("extra-key", release(note="hi"), "metadata 'note' is not one of task, epsilon, withheld"),
]


def _refused(call: Any) -> PeerError:
    with pytest.raises(PeerError) as err:
        call()
    assert "\n" not in str(err.value), "one line"
    return err.value


def test_bad_releases_and_waits_are_invalid_argument_over_grpc_with_no_traceback(caplog):
    host = Host()
    server, address = host.serve()
    client = GrpcReplayTransport(address)
    channel = make_channel(address)
    try:
        with caplog.at_level(logging.WARNING):
            for name, bad, message in BAD_RELEASES:
                err = _refused(lambda bad=bad: client.contribute(bad, timeout=10))
                assert (err.code, err.details) == ("INVALID_ARGUMENT", f"replay buffer: {message}"), name
            for wait_s in (float("nan"), -1.0, float("inf")):
                request = replay_pb2.FetchBufferRequest(node_id="node0", task=1, wait_s=wait_s)
                with pytest.raises(grpc.RpcError) as wait:
                    list(replay_pb2_grpc.ReplayBufferStub(channel).FetchBuffer(request, timeout=10))
                assert wait.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert wait.value.details() == (f"replay buffer: wait_s: expected a number of seconds >= 0, "
                                                f"got {wait_s!r}")
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "nothing logged as a crash"
        assert host.untouched()
        host.latest = 3  # the federation is in task 1 now: task 0's releases come
        assert client.contribute(release("node0"), timeout=10).spent == 10.0, "the real one is not blocked"
        assert not client.contribute(release("node1", withheld=True), timeout=10).accepted
        assert host.core.ledger.totals() == {"node0": 10.0}
    finally:
        channel.close()
        client.close()
        server.stop(0)


def test_under_mtls_no_other_process_spends_a_clients_budget(tmp_path):
    ids = identities(tmp_path, ["node0", "node1", "aggregator", "mallory"])
    host = Host()
    host.latest = 3
    server, address = host.serve(ids["aggregator"])
    clients = {i: GrpcReplayTransport(address, tls=ids[i], host_id="aggregator") for i in ("node0", "node1",
                                                                                          "mallory")}
    try:
        for who in ("mallory", "node1"):  # an outsider with a certificate of the CA, another member
            err = _refused(lambda who=who: clients[who].contribute(release("node0"), timeout=10))
            assert (err.code, err.details) == ("PERMISSION_DENIED", "replay buffer: the release claims to "
                                               f"come from 'node0' but was sent by {who!r}")
            err = _refused(lambda who=who: clients[who].contribute(release("node0", withheld=True),
                                                                   timeout=10))
            assert err.code == "PERMISSION_DENIED"
        err = _refused(lambda: clients["mallory"].fetch("node0", 1, expected={}, wait_s=0))
        assert err.details == "replay buffer: 'mallory' may not fetch for 'node0'"
        err = _refused(lambda: clients["mallory"].status("node0", timeout=10))
        assert err.details == "replay buffer: 'mallory' is not in this federation"
        assert host.untouched()
        assert clients["node0"].contribute(release("node0"), timeout=10).spent == 10.0
        assert host.core.ledger.totals() == {"node0": 10.0}
    finally:
        for c in clients.values():
            c.close()
        server.stop(0)


def test_the_in_memory_transport_refuses_the_same_releases():
    host = Host()
    network = MemoryNetwork()
    network.register_replay(host.core)
    node0, node1 = MemoryReplayTransport(network, "node0"), MemoryReplayTransport(network, "node1")
    for name, bad, message in BAD_RELEASES:
        err = _refused(lambda bad=bad: node0.contribute(bad, timeout=10))
        assert (err.code, err.details) == ("INVALID_ARGUMENT", f"replay buffer: {message}"), name
    host.latest = 3
    err = _refused(lambda: node1.contribute(release("node0"), timeout=10))
    assert err.details == "replay buffer: the release claims to come from 'node0' but was sent by 'node1'"
    assert host.untouched()
    assert node0.contribute(release("node0"), timeout=10).accepted


def test_a_continual_star_federation_over_mtls_releases_and_fetches_as_before(tmp_path):
    """The host's progress (the aggregator's round) and the caller checks let every honest
    release and fetch through."""
    from flmesh.sim.simulation import Simulation

    raw = tiny_raw(nodes=4, rounds=4, data={"partition": "iid"},
                   tasks={"scenario": "novel_targets", "tasks": 2, "rounds_per_task": 2, "initial_clients": 2,
                          "joining_clients": 2, "participation": "full"},
                   aggregator={"fraction": 1.0, "deadline_s": 60})
    raw["replay"] = {"mode": "client", "epsilon": 10.0}
    fed = parse_federation(raw, source="c.toml")
    with Simulation(fed, tmp_path, transport="grpc") as sim:  # mTLS by default
        summary = sim.run()
    assert summary.final is not None and not summary.missing_peers
    assert summary.privacy_spent == {"node0": 10.0, "node1": 10.0}, "both initial clients released task 0"


@pytest.mark.parametrize("transport", ["grpc", "memory"])
def test_a_ledger_that_cannot_be_written_refuses_the_release_internal_in_one_line(tmp_path, caplog,
                                                                                    transport):
    """A directory where the privacy ledger goes (as a full disk or a read-only folder would):
    the release is refused INTERNAL naming the file, nothing is counted, no traceback is
    logged, and the host's end-of-run check raises the one-line write error; once the ledger
    can be written, the same release goes through."""
    from flmesh.format.state_file import StateWriteError
    from flmesh.replay.buffer import ReplayBufferCore

    host = Host()
    host.latest = 3
    host.core = ReplayBufferCore(host.core.federation, SHAPE, 10, state_dir=tmp_path,
                                 progress=lambda: host.latest)
    ledger = tmp_path / "privacy_ledger.json"
    ledger.mkdir()  # made after the host started: its first write fails
    host.core.check_written()  # nothing failed yet
    if transport == "grpc":
        server, address = host.serve()
        client: Any = GrpcReplayTransport(address)
    else:
        network = MemoryNetwork()
        network.register_replay(host.core)
        client = MemoryReplayTransport(network, "node0")
    try:
        with caplog.at_level(logging.WARNING):
            err = _refused(lambda: client.contribute(release("node0"), timeout=10))
        said = f"{ledger}: cannot write: Is a directory"
        assert (err.code, err.details) == ("INTERNAL", f"replay buffer: cannot record the release of node0: "
                                           f"{said}")
        assert host.untouched(), "the release is not counted as stored"
        assert [r.getMessage() for r in caplog.records] == [f"replay buffer: {said}"]
        assert not any(r.exc_info for r in caplog.records), "no traceback"
        with pytest.raises(StateWriteError) as failed:
            host.core.check_written()
        assert str(failed.value) == said
        ledger.rmdir()
        assert client.contribute(release("node0"), timeout=10).spent == 10.0, "the retry is stored"
        assert host.core.ledger.totals() == {"node0": 10.0} and ledger.is_file()
        with pytest.raises(StateWriteError):
            host.core.check_written()  # the failed write still ends the run non-zero
    finally:
        client.close()
        if transport == "grpc":
            server.stop(0)


FULL_LEDGER_DISK = """
import errno, os
_replace = os.replace
def _full(src, dst, *args, **kwargs):
    if str(dst).endswith("privacy_ledger.json"):  # the disk is full when the ledger is written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _replace(src, dst, *args, **kwargs)
os.replace = _full
"""


def fill_the_ledger_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes launched from now on find the disk full when they write a privacy ledger."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FULL_LEDGER_DISK)
    monkeypatch.setenv("PYTHONPATH", str(hook))


@pytest.mark.faults  # a full disk under real processes: make test-faults
def test_an_aggregator_whose_ledger_cannot_be_written_runs_on_and_exits_1_in_one_line(tmp_path, monkeypatch):
    """A full disk under the aggregator's privacy ledger (tests/test_state.py's way): each
    release is refused, the rounds go on, and the aggregator ends non-zero with one error
    line naming the ledger, as after a checkpoint that could not be written."""
    from procs import CONTINUAL_REPLAY, STAR, federation_file, read_results, run_star

    ids = ["a", "b", "c", "d"]
    fed = federation_file(tmp_path, ids, rounds=2, graph="complete", extra=STAR + CONTINUAL_REPLAY)
    fill_the_ledger_disk(tmp_path, monkeypatch)
    agg, _, agg_err, procs, errs = run_star(tmp_path, fed, ids)
    said = "runs/procs-aggregator/privacy_ledger.json: cannot write: No space left on device"
    assert agg.returncode == 1, agg_err[-3000:]
    assert "Traceback" not in agg_err + "".join(errs.values())
    said_lines = [line for line in agg_err.splitlines() if "error" in line]
    assert said_lines == [f"fl-node aggregator: error: {said}"]
    assert all(p.returncode == 0 for p in procs.values()), errs
    assert all(f"cannot record the release of {i}: {said}" in errs[i] for i in ("a", "b")), errs
    rows, summary = read_results(tmp_path / "runs/procs-aggregator")
    assert [r["round"] for r in rows] == [1, 2] and not rows[-1]["privacy_spent"]
    assert summary["error"] == said and summary["interrupted"]
    assert not (tmp_path / "runs/procs-aggregator/privacy_ledger.json").exists()


@pytest.mark.faults  # a full disk under real processes: make test-faults
def test_a_node_hosting_the_buffer_whose_ledger_cannot_be_written_exits_1_in_one_line(tmp_path, monkeypatch):
    """The same full disk under the privacy ledger of the node that hosts the buffer (a peer
    federation): the node finishes its rounds, then ends non-zero with one error line naming
    the ledger; the other nodes end as usual."""
    from procs import CONTINUAL_REPLAY, federation_file, launch, read_results

    ids = ["a", "b", "c", "d"]
    fed = federation_file(tmp_path, ids, rounds=2, timeout=30, extra=CONTINUAL_REPLAY)
    fill_the_ledger_disk(tmp_path, monkeypatch)
    procs = launch(tmp_path, fed, ids)
    try:
        errs = {i: p.communicate(timeout=300)[1] for i, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    said = "runs/procs-a/privacy_ledger.json: cannot write: No space left on device"
    assert procs["a"].returncode == 1, errs["a"][-3000:]
    assert "Traceback" not in "".join(errs.values())
    assert [line for line in errs["a"].splitlines() if "error" in line] == [f"fl-node a: error: {said}"]
    assert all(procs[i].returncode == 0 for i in ("b", "c", "d")), errs
    rows, summary = read_results(tmp_path / "runs/procs-a")
    assert [r["round"] for r in rows] == [1, 2] and summary["error"] == said
