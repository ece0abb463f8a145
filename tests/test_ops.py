"""Operations: Prometheus /metrics scraped over HTTP from live fl-node processes, JSON log
lines, TensorBoard event files, and the run tools (fl-sim report / compare)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from flmesh.cli.fl_sim import main as sim_main
from flmesh.cli.ops_flags import metrics_endpoint, start_ops
from flmesh.cli.tls_flags import tls_from_args
from flmesh.observe.logs import Board, JsonFormatter
from flmesh.observe.metrics import Metrics
from flmesh.pki.certs import federation_pki
from flmesh.reports import run_tools

from conftest import wait_until
from procs import FL_NODE, federation_file, launch, metrics_url, scrape, total

FL_SIM = str(Path(sys.executable).with_name("fl-sim"))


@pytest.mark.slow
def test_node_metrics_are_served_over_http_and_move_with_the_rounds(tmp_path):
    ids = ["a", "b", "c"]
    fed = federation_file(tmp_path, ids, rounds=12)
    procs = launch(tmp_path, fed, ids, "--metrics-port", "0", "--log-format", "json")
    try:
        url = metrics_url(procs["a"])
        first: dict = {}

        def some_rounds() -> bool:
            first.update(scrape(url))
            return total(first, "flmesh_rounds_completed_total") >= 2

        wait_until(some_rounds, timeout=240, interval=0.2)
        later: dict = {}

        def more_rounds() -> bool:
            later.update(scrape(url))
            done = total(later, "flmesh_rounds_completed_total")
            return done > total(first, "flmesh_rounds_completed_total")

        wait_until(more_rounds, timeout=240, interval=0.2)
        assert total(later, "flmesh_current_round") > total(first, "flmesh_current_round")
        # a ring: a receives from its predecessor and sends to its successor, both counted per peer
        assert total(later, "flmesh_bytes_total", node="a", direction="received") > 0
        assert total(later, "flmesh_bytes_total", node="a", direction="sent") > 0
        assert total(later, "flmesh_transfers_total", node="a", status="OK") > 0
        assert total(later, "flmesh_seconds_count", node="a", phase="train") >= 2
        assert total(later, "flmesh_seconds_count", node="a", phase="round") >= 2
        assert 0 < total(later, "flmesh_accuracy", node="a") <= 1  # the last round's, on its own split
        assert total(later, "flmesh_train_loss", node="a") > 0
        for proc in procs.values():
            assert proc.wait(timeout=300) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert procs["a"].stderr is not None
    lines = [json.loads(line) for line in procs["a"].stderr.read().splitlines() if line.startswith("{")]
    assert lines, "no JSON log lines"
    assert {"time", "level", "node", "round", "peer", "event"} <= set(lines[0])
    assert all(entry["node"] == "a" for entry in lines)
    assert any(entry["round"] is not None for entry in lines), "no line names its round"
    # the prefix names the node once ("fl-node a: c answered", not "a: c answered")
    answered = [e for e in lines if e["event"].endswith(" answered")]
    assert answered and all(e["event"] == f"{e['peer']} answered" for e in answered)
    assert not any("listening on" in e["event"] for e in lines)  # said once, on stdout
    assert procs["a"].stdout is not None
    assert procs["a"].stdout.read().count("listening on") == 1  # the metrics line was read before


@pytest.mark.slow
def test_the_aggregator_serves_the_global_models_accuracy(tmp_path):
    ids = ["a", "b"]
    fed = federation_file(tmp_path, ids, rounds=12, graph="complete",
                          extra='[aggregator]\nstrategy = "fedavg"\ndeadline_s = 60\n')
    ready = tmp_path / "agg.addr"
    agg = subprocess.Popen([FL_NODE, "--role", "aggregator", "--federation", str(fed), "--listen",
                            "127.0.0.1:0", "--insecure", "--metrics-port", "0", "--ready-file", str(ready)],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs: dict[str, subprocess.Popen] = {}
    try:
        url = metrics_url(agg)
        wait_until(lambda: ready.exists() or agg.poll() is not None, timeout=120)
        procs = launch(tmp_path, fed, ids, "--aggregator", ready.read_text().strip())
        seen: dict = {}

        def a_round() -> bool:
            seen.update(scrape(url))
            return total(seen, "flmesh_rounds_completed_total", node="aggregator") >= 1

        wait_until(a_round, timeout=240, interval=0.2)
        assert 0 < total(seen, "flmesh_accuracy", node="aggregator") <= 1
        assert not any(n == "flmesh_train_loss" for n, _ in seen)  # nodes train; the aggregator does not
        assert agg.wait(timeout=300) == 0
    finally:
        for proc in [agg, *procs.values()]:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def test_metrics_count_calls_retries_and_phases_per_peer():
    m = Metrics("n1")
    server = m.serve(0)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    before = scrape(url)
    m.call("n2", "Deliver", "OK", 0.2, sent=1000)
    m.call("n2", "Deliver", "UNAVAILABLE", 0.1)
    m.retry("n2")
    m.round_done(3, inbox=2, privacy=0.5)
    unset = scrape(url)
    m.learned(0.75, 0.5)
    m.learned(None, 0.25)  # a round without an accuracy keeps the last one
    after = scrape(url)
    server.shutdown()
    assert total(before, "flmesh_transfers_total") == 0
    assert total(after, "flmesh_transfers_total", peer="n2", status="OK") == 1
    assert total(after, "flmesh_transfers_total", peer="n2", status="UNAVAILABLE") == 1
    assert total(after, "flmesh_bytes_total", peer="n2", direction="sent") == 1000
    assert total(after, "flmesh_retries_total", peer="n2") == 1
    assert total(after, "flmesh_current_round") == 3
    assert total(after, "flmesh_inbox_depth") == 2
    assert total(after, "flmesh_privacy_spent_epsilon") == 0.5
    assert total(after, "flmesh_seconds_count", phase="transfer") == 2
    assert not {n for n, _ in unset} & {"flmesh_accuracy", "flmesh_train_loss"}  # none before a round
    assert total(after, "flmesh_accuracy", node="n1") == 0.75
    assert total(after, "flmesh_train_loss", node="n1") == 0.25


def page(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read()


def ops_args(metrics_port: str, tls: dict[str, Path] | None = None) -> argparse.Namespace:
    files = tls or {}
    return argparse.Namespace(metrics_port=metrics_port, tensorboard=None, tls_ca=files.get("ca"),
                              tls_cert=files.get("cert"), tls_key=files.get("key"))


def test_each_tensorboard_run_gets_its_own_folder_and_a_resumed_one_goes_on_in_its_own(tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    boards = [Board(tmp_path, "run"), Board(tmp_path, "run"), Board(tmp_path, "run", fresh=False)]
    for round, board in enumerate(boards, 1):
        board.scalars(round, {"federation/FA": 0.5})
        board.close()
    assert [b.folder.name for b in boards] == ["run", "run-2", "run"]
    args = argparse.Namespace(metrics_port=None, tensorboard=tmp_path / "tb", out=tmp_path / "runs" / "x")
    ops = start_ops(args, "n1")
    assert ops.board is not None and ops.board.folder == tmp_path / "tb" / "x"
    ops.board.close()
    named = start_ops(argparse.Namespace(metrics_port=None, tensorboard=tmp_path / "tb"), "n1", run="agg")
    assert named.board is not None and named.board.folder == tmp_path / "tb" / "agg"
    named.board.close()


def test_metrics_bind_to_loopback_unless_an_address_is_given(caplog):
    ops = start_ops(ops_args("0"), "n1")  # a port alone: 127.0.0.1, whatever --listen is
    try:
        assert ops.metrics_server.server_address[0] == "127.0.0.1"
        assert ops.metrics_url == f"http://127.0.0.1:{ops.metrics_server.server_address[1]}/metrics"
        assert b"# HELP flmesh_rounds_completed_total" in page(ops.metrics_url)
    finally:
        ops.metrics_server.shutdown()
        ops.metrics_server.server_close()
    server = Metrics("n1").serve(0)  # the library's default too
    assert server.server_address[0] == "127.0.0.1"
    server.shutdown()
    server.server_close()
    with caplog.at_level("WARNING", logger="flmesh.node"):
        ops = start_ops(ops_args("0.0.0.0:0"), "n1")  # an explicit address is honoured, and said
    try:
        port = ops.metrics_server.server_address[1]
        assert ops.metrics_server.server_address[0] == "0.0.0.0"
        assert ops.metrics_url == f"http://0.0.0.0:{port}/metrics"
        assert b"# HELP flmesh_rounds_completed_total" in page(f"http://127.0.0.1:{port}/metrics")
        assert [r.getMessage() for r in caplog.records] == [
            f"metrics on http://0.0.0.0:{port}/metrics over plain HTTP without authentication: whoever "
            "reaches it reads peer ids, bytes per peer and the privacy budget spent (docs/operations.md)"]
    finally:
        ops.metrics_server.shutdown()
        ops.metrics_server.server_close()


@pytest.mark.parametrize(("value", "message"), [
    ("http", "--metrics-port: expected PORT or HOST:PORT with a port from 0 to 65535, got 'http'"),
    ("70000", "--metrics-port: expected PORT or HOST:PORT with a port from 0 to 65535, got '70000'"),
    ("-1", "--metrics-port: expected PORT or HOST:PORT with a port from 0 to 65535, got '-1'"),
    (":9100", "--metrics-port: expected PORT or HOST:PORT with a port from 0 to 65535, got ':9100'"),
    ("9" * 5000, "--metrics-port: expected PORT or HOST:PORT with a port from 0 to 65535, got '9999"),
    ("::1:9100", "--metrics-port: expected PORT or HOST:PORT with a port from 0 to 65535, got '::1:9100' "
     "(write an IPv6 host in brackets: [::1]:PORT)"),
])
def test_a_bad_metrics_address_is_one_line(value, message):
    with pytest.raises(ValueError) as err:
        start_ops(ops_args(value), "n1")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert metrics_endpoint("[::1]:9100") == ("::1", 9100)
    assert metrics_endpoint("9100") == ("127.0.0.1", 9100)


def test_a_process_with_mtls_logs_its_ca_subject_and_fingerprint(tmp_path, caplog):
    node = federation_pki(tmp_path, ["n1"], name="test CA")["n1"]
    args = argparse.Namespace(tls_ca=node.ca, tls_cert=node.cert, tls_key=node.key, insecure=False)
    with caplog.at_level(logging.INFO, logger="flmesh.node"):
        assert tls_from_args(args, "n1", "127.0.0.1:0") is not None
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(node.ca.read_text())).hexdigest().upper()
    fingerprint = ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mTLS on")]
    assert lines == [f"mTLS on: n1 authenticates peers against the CA CN=test CA (SHA-256 {fingerprint}, "
                     f"{node.ca})"]


def test_with_tls_metrics_are_https_and_ask_for_a_federation_certificate(tmp_path):
    pki = federation_pki(tmp_path, ["n1", "prometheus"])
    node, scraper = pki["n1"], pki["prometheus"]
    ops = start_ops(ops_args("0", {"ca": node.ca, "cert": node.cert, "key": node.key}), "n1")
    server = ops.metrics_server
    try:
        port = server.server_address[1]
        assert ops.metrics_url == f"https://127.0.0.1:{port}/metrics"
        stalled = socket.create_connection(("127.0.0.1", port))  # connects and never speaks
        context = ssl.create_default_context(cafile=str(node.ca))  # checks the node's certificate
        context.load_cert_chain(str(scraper.cert), str(scraper.key))
        with urllib.request.urlopen(ops.metrics_url, context=context, timeout=10) as reply:
            assert b"flmesh_rounds_completed_total" in reply.read()
        no_certificate = ssl.create_default_context(cafile=str(node.ca))
        with pytest.raises(OSError):
            urllib.request.urlopen(ops.metrics_url, context=no_certificate, timeout=10).read()
        with pytest.raises(OSError):  # plain HTTP gets nothing
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        stalled.close()
    finally:
        server.shutdown()
        server.server_close()


def test_json_formatter_carries_round_and_peer_from_extra():
    import logging

    record = logging.LogRecord("flmesh.node", logging.WARNING, __file__, 1, "peer %s late", ("b",), None)
    record.round, record.peer = 4, "b"
    entry = json.loads(JsonFormatter("a").format(record))
    assert entry["node"] == "a" and entry["round"] == 4 and entry["peer"] == "b"
    assert entry["event"] == "peer b late" and entry["level"] == "warning"


def quick_run(tmp_path: Path, name: str, *extra: str) -> Path:
    fed = tmp_path / f"{name}.toml"
    fed.write_text(f"""
[federation]
name = "{name}"
seed = 3
rounds = 3
[training]
epochs = 0.5
[topology]
nodes = 3
[model]
hidden = [16]
""")
    out = tmp_path / name
    assert sim_main([str(fed), "--out", str(out), "--quiet", *extra]) == 0
    return out


@pytest.mark.slow
def test_tensorboard_report_and_compare(tmp_path, capsys):
    board = tmp_path / "tb"
    one = quick_run(tmp_path, "one", "--tensorboard", str(board))
    two = quick_run(tmp_path, "two", "--set", "training.lr=0.2", "--tensorboard", str(board))
    # two runs sent to one DIR: one TensorBoard run each, named by its results folder
    assert sorted(p.name for p in board.iterdir()) == ["one", "two"]
    assert not list(board.glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run in ("one", "two"):
        events = list((board / run).glob("events.out.tfevents.*"))
        assert len(events) == 1 and events[0].stat().st_size > 0
        acc = EventAccumulator(str(board / run))
        acc.Reload()
        assert [e.step for e in acc.Scalars("federation/FA")] == [1, 2, 3]

    (one / "accuracy.png").unlink()
    capsys.readouterr()
    assert sim_main(["report", str(one)]) == 0
    printed = capsys.readouterr().out
    assert (one / "accuracy.png").exists() and "one" in printed and "FA %" in printed

    both = tmp_path / "both"
    assert sim_main(["compare", str(one), str(two), "--out", str(both)]) == 0
    printed = capsys.readouterr().out
    assert (both / "compare.png").stat().st_size > 0 and (both / "compare.json").exists()
    assert "one" in printed and "two" in printed
    summaries = [json.loads((d / "summary.json").read_text()) for d in (one, two)]
    finals = [run_tools.final_metrics(s)["FA %"] for s in summaries]
    assert all(f in printed for f in finals)


def test_run_tools_refuse_what_is_not_a_run_in_one_line(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "rounds.jsonl").write_text('{"round": 1}\n')
    (tmp_path / "half" / "summary.json").write_text("{not json")
    for name, line in (("noround", '{"kind": "peer"}'), ("badfa", '{"round": 1, "fa": "x"}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rounds.jsonl").write_text('{"round": 0}\n' + line + "\n")
        (tmp_path / name / "summary.json").write_text("{}")
    cases = [(["report", str(tmp_path / "nope")], "no such run folder"),
             (["report", str(tmp_path)], "not a run folder (no rounds.jsonl)"),
             (["compare", str(tmp_path / "half")], "summary.json: not JSON"),
             (["compare", str(tmp_path / "noround")], 'noround/rounds.jsonl:2: "round" is None'),
             (["compare", str(tmp_path / "badfa")], 'badfa/rounds.jsonl:2: "fa" is "x", expected a number'),
             (["report", str(tmp_path / "badfa")], 'badfa/rounds.jsonl:2: "fa" is "x", expected a number')]
    for argv, message in cases:
        assert sim_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_fl_sim_help_names_the_run_tools():
    done = subprocess.run([FL_SIM, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "fl-sim report RUN_DIR" in done.stdout


def test_progress_line_names_round_phase_and_peer():
    from types import SimpleNamespace

    from flmesh.cli.ops_flags import progress_line

    status = SimpleNamespace(round=2, state="sending", last_accuracy=0.712)
    line = progress_line(status, 40, ("sending", "node4"))
    assert line == "round 3/40: sending to node4 (last accuracy 71.2%)"
    assert progress_line(status, 40, ("training", "node1")).startswith("round 3/40: training on node1")
    first = SimpleNamespace(round=0, state="idle", last_accuracy=0.0)
    assert progress_line(first, 40, ("training", None)) == "round 1/40: training"
