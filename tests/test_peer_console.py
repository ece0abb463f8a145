"""What a node's console says about its peers: a TLS/plaintext mismatch is one line naming the
peer and the likely cause (no gRPC core lines before it), and a peer-call warning names the
node once, whether fl-node's prefix or fl-sim's formatter names it."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading

import pytest

from flmesh.clock import REAL_CLOCK
from flmesh.observe.logs import NodeNamed, setup_logging
from flmesh.pki.certs import federation_pki
from flmesh.runtime.peer_calls import PeerCalls
from flmesh.transports.errors import PeerError, TlsMismatch
from flmesh.transports.grpc.channels import bind, make_server
from flmesh.transports.grpc.peer_client import GrpcPeerTransport
from flmesh.transports.grpc.tls import Tls, load_tls

from conftest import wait_until
from procs import FL_NODE, federation_file


def tls_of(paths: dict, node: str) -> Tls:
    p = paths[node]
    return load_tls(p.ca, p.cert, p.key)[0]


@pytest.mark.parametrize("server_tls", [False, True])
def test_a_tls_mismatch_is_one_line_naming_the_peer_and_the_cause(tmp_path, server_tls):
    paths = federation_pki(tmp_path / "pki", ["a", "b"])
    server = make_server()
    port = bind(server, "127.0.0.1:0", tls_of(paths, "b") if server_tls else None)
    server.start()
    transport = GrpcPeerTransport({"b": f"127.0.0.1:{port}"}, tls=None if server_tls else tls_of(paths, "a"))
    try:
        with pytest.raises(TlsMismatch) as info:
            transport.hello("b", "a", "fed", "mlp", timeout=10)
    finally:
        transport.close()
        server.stop(None)
    cause = ("the connection closed before HTTP/2 started (is b serving mTLS? this node uses plaintext, "
             "--insecure)" if server_tls else
             "TLS handshake failed (is b serving plaintext? this node uses mTLS)")
    assert info.value.details == cause
    assert info.value.retryable and info.value.address == f"127.0.0.1:{port}"


@pytest.mark.parametrize("client_tls", [False, True])
def test_a_peer_that_is_not_there_is_no_mismatch(tmp_path, client_tls):
    paths = federation_pki(tmp_path / "pki", ["a", "b"])
    server = make_server()
    port = bind(server, "127.0.0.1:0")
    server.start()
    server.stop(None).wait()  # nobody listens on the port now
    transport = GrpcPeerTransport({"b": f"127.0.0.1:{port}"}, tls=tls_of(paths, "a") if client_tls else None)
    try:
        with pytest.raises(PeerError) as info:
            transport.hello("b", "a", "fed", "mlp", timeout=10)
    finally:
        transport.close()
    assert info.value.code == "UNAVAILABLE", info.value
    assert not isinstance(info.value, TlsMismatch), info.value


@pytest.mark.slow
def test_two_fl_nodes_one_plaintext_one_mtls_each_say_why_in_one_line(tmp_path):
    """Both processes start at once; a node's Hello deadline runs from its own start, so it must
    cover the other's start on a loaded machine (the peers file comes only once both listen)."""
    paths = federation_pki(tmp_path / "pki", ["a", "b"])
    fed = federation_file(tmp_path, ["a", "b"], rounds=2, graph="complete")
    security = {"a": ["--insecure"],
                "b": ["--tls-ca", str(paths["b"].ca), "--tls-cert", str(paths["b"].cert),
                      "--tls-key", str(paths["b"].key)]}
    peers = tmp_path / "peers.json"
    procs = {i: subprocess.Popen([FL_NODE, "--id", i, "--federation", str(fed), "--listen", "127.0.0.1:0",
                                  "--ready-file", str(tmp_path / f"{i}.addr"), "--peers-file", str(peers),
                                  "--hello-timeout", "40", "--out", str(tmp_path / f"out-{i}"), *security[i]],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in ("a", "b")}
    try:
        wait_until(lambda: all((tmp_path / f"{i}.addr").exists() or p.poll() is not None
                               for i, p in procs.items()), timeout=120)
        address = {i: (tmp_path / f"{i}.addr").read_text().strip() for i in procs}
        (tmp_path / "peers.tmp").write_text(json.dumps(address))
        (tmp_path / "peers.tmp").replace(peers)
        errs = {i: p.communicate(timeout=120)[1] for i, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    assert procs["a"].returncode == 1 and procs["b"].returncode == 1
    said = {i: [line for line in err.splitlines() if "error" in line.lower() or "handshake" in line.lower()]
            for i, err in errs.items()}
    assert said["a"] == [f"fl-node a: error: cannot reach b at {address['b']}: the connection closed "
                         "before HTTP/2 started (is b serving mTLS? this node uses plaintext, --insecure)"
                         ], errs["a"]
    assert said["b"] == [f"fl-node b: error: cannot reach a at {address['a']}: TLS handshake failed "
                         "(is a serving plaintext? this node uses mTLS)"], errs["b"]


@pytest.mark.parametrize("module", ["flmesh.cli.fl_sim", "flmesh.cli.fl_node"])
@pytest.mark.parametrize(("given", "seen"), [(None, "ERROR"), ("INFO", "INFO")])
def test_fl_sim_and_fl_node_keep_grpcs_core_to_errors_unless_the_user_chose(module, given, seen):
    """``cli_common.quiet_grpc_core``: set by the entry point, before grpc is imported (its core
    reads the variable once) and inherited by the processes fl-sim starts."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    if given is not None:
        env["GRPC_VERBOSITY"] = given
    script = (f"import os, sys, {module} as m\n"
              "m.main = lambda: print(os.environ.get('GRPC_VERBOSITY'), 'grpc' in sys.modules) or 0\n"
              "m.entry()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [seen, "False"]


def failed_delivery(node: str) -> None:
    """A peer call that fails for good: PeerCalls logs its warning about ``node``'s round 1."""
    calls = PeerCalls(node, 0.0, REAL_CLOCK, threading.Event())

    def fail() -> None:
        raise PeerError("b", "127.0.0.1:1", "INVALID_ARGUMENT", "no")

    assert calls.call("b", "delivery to", 1, fail) is None


def fl_node_logged(monkeypatch: pytest.MonkeyPatch, log_format: str) -> str:
    """What fl-node a's logging (``--log-format log_format``) writes for a failed delivery."""
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("a", "INFO", log_format, "fl-node a")
        failed_delivery("a")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    return stream.getvalue()


def test_fl_nodes_log_names_the_node_once(monkeypatch):
    line = fl_node_logged(monkeypatch, "text").strip()
    assert line.endswith(" fl-node a: round 1: delivery to b failed: peer 'b' at 127.0.0.1:1: "
                         "INVALID_ARGUMENT: no"), line


def test_fl_sims_log_names_each_node():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(NodeNamed("%(message)s"))
    log = logging.getLogger("flmesh.node")
    log.addHandler(handler)
    try:
        failed_delivery("node3")
        log.warning("a line about no node")
    finally:
        log.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "node3: round 1: delivery to b failed: peer 'b' at 127.0.0.1:1: INVALID_ARGUMENT: no",
        "a line about no node"]


def test_fl_nodes_json_log_names_the_node_in_its_field(monkeypatch):
    entry = json.loads(fl_node_logged(monkeypatch, "json"))
    assert (entry["node"], entry["round"], entry["peer"]) == ("a", 1, "b")
    assert entry["event"] == "round 1: delivery to b failed: peer 'b' at 127.0.0.1:1: INVALID_ARGUMENT: no"
