"""Bad input, enumerated: every bad federation value and fl-sim flag gets one line.

FILE_CASES and SIM_CASES are the rows of the "Bad input" table in docs/reliability.md (by id);
test_reliability_table_quotes_the_tests holds the table to them, so what the page quotes is
what the code prints. The hypothesis test feeds mutated federation dicts through
parse_federation: a FederationError of one line, or a federation, never another exception.
"""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flmesh.cli.fl_sim import main
from flmesh.config import FederationError, parse_federation, schema
from flmesh.config.continual import REPLAY_KEYS, TASK_KEYS
from flmesh.config.graphs import ALIASES, GENERATORS

from conftest import REPO, tiny_raw


def continual(**sections: dict) -> dict:
    """A continual federation: 2 tasks of 2 rounds on 4 nodes, then ``sections`` on top."""
    raw = tiny_raw(nodes=4, rounds=4, tasks={"tasks": 2, "rounds_per_task": 2})
    for name, table in sections.items():
        raw.setdefault(name, {}).update(table)
    return raw


def node_tables(count: int, **first: Any) -> dict:
    """A federation listing ``count`` [nodes.<id>] tables; the first one holds ``first``."""
    raw = tiny_raw()
    del raw["topology"]["nodes"]
    raw["nodes"] = {f"n{i}": {} for i in range(count)}
    raw["nodes"]["n0"].update(first)
    return raw


GRAPHS = "[topology] unknown graph '{}' (expected one of ring, cycle, complete, star, path, erdos_renyi"
PARAM = "expected a number from 0 to {}, true or false, or a list of at most 1024 such numbers, got {}"
CLIP = "expected [lo, hi] with -1000000 <= lo < hi <= 1000000 and hi - lo >= 1e-06, got "
SAMPLE = "expected 0 (every test split) or an integer >= 2 (a model's own split and others), got "
NAME = ("expected 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit "
        "(it names the results folder), got ")

# id -> (the raw federation, the start of the message after "f.toml: ")
FILE_CASES: dict[str, tuple[dict, str]] = {
    "graph-write_graphml": (tiny_raw(topology={"graph": "write_graphml", "params": {"path": "out.graphml"}}),
                            GRAPHS.format("write_graphml")),
    "graph-is_connected": (tiny_raw(topology={"graph": "is_connected"}), GRAPHS.format("is_connected")),
    "graph-read_edgelist": (tiny_raw(topology={"graph": "read_edgelist"}), GRAPHS.format("read_edgelist")),
    "graph-hypercube": (tiny_raw(topology={"graph": "hypercube"}), GRAPHS.format("hypercube")),
    "graph-param-unknown": (tiny_raw(topology={"graph": "erdos_renyi", "params": {"q": 0.3}}),
                            "[topology] params.q: graph 'erdos_renyi' takes no parameter 'q' "
                            "(it takes p, seed, directed)"),
    "graph-param-create_using": (
        tiny_raw(topology={"graph": "complete", "params": {"create_using": "DiGraph"}}),
        "[topology] params.create_using: graph 'complete' takes no parameter 'create_using' (it takes none)"),
    "graph-param-huge": (tiny_raw(topology={"graph": "watts_strogatz", "params": {"k": 1e11, "p": 0.1}}),
                         "[topology] params.k: " + PARAM.format(1048576, "100000000000.0")),
    "graph-param-tries": (
        tiny_raw(topology={"graph": "watts_strogatz", "params": {"k": 2, "p": 0.5, "tries": 10**9}}),
        "[topology] params.tries: " + PARAM.format(1000, "1000000000")),
    "graph-param-text": (tiny_raw(topology={"graph": "erdos_renyi", "params": {"p": "half"}}),
                         "[topology] params.p: " + PARAM.format(1048576, "'half'")),
    "graph-param-missing": (tiny_raw(topology={"graph": "erdos_renyi"}),
                            "[topology] graph 'erdos_renyi' with 3 nodes and parameters {'seed': 3}: "),
    "model-hidden-1e11": (tiny_raw(model={"hidden": [1e11]}),
                          "[model] hidden: expected a non-empty list of positive integers, each <= 65536, "
                          "at most 64 of them, got [100000000000.0]"),
    "model-hidden-wide": (tiny_raw(model={"hidden": [100000]}), "[model] hidden: expected a non-empty list "
                          "of positive integers, each <= 65536, at most 64 of them, got [100000]"),
    "model-hidden-deep": (tiny_raw(model={"hidden": [8] * 65}),
                          "[model] hidden: expected a non-empty list of positive integers, each <= 65536"),
    "model-channels-wide": (
        tiny_raw(model={"name": "cnn", "channels": [10**6]}),
        "[model] channels: expected a non-empty list of positive integers, each <= 65536"),
    "model-too-big": (tiny_raw(model={"hidden": [65536, 65536]}),
                      "[model] hidden: [65536, 65536] makes a model of at least 16402 MiB, over [federation] "
                      "max_model_mib = 512 (peers refuse larger models)"),
    "model-cnn-too-big": (
        tiny_raw(model={"name": "cnn", "channels": [4096, 4096]}, federation={"max_model_mib": 64}),
        "[model] channels: [4096, 4096] makes a model of at least 579 MiB, over [federation] "
        "max_model_mib = 64 (peers refuse larger models)"),
    "model-groups": (tiny_raw(model={"groups": 1000}),
                     "[model] groups: expected an integer <= 64 (ResNet's narrowest layer has 64 channels), "
                     "got 1000"),
    "model-factory-and-name": (tiny_raw(model={"factory": "pkg.models:make"}),
                               "[model] name: a built-in model's key; with [model] factory the factory "
                               "builds the model (give its arguments in [model.args])"),
    "model-factory-malformed": (tiny_raw(model={"factory": "[red]pkg.models:make"}),
                                "[model] factory: expected an import path package.module:callable or a "
                                "registered model name, got '[red]pkg.models:make'"),
    "model-args-alone": (tiny_raw(model={"args": {"width": 8}}),
                         "[model] args: arguments of [model] factory, which is missing"),
    "training-lr-1e308": (tiny_raw(training={"lr": 1e308}),
                          "[training] lr: expected a number <= 10, got 1e+308"),
    "training-epochs": (tiny_raw(training={"epochs": 10**6}),
                        "[training] epochs: expected a number <= 1000, got 1000000"),
    "training-batch_size": (tiny_raw(training={"batch_size": 10**6}),
                            "[training] batch_size: expected an integer <= 65536, got 1000000"),
    "training-momentum": (tiny_raw(training={"momentum": 1}),
                          "[training] momentum: expected a number in [0, 1), got 1"),
    "training-weight_decay": (tiny_raw(training={"weight_decay": 2}),
                              "[training] weight_decay: expected a number <= 1, got 2"),
    "algorithm-fedcurv-lambda": ({**tiny_raw(), "algorithm": {"fedcurv": {"lambda": 1e7}}},
                                 "[algorithm.fedcurv] lambda: expected a number <= 1000000, got 10000000.0"),
    "node-lr-1e308": (node_tables(3, lr=1e308), "[nodes.n0] lr: expected a number <= 10, got 1e+308"),
    "node-epochs-nan": (node_tables(3, epochs=math.nan), "[nodes.n0] epochs: expected a number > 0, got nan"),
    "federation-round_timeout_s": (
        tiny_raw(federation={"round_timeout_s": 1e10}),
        "[federation] round_timeout_s: expected a number <= 86400 (seconds: one day), got 10000000000.0"),
    "federation-timeout-1e400": (
        tiny_raw(federation={"round_timeout_s": 10**400}),
        "[federation] round_timeout_s: expected a number <= 86400 (seconds: one day), got 1000000000"),
    "federation-max_model_mib": (tiny_raw(federation={"max_model_mib": 10**6}),
                                 "[federation] max_model_mib: expected a number <= 65536, got 1000000"),
    "federation-rounds": (tiny_raw(federation={"rounds": 10**6}),
                          "[federation] rounds: expected an integer <= 100000, got 1000000"),
    "federation-seed": (
        tiny_raw(federation={"seed": 2**64}),
        "[federation] seed: expected an integer <= 9223372036854775807 (TOML's 64-bit integers), "
        "got 18446744073709551616"),
    "federation-name-path": (tiny_raw(federation={"name": "../../etc"}),
                             "[federation] name: " + NAME + "'../../etc'"),
    "federation-name-markup": (tiny_raw(federation={"name": "[/x]"}),
                               "[federation] name: " + NAME + "'[/x]'"),
    "federation-name-long": (tiny_raw(federation={"name": "x" * 5000}),
                             "[federation] name: " + NAME + "'" + "x" * 79 + "... (5002 characters)"),
    "topology-nodes": (tiny_raw(nodes=20000), "[topology] nodes: expected an integer <= 16384 "
                       "(a federation file holds at most 16384 nodes), got 20000"),
    "nodes-tables": (node_tables(16385), "[nodes]: a federation file holds at most 16384 nodes, got 16385"),
    "topology-dense-large": (
        tiny_raw(nodes=2000, federation={"eval_sample": 10}),
        "[topology] graph 'complete' visits every pair of nodes: above 1024 nodes (here 2000) use a sparse "
        "one"),
    "topology-rwt-large": (
        tiny_raw(nodes=2000, federation={"eval_sample": 10}, topology={"graph": "ring", "schedule": "rwt"}),
        "[topology] schedule 'rwt': rwt draws each round's cycle cover from an n x n assignment (n³ time): "
        "at most 1024 nodes, the graph has 2000"),
    "federation-eval_sample-large": (
        tiny_raw(nodes=2000, topology={"graph": "ring"}),
        "[federation] eval_sample: 2000 nodes would evaluate every model on every test split (4000000 "
        "evaluations a round); above 1024 nodes set eval_sample = K"),
    "topology-file-nul": (
        tiny_raw(topology={"file": "a\x00b.graphml"}),
        "[topology] file: expected a path without NUL characters, of at most 4096 characters, "
        "got 'a\\x00b.graphml'"),
    "data-root-nul": (tiny_raw(data={"root": "/tmp/\x00"}), "[data] root: expected a path without NUL"),
    "data-alpha": (tiny_raw(data={"alpha": 1e308}), "[data] alpha: expected a number <= 1000000, got 1e+308"),
    "data-shards_per_node": (tiny_raw(data={"shards_per_node": 10**9}),
                             "[data] shards_per_node: expected an integer <= 65536, got 1000000000"),
    "data-min_samples": (tiny_raw(data={"min_samples": 10**9}),
                         "[data] min_samples: expected an integer <= 1000000, got 1000000000"),
    "aggregator-deadline_s": (
        tiny_raw(aggregator={"deadline_s": 1e10}),
        "[aggregator] deadline_s: expected a number <= 86400 (seconds: one day), got 10000000000.0"),
    "aggregator-server_epochs": (tiny_raw(aggregator={"server_epochs": 1e6}),
                                 "[aggregator] server_epochs: expected a number <= 1000, got 1000000.0"),
    "aggregator-fedcurv_max_age": (
        tiny_raw(aggregator={"fedcurv_max_age": 10**9}),
        "[aggregator] fedcurv_max_age: expected an integer <= 100000, got 1000000000"),
    "aggregator-min_updates": (tiny_raw(aggregator={"min_updates": 5}),
                               "[aggregator] min_updates: expected at most the federation's 3 nodes, got 5 "
                               "(the global model would never change)"),
    "tasks-rounds_per_task": (continual(tasks={"rounds_per_task": 10**9}),
                              "[tasks] rounds_per_task: expected an integer <= 100000, got 1000000000"),
    "tasks-initial_clients": (continual(tasks={"initial_clients": 20000}),
                              "[tasks] initial_clients: expected an integer <= 16384, got 20000"),
    "tasks-beta": (continual(tasks={"beta": 1e308}),
                   "[tasks] beta: expected a number <= 1000000, got 1e+308"),
    "replay-epsilon-tiny": (continual(replay={"epsilon": 1e-300}),
                            "[replay] epsilon: expected a number in [0.001, 1000], got 1e-300"),
    "replay-epsilon-huge": (continual(replay={"epsilon": 1e308}),
                            "[replay] epsilon: expected a number in [0.001, 1000], got 1e+308"),
    "replay-clip-infinite": (continual(replay={"clip": [-math.inf, 0.0]}),
                             "[replay] clip: " + CLIP + "[-inf, 0.0]"),
    "replay-clip-empty": (continual(replay={"clip": [0.0, 1e-300]}),
                          "[replay] clip: " + CLIP + "[0.0, 1e-300]"),
    "replay-local_means": (continual(replay={"local_means": 10**9}),
                           "[replay] local_means: expected an integer <= 65536, got 1000000000"),
    "replay-budget": (continual(replay={"budget": 1e308}),
                      "[replay] budget: expected a number <= 1000000, got 1e+308"),
    "section-key-newline": (tiny_raw(training={"l\nr": 1}),
                            "[training] 'l\\nr': unknown key (expected one of"),
    "federation-eval_sample-negative": (tiny_raw(federation={"eval_sample": -1}),
                                        "[federation] eval_sample: " + SAMPLE + "-1"),
    "federation-eval_sample-one": (tiny_raw(federation={"eval_sample": 1}),
                                   "[federation] eval_sample: " + SAMPLE + "1"),
    "federation-eval_sample-huge": (
        tiny_raw(federation={"eval_sample": 20000}),
        "[federation] eval_sample: expected an integer <= 16384 (a federation file holds at most 16384 "
        "nodes), got 20000"),
    "federation-eval_sample-star": (
        tiny_raw(federation={"eval_sample": 2}, aggregator={"strategy": "fedavg"}),
        "[federation] eval_sample: peer federations only: a star row needs each participant on every test "
        "split (WSM's client forgetting, Flashback's F_k,t); remove it or [aggregator]"),
    "data-source-not-a-path": (tiny_raw(data={"source": "make_points"}), "[data] source: expected an import "
                               "path of the form package.module:name, got 'make_points'"),
    "data-source-and-dataset": (tiny_raw(data={"source": "points:make"}),
                                "[data] source: names the data instead of dataset: give one of them"),
    "data-classes-one": (tiny_raw(data={"classes": 1}), "[data] classes: expected an integer >= 2, got 1"),
    "node-data-nul": (node_tables(3, data="a\x00.npz"), "[nodes.n0] data: expected a path without NUL"),
    "aggregator-strategy-unknown": (tiny_raw(aggregator={"strategy": "fedsgd"}),
                                    "[aggregator] strategy: expected one of 'fedadam', 'fedavg', "),
    "aggregator-strategy-path": (
        tiny_raw(aggregator={"strategy": "no_such_pkg.algos:Mine"}),
        "[aggregator] strategy: expected a usable strategy: 'no_such_pkg.algos:Mine': no module named "
        "'no_such_pkg' (is its package installed?), got 'no_such_pkg.algos:Mine'"),
    "training-objective-strategy": (tiny_raw(training={"objective": "fedavg"}),
                                    "[training] objective: expected an objective, not the strategy plug-in "
                                    "'fedavg', got 'fedavg'"),
    "aggregator-params-range": (tiny_raw(aggregator={"strategy": "fedadam", "params": {"beta1": 1}}),
                                "[aggregator.params] beta1: expected a number in [0, 1), got 1"),
    "aggregator-params-unknown": (
        tiny_raw(aggregator={"strategy": "fedavgm", "params": {"lr": 1}}),
        "[aggregator.params] lr: unknown key (expected one of momentum, server_lr)"),
    "aggregator-params-deprecated-both": (
        tiny_raw(aggregator={"strategy": "trimmed_mean", "trim": 0.2, "params": {"trim": 0.3}}),
        "[aggregator] trim: deprecated, and [aggregator.params] trim is given too: keep only the latter"),
    "algorithm-unknown": ({**tiny_raw(), "algorithm": {"nope": {}}},
                          "[algorithm.nope]: unknown algorithm 'nope' (registered: ce, "),
}


@pytest.mark.parametrize(("raw", "message"), FILE_CASES.values(), ids=FILE_CASES.keys())
def test_federation_value_is_refused(raw, message):
    with pytest.raises(FederationError) as err:
        parse_federation(copy.deepcopy(raw), source="f.toml")
    text = str(err.value)
    assert "\n" not in text and len(text) < 1000, text
    assert text.startswith("f.toml: " + message), text


def test_a_graph_name_never_reaches_a_networkx_writer(tmp_path):
    target = tmp_path / "keep.graphml"
    target.write_text("precious")
    raw = tiny_raw(topology={"graph": "write_graphml", "params": {"path": str(target)}})
    with pytest.raises(FederationError, match="unknown graph 'write_graphml'"):
        parse_federation(raw, source="f.toml")
    assert target.read_text() == "precious"


# ----------------------------------------------------------------------------- fl-sim flags

STAR = "\n[aggregator]\nstrategy = \"fedavg\"\n"
TINY = """
[federation]
name = "tiny"
seed = 11
rounds = 2

[topology]
nodes = 3
graph = "ring"

[model]
hidden = [16]
"""

# id -> (argv with {file}, {star} and {tmp} to fill in, the stderr line after "fl-sim: error: ")
SIM_CASES: dict[str, tuple[list[str], str]] = {
    "sim-rounds-zero": (["{file}", "--rounds", "0"], "--rounds: expected an integer >= 1, got 0"),
    "sim-rounds-huge": (["{file}", "--rounds", "1000000"],
                        "--rounds: expected an integer <= 100000, got 1000000"),
    "sim-rounds-text": (["{file}", "--rounds", "x"],
                        "argument --rounds: invalid int value: 'x' (see fl-sim --help)"),
    "sim-eval-every-negative": (["{file}", "--eval-every", "-3"],
                                "--eval-every: expected an integer >= 1, got -3"),
    "sim-eval-every-huge": (["{file}", "--eval-every", "1000000"],
                            "--eval-every: expected an integer <= 100000, got 1000000"),
    "sim-eval-every-zero": (["{star}", "--eval-every", "0"], "--eval-every: expected an integer >= 1, got 0"),
    "sim-eval-sample-one": (["{file}", "--eval-sample", "1"], "--eval-sample: expected 0 (every test split) "
                            "or an integer from 2 to 16384, got 1"),
    "sim-out-is-a-file": (["{file}", "--out", "{tmp}/taken.txt"],
                          "--out {tmp}/taken.txt: is a file, expected a folder (existing or to create)"),
    "sim-out-under-a-file": (["{file}", "--out", "{tmp}/taken.txt/run"],
                             "--out {tmp}/taken.txt/run: cannot write results there: Not a directory"),
    "sim-baseline": (["{file}", "--baseline", "gossip"], "argument --baseline: invalid choice: 'gossip' "),
    "sim-log-level": (["{file}", "--log-level", "LOUD"], "argument --log-level: invalid choice: 'LOUD' "),
    "sim-unknown-flag": (["{file}", "--frobnicate"],
                         "unrecognized arguments: --frobnicate (see fl-sim --help)"),
    "sim-no-file": ([], "the following arguments are required: file (see fl-sim --help)"),
    "sim-missing-file": (["{tmp}/no.toml"], "{tmp}/no.toml: federation file not found"),
    "sim-set-malformed": (["{file}", "--set", "epochs=3"],
                          "--set 'epochs=3': expected SECTION.KEY=VALUE, e.g. training.epochs=2"),
    "sim-set-not-a-table": (["{file}", "--set", "federation.rounds.x=1"],
                            "--set 'federation.rounds.x=1': 'rounds' is not a table"),
    "sim-set-lr-huge": (["{file}", "--set", "training.lr=1e308"],
                        "{file}: [training] lr: expected a number <= 10, got 1e+308"),
    "sim-set-graph-writer": (["{file}", "--set", 'topology.graph="write_graphml"'],
                             "{file}: " + GRAPHS.format("write_graphml")),
    "sim-data-missing": (["{file}", "--out", "{tmp}/new", "--set", 'data.dataset="mnist"',
                          "--set", 'data.root="nowhere"'], "mnist: expected MNIST/raw/"),
    "sim-source-no-module": (["{file}", "--out", "{tmp}/new", "--set", 'data.source="udata_nowhere:make"'],
                             "{file}: [data] source: 'udata_nowhere:make': no module named 'udata_nowhere' "
                             "(is its package installed?)"),
    "sim-source-raises": (["{file}", "--out", "{tmp}/new", "--set", 'data.source="udata_bad:fails"'],
                          "[data] source 'udata_bad:fails' raised ValueError: no points today"),
    "sim-source-wrong-type": (["{file}", "--out", "{tmp}/new", "--set", 'data.source="udata_bad:wrong"'],
                              "[data] source 'udata_bad:wrong' returned a str; expected (x, y) arrays or "
                              "tensors, ((x, y), (x_test, y_test)), a mapping with x and y, an ArrayData, "
                              "or a torch Dataset of (x, y) items"),
    "sim-source-nan": (["{file}", "--out", "{tmp}/new", "--set", 'data.source="udata_bad:nan"'],
                       "[data] source 'udata_bad:nan': x holds NaN or infinity"),
    "sim-source-exits": (["{file}", "--out", "{tmp}/new", "--set", 'data.source="udata_bad:exits"'],
                         "[data] source 'udata_bad:exits' raised SystemExit: 0"),
    "sim-source-one-sample": (["{file}", "--out", "{tmp}/new", "--set", 'data.source="udata_bad:one"',
                               "--set", 'data.partition="iid"'],
                              "{file}: [data] source 'udata_bad:one': node0's share holds 1 of the 1 samples "
                              "split over 3 nodes; a node needs 2 or more (to train and to test)"),
    "sim-model-over-max-mib": (["{file}", "--set", "federation.max_model_mib=0.001"],
                               "{file}: [model] hidden: [16] makes a model of at least 0.00452 MiB, over "
                               "[federation] max_model_mib = 0.001 (peers refuse larger models)"),
    "sim-learner-missing": (["{file}", "--out", "{tmp}/new", "--set", 'training.learner="nope_mod:L"'],
                            "{file}: [training] learner: 'nope_mod:L': no module named 'nope_mod'"),
    "sim-optimizer-missing": (["{file}", "--out", "{tmp}/new", "--set",
                               'training.optimizer="torch.optim:Nope"'],
                              "{file}: [training] optimizer: 'torch.optim:Nope': torch.optim has no "
                              "attribute"),
    "sim-metric-missing": (["{file}", "--out", "{tmp}/new", "--set", 'federation.metric="f1"', "--set",
                            'training.learner="flmesh:Learner"'],
                           "{file}: [training] learner: [federation] metric = 'f1', but Learner.evaluate "
                           "returns no metrics"),
    "sim-checkpoint-every-negative": (["{file}", "--checkpoint-every", "-1"],
                                      "--checkpoint-every: expected an integer from 0 to 100000, got -1"),
    "sim-resume-not-a-run": (["--resume", "{tmp}"],
                             "--resume {tmp}: not an fl-sim run folder (no run.json and federation.toml)"),
    "sim-resume-with-seeds": (["--resume", "{tmp}", "--seeds", "1"],
                              "--resume: goes on in the run folder; drop --seeds, --sweep and --out"),
    "sim-seeds-not-a-list": (["{file}", "--seeds", "1,x"],
                             "--seeds: expected integers >= 0 separated by commas, e.g. 1,2,3; got '1,x'"),
    "sim-seeds-twice": (["{file}", "--seeds", "1,2,1"], "--seeds: seed 1 is listed twice in '1,2,1'"),
    "sim-sweep-unknown-key": (["{file}", "--out", "{tmp}/new", "--sweep", "rewind.lamda=0.1,0.2"],
                              "--sweep rewind.lamda=0.1: {file}: [rewind] lamda: unknown key (expected one "
                              "of lambda, mode, scope)"),
    "sim-sweep-twice": (["{file}", "--out", "{tmp}/new", "--sweep", "training.lr=0.1,0.1"],
                        "--sweep training.lr: 0.1 is listed twice in '0.1,0.1'"),
    "sim-sweep-malformed": (["{file}", "--sweep", "lambda=0.1"],
                            "--sweep 'lambda=0.1': expected SECTION.KEY=V1,V2,..., e.g. "
                            "rewind.lambda=0.1,0.2"),
}


def _fill(text: str, tmp_path: Path) -> str:
    return text.format(file=tmp_path / "tiny.toml", star=tmp_path / "star.toml", tmp=tmp_path)


def _sim(argv: list[str]) -> int:
    """fl-sim in this process; argparse's own errors end in SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


@pytest.mark.parametrize(("argv", "message"), SIM_CASES.values(), ids=SIM_CASES.keys())
def test_fl_sim_flag_is_refused(tmp_path, capsys, monkeypatch, argv, message):
    _data_files(tmp_path, monkeypatch)
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "star.toml").write_text(TINY + STAR)
    (tmp_path / "taken.txt").write_text("precious")
    assert _sim([_fill(a, tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl-sim: error: " + _fill(message, tmp_path)), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (tmp_path / "taken.txt").read_text() == "precious", "an --out that is a file is never touched"
    assert not (tmp_path / "new").exists(), "a run that cannot start leaves no empty results folder"


USER_MODELS = """
import math
import sys

import torch
from torch import nn

WIDTH = 8


def make(*, input_shape, num_classes, width=WIDTH):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
                         nn.Linear(width, num_classes))


def boom(*, input_shape, num_classes):
    raise RuntimeError("no GPU here")


def weights(*, input_shape, num_classes):
    return {"w": 1}


def eleven(*, input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 11))


def exits(*, input_shape, num_classes):
    sys.exit(0)


def nan(*, input_shape, num_classes):
    model = make(input_shape=input_shape, num_classes=num_classes)
    with torch.no_grad():
        model[1].weight[0, 0] = math.nan
    return model
"""

# id -> ([model] lines, the stderr line after "fl-sim: error: FILE: "); user_models.py is USER_MODELS,
# broken.py raises ImportError when imported; a line "#KEY = VALUE" goes into [federation]
MODEL_CASES: dict[str, tuple[str, str]] = {
    "model-missing-module": (
        'factory = "no_such_pkg.models:make"',
        "[model] factory 'no_such_pkg.models:make': no module named 'no_such_pkg' "
        "(is its package installed?)"),
    "model-missing-attribute": (
        'factory = "user_models:build"',
        "[model] factory 'user_models:build': user_models has no attribute 'build'"),
    "model-import-raises": (
        'factory = "broken:make"',
        "[model] factory 'broken:make': importing broken failed: ImportError: needs libfoo"),
    "model-not-callable": (
        'factory = "user_models:WIDTH"',
        "[model] factory 'user_models:WIDTH' is a int, not something to call"),
    "model-factory-raises": (
        'factory = "user_models:boom"',
        "[model] factory 'user_models:boom' raised RuntimeError: no GPU here"),
    "model-not-a-module": (
        'factory = "user_models:weights"',
        "[model] factory 'user_models:weights' returned dict, not a torch.nn.Module"),
    "model-args-unknown": (
        'factory = "user_models:make"\n[model.args]\ndepth = 3',
        "[model.args] depth: 'user_models:make' takes no argument 'depth' (it takes width)"),
    "model-wrong-classes": (
        'factory = "user_models:eleven"',
        "[model] factory 'user_models:eleven': the model returns [1, 11] for one sample, the data has "
        "10 classes (expected [1, 10])"),
    "model-factory-exits": (
        'factory = "user_models:exits"',
        "[model] factory 'user_models:exits' raised SystemExit: 0"),
    "model-nan-weights": (
        'factory = "user_models:nan"',
        "[model] factory 'user_models:nan': the model holds NaN or infinity in its initial weights (tensor "
        "'1.weight'); every peer refuses such a model"),
    "model-over-max-mib": (
        'factory = "user_models:make"\n[model.args]\nwidth = 8192\n#max_model_mib = 1',
        "[model] factory 'user_models:make': the model takes 2.34 MiB as it travels, over [federation] "
        "max_model_mib = 1 (peers refuse larger models)"),
    "model-unknown-name": (
        'factory = "transformer"',
        "[model] factory: unknown model 'transformer' (registered: cnn, cnn2, mlp, resnet18; "
        "or give an import path package.module:name)"),
}


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    """user_models.py and broken.py in tmp_path, importable."""
    (tmp_path / "user_models.py").write_text(USER_MODELS)
    (tmp_path / "broken.py").write_text('raise ImportError("needs libfoo")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("user_models", "broken"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(("lines", "message"), MODEL_CASES.values(), ids=MODEL_CASES.keys())
def test_a_bad_model_is_one_line_exit_2(tmp_path, capsys, user_models, lines, message):
    """fl-sim and fl-node alike, before any training (fl-sim leaves no results folder)."""
    from flmesh.cli.node import main as node_main

    file = tmp_path / "f.toml"
    more = "".join(f"\n{line[1:]}" for line in lines.splitlines() if line.startswith("#"))  # [federation]
    file.write_text(TINY.replace("rounds = 2", f"rounds = 2{more}").replace("hidden = [16]", lines))
    assert _sim([str(file), "--out", str(tmp_path / "new"), "--no-pictures"]) == 2
    err = capsys.readouterr().err
    assert err == f"fl-sim: error: {file}: {message}\n", err
    assert not (tmp_path / "new").exists()
    peers = ["--peer", "node1=127.0.0.1:1", "--peer", "node2=127.0.0.1:1"]
    assert node_main(["--id", "node0", "--federation", str(file), *peers, "--listen", "127.0.0.1:0",
                      "--insecure", "--out", str(tmp_path / "node0")]) == 2
    assert capsys.readouterr().err == f"fl-node node0: error: {file}: {message}\n"


@pytest.mark.parametrize(
    "args",
    [["--out", "{tmp}/taken.txt"], ["--set", 'topology.graph="write_graphml"',
                                     "--set", 'topology.params.path="{tmp}/taken.txt"']],
    ids=["out-is-a-file", "graph-writer"])
def test_fl_sim_process_exits_2_with_one_line(tmp_path, args):
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "taken.txt").write_text("precious")
    proc = subprocess.run([sys.executable, "-m", "flmesh.cli.fl_sim", str(tmp_path / "tiny.toml"),
                           *[_fill(a, tmp_path) for a in args]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("fl-sim: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert (tmp_path / "taken.txt").read_text() == "precious"


# ----------------------------------------------------------------------------- user data

UDATA = """
import numpy as np
def wrong(**kwargs):
    return "points"
def fails(**kwargs):
    raise ValueError("no points today")
def nan(**kwargs):
    return np.array([[np.nan, 1.0], [0.0, 1.0]]), np.array([0, 1])
def exits(**kwargs):
    raise SystemExit(0)
def one(**kwargs):
    return np.zeros((1, 2)), np.array([0])
"""


def _data_files(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bad data file the cases name, and the modules their sources import (on sys.path)."""
    import numpy as np

    np.savez(tmp / "nolabels.npz", x=np.zeros((4, 2)))
    np.savez(tmp / "big.npz", x=np.zeros((4, 2)), y=np.array([0, 1, 2, 12]))
    np.savez(tmp / "negative.npz", x=np.zeros((4, 2)), y=np.array([0, -1, 1, 0]))
    np.savez(tmp / "fractional.npz", x=np.zeros((4, 2)), y=np.array([0, 0.5, 1, 0]))
    np.savez(tmp / "nan.npz", x=np.array([[0, 1], [np.nan, 1], [1, 1], [2, 2]]), y=np.array([0, 1, 1, 0]))
    np.savez(tmp / "empty.npz", x=np.zeros((0, 2)), y=np.zeros(0, dtype=np.int64))
    np.savez(tmp / "huge-label.npz", x=np.zeros((4, 2)), y=np.array([0, 1, 2, 10**12]))
    _npz_bomb(tmp / "bomb.npz")
    (tmp / "data.txt").write_text("1,2,0\n")
    (tmp / "nolabel.csv").write_text("a,b\n1,2\n")
    (tmp / "cat.csv").write_text("a,label\n1,cat\n")
    (tmp / "inf.csv").write_text("a,label\ninf,1\n2,0\n")
    (tmp / "empty.csv").write_text("")
    (tmp / "udata_bad.py").write_text(UDATA)
    (tmp / "udata_broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp))


def _npz_bomb(path: Path) -> None:
    """A .npz whose x.npy header says 2^31 float32 (8 GiB), its data left out (a real one is 9 MB of
    deflated zeros): only the header may be read."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path, "w") as z:
        with z.open("x.npy", "w") as f:
            np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False,
                                                     "shape": (2**31,)})
        with z.open("y.npy", "w") as f:
            np.lib.format.write_array(f, np.zeros(4, dtype=np.int64))


EXPECTED = ("(x, y) arrays or tensors, ((x, y), (x_test, y_test)), a mapping with x and y, an ArrayData, "
            "or a torch Dataset of (x, y) items")
# id -> (fl-node flags with {tmp} to fill in, the stderr line after "fl-node a: error: ")
NODE_DATA_CASES: dict[str, tuple[list[str], str]] = {
    "data-missing": (["--data", "{tmp}/nope.npz"], "--data {tmp}/nope.npz: no such file"),
    "data-format": (["--data", "{tmp}/data.txt"],
                    "--data {tmp}/data.txt: unknown format '.txt' (expected .npz or .csv)"),
    "data-no-labels": (["--data", "{tmp}/nolabels.npz"],
                       "--data {tmp}/nolabels.npz: holds no 'y' array (no labels); its arrays: x"),
    "data-no-label-column": (["--data", "{tmp}/nolabel.csv"],
                             "--data {tmp}/nolabel.csv: has no label column 'label' (its columns: a, b); "
                             "name it with --label-column or [data] label_column"),
    "data-label-over-classes": (["--data", "{tmp}/big.npz", "--set", "data.classes=10"],
                                "--data {tmp}/big.npz: y holds the label 12, but [data] classes = 10 "
                                "(labels 0..9)"),
    "data-label-negative": (["--data", "{tmp}/negative.npz"],
                            "--data {tmp}/negative.npz: y holds the label -1, expected labels 0..C-1"),
    "data-label-fraction": (["--data", "{tmp}/fractional.npz"],
                            "--data {tmp}/fractional.npz: y holds 0.5, expected integer labels 0..C-1"),
    "data-label-text": (["--data", "{tmp}/cat.csv"],
                        "--data {tmp}/cat.csv: line 2, column 'label': 'cat' is not an integer label"),
    "data-nan": (["--data", "{tmp}/nan.npz"], "--data {tmp}/nan.npz: x holds NaN or infinity"),
    "data-inf-csv": (["--data", "{tmp}/inf.csv"], "--data {tmp}/inf.csv: x holds NaN or infinity"),
    "data-empty": (["--data", "{tmp}/empty.npz"], "--data {tmp}/empty.npz: x holds no samples"),
    "data-npz-bomb": (["--data", "{tmp}/bomb.npz"],
                      "--data {tmp}/bomb.npz: its arrays would take 8.0 GiB (x (2147483648,) float32, y (4,) "
                      "int64), over the 4 GiB a node's own file may hold; stream larger data from a [data] "
                      "source Dataset ([data] stream = true)"),
    "data-label-huge": (["--data", "{tmp}/huge-label.npz"],
                        "--data {tmp}/huge-label.npz: y holds the label 1000000000000; labels go up to "
                        "999999 ([data] classes is at most 1000000)"),
    "data-empty-csv": (["--data", "{tmp}/empty.csv"],
                       "--data {tmp}/empty.csv: is empty, expected a header and one row per sample"),
    "data-in-file-missing": (["--set", 'nodes.a.data="gone.csv"'],
                             "{tmp}/fed.toml: [nodes.a] data {tmp}/gone.csv: no such file"),
    "data-and-source": (["--data", "{tmp}/nan.npz", "--data-source", "udata_bad:wrong"],
                        "--data and --data-source both name this node's data: choose one"),
    "source-not-a-path": (["--data-source", "udata_bad"], "--data-source: 'udata_bad' is not an import path "
                          "of the form package.module:name"),
    "source-no-module": (["--data-source", "udata_nowhere:make"], "--data-source: 'udata_nowhere:make': "
                         "no module named 'udata_nowhere' (is its package installed?)"),
    "source-no-attribute": (["--data-source", "udata_bad:missing"],
                            "--data-source: 'udata_bad:missing': udata_bad has no attribute 'missing'"),
    "source-import-raises": (["--data-source", "udata_broken:make"], "--data-source: 'udata_broken:make': "
                             "importing udata_broken failed: RuntimeError: boom"),
    "source-raises": (["--data-source", "udata_bad:fails"],
                      "--data-source 'udata_bad:fails' raised ValueError: no points today"),
    "source-wrong-type": (["--data-source", "udata_bad:wrong"],
                          f"--data-source 'udata_bad:wrong' returned a str; expected {EXPECTED}"),
    "source-exits": (["--data-source", "udata_bad:exits"],
                     "--data-source 'udata_bad:exits' raised SystemExit: 0"),
}


@pytest.mark.parametrize(("args", "message"), NODE_DATA_CASES.values(), ids=NODE_DATA_CASES.keys())
def test_fl_node_bad_data_is_one_line_exit_2(tmp_path, capsys, monkeypatch, args, message):
    from flmesh.cli.node import main as node_main

    from procs import federation_file

    _data_files(tmp_path, monkeypatch)
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=1)
    argv = ["--id", "a", "--federation", str(fed), "--peer", "b=127.0.0.1:1", "--peer", "c=127.0.0.1:1",
            "--listen", "127.0.0.1:0", "--insecure", "--out", str(tmp_path / "out"),
            *[_fill(a, tmp_path) for a in args]]
    assert node_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl-node a: error: " + _fill(message, tmp_path)), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists(), "nothing ran: no results folder"


# ----------------------------------------------------------------------------- fuzzing

SCHEMA: dict[str, list[str]] = {
    **{name: list(keys) for name, keys in schema.SECTIONS.items()},
    "tasks": list(TASK_KEYS), "replay": list(REPLAY_KEYS),
}
EDGES = [0, -1, 1, 2, 3, 0.5, 1025, 65537, 100001, 2**63 - 1, 2**64, 10**400, -10**400, 1e10, 1e308, -1e308,
         math.inf, -math.inf, math.nan, 5e-324, "", "x", "a\nb", "a\x00b", "[/x]", "../x", "x" * 300, True,
         False, [], [0], [1e11], [10**400], [math.inf, 0], [0, 1], [65536, 65536], {}, {"p": 0.5},
         {"p": math.nan}, {"k": 10**400}, {"tries": 10**9}, {"path": "x.graphml"},
         *ALIASES, *GENERATORS, "write_graphml", "is_connected", "hypercube", "mnist", "cnn", "resnet18"]
SCALARS = st.one_of(st.integers(-3, 12), st.integers(), st.floats(), st.text(max_size=12), st.booleans())
VALUES = st.one_of(
    st.sampled_from(EDGES), SCALARS, st.lists(SCALARS, max_size=4),
    st.dictionaries(st.sampled_from(["p", "k", "m", "d", "seed", "tries", "n", "zz"]), SCALARS, max_size=3),
)
SECTION_KEYS = st.sampled_from([(s, k) for s, keys in SCHEMA.items() for k in [*keys, "zz"]])
NODE_KEYS = st.tuples(st.sampled_from(["a", "b", "c", "a b", "a\nb"]),
                      st.sampled_from([*schema.NODE_KEYS, "zz"]))


def _mutate(raw: dict, where: tuple[str, str], value: Any) -> None:
    section, key = where
    if section == "topology" and key == "nodes" and isinstance(value, int) and 12 < value <= 1024:
        value = 12  # a valid large federation is slow to plan (CWT on a complete graph), not bad input
    table = raw.setdefault(section, {})
    if isinstance(table, dict):
        table[key] = value


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(SECTION_KEYS, VALUES), min_size=1, max_size=4),
       node_changes=st.lists(st.tuples(NODE_KEYS, VALUES), max_size=3),
       whole=st.one_of(st.none(), st.tuples(st.sampled_from([*SCHEMA, "nodes", "zz"]), VALUES)))
def test_any_federation_dict_parses_or_gives_one_line(changes, node_changes, whole):
    raw = continual() if any(s in ("tasks", "replay") for (s, _), _ in changes) else tiny_raw()
    for where, value in changes:
        _mutate(raw, where, value)
    if node_changes:
        if isinstance(raw.get("topology"), dict):
            raw["topology"].pop("nodes", None)  # the [nodes] tables give the count
        raw["nodes"] = {"a": {}, "b": {}, "c": {}}
        for (node, key), value in node_changes:
            raw["nodes"].setdefault(node, {})[key] = value
    if whole is not None:
        raw[whole[0]] = whole[1]
    try:
        parse_federation(raw, source="f.toml")
    except FederationError as exc:
        text = str(exc)
        assert text.startswith("f.toml: ") and "\n" not in text and "\r" not in text, text
        assert len(text) < 1000, text


# ----------------------------------------------------------------------------- the page

ROW = re.compile(r"^\| *(\d+) *\|(.*)\| *`(.+?)`.*\| *`?tests/(\w+)\.py::(\w+)(?:\[([\w.-]+)\])?`? *\|$")


def _rows() -> list[tuple[str, str, str, str, str | None]]:
    """The rows of the "Bad input" tables, up to the payloads' part (its rows cite their own tests)."""
    text = (REPO / "docs" / "reliability.md").read_text()
    section = text.split("## Bad input", 1)[1].split("### Payloads, peers, certificates and signals", 1)[0]
    return [m.group(1, 3, 4, 5, 6) for line in section.splitlines() if (m := ROW.match(line.strip()))]


def test_reliability_table_quotes_the_tests():
    rows = _rows()
    assert len(rows) >= 40
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)), "rows numbered 1, 2, 3, ..."
    for number, quoted, module, function, case in rows:
        # A regex in a test escapes brackets; the page quotes them plain.
        source = (REPO / "tests" / f"{module}.py").read_text().replace("\\[", "[").replace("\\]", "]")
        assert f"def {function}(" in source, f"row {number}: no test {module}::{function}"
        stable = quoted.removesuffix(" …").removeprefix("… ").replace("\\|", "|")
        if module == "test_bad_input" and case is not None:
            cases = {**{k: v[1] for k, v in FILE_CASES.items()}, **{k: v[1] for k, v in SIM_CASES.items()}}
            assert case in cases, f"row {number}: no case {case}"
            expected = cases[case].replace("{file}", "FILE").replace("{star}", "FILE").replace("{tmp}", "DIR")
            assert stable.removeprefix("fl-sim: error: ") in expected, f"row {number}: {quoted!r}"
        else:
            assert stable in source, f"row {number}: {stable!r} is not what {module}::{function} checks"


def test_reliability_page_lists_every_allowed_generator():
    text = (REPO / "docs" / "reliability.md").read_text()
    assert all(f"`{name}`" in text for name in [*ALIASES, *GENERATORS])


@pytest.mark.parametrize("value", ["\r", "graph\n.txt", "a\tb\x1b[2J.xml"])
def test_control_characters_in_a_value_are_escaped_in_the_one_line_error(value):
    """Found by the fuzz test above: a graph file named "\\r" put a carriage return in the message."""
    raw = tiny_raw()
    raw["topology"]["file"] = value
    with pytest.raises(FederationError) as err:
        parse_federation(raw, source="f.toml")
    text = str(err.value)
    assert text.startswith("f.toml: ") and text.isprintable(), text
    assert value.encode("unicode_escape").decode("ascii") in text
    if value == "\r":
        assert text.endswith("\\r: unknown graph file type '' (expected one of .edgelist, .edges, .graphml, "
                             ".txt, .xml)"), text


# ----------------------------------------------------------------------------- streamed data

UDATA_STREAMED = """
import torch
class Triples(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.zeros(2), 0, "extra"
class Labelled(torch.utils.data.Dataset):
    targets = [0, 1, 5, 2]
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.zeros(2), self.targets[i]
def triples(**kwargs):
    return Triples()
def big_labels(**kwargs):
    return Labelled()
"""


def _streamed_files(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image folders and Dataset sources STREAMED_CASES name."""
    from PIL import Image

    (tmp / "empty").mkdir()
    (tmp / "flat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp / "flat" / "0.png")
    for name in ("cat", "dog", "eel"):
        (tmp / "three" / name).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp / "three" / name / "0.png")
    (tmp / "broken" / "cat").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp / "broken" / "cat" / "0.png")
    (tmp / "broken" / "cat" / "1.png").write_bytes(b"not a png")
    for name in ("pipe", "bomb", "wide"):
        (tmp / name / "cat").mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp / name / "cat" / "1.png")
    os.mkfifo(tmp / "pipe" / "cat" / "0.png")  # opening it would wait for a writer for ever
    Image.new("1", (13_400, 13_400)).save(tmp / "bomb" / "cat" / "0.png")  # 22 kB, 180 million pixels
    Image.new("RGB", (5000, 4)).save(tmp / "wide" / "cat" / "0.png")
    (tmp / "udata_streamed.py").write_text(UDATA_STREAMED)
    monkeypatch.syspath_prepend(str(tmp))


FOLDERS = "expected one subfolder of images per class: FOLDER/<class>/<image>"
STREAM = ["--set", "data.stream=true"]
# id -> (fl-node flags with {tmp} to fill in, the stderr line after "fl-node a: error: ")
STREAMED_CASES: dict[str, tuple[list[str], str]] = {
    "folder-empty": (["--data", "{tmp}/empty"], f"--data {{tmp}}/empty: is empty; {FOLDERS}"),
    "folder-no-classes": (["--data", "{tmp}/flat"],
                          f"--data {{tmp}}/flat: holds no class subfolders; {FOLDERS}"),
    "folder-over-classes": (["--data", "{tmp}/three", "--set", "data.classes=2"],
                            "--data {tmp}/three: 3 class subfolders, but [data] classes = 2"),
    "folder-bad-image": (["--data", "{tmp}/broken"],
                         "{tmp}/broken/cat/1.png: cannot be read as an image (cannot identify image file"),
    "folder-missing": (["--data", "{tmp}/nowhere"], "--data {tmp}/nowhere: no such file or folder"),
    "folder-named-pipe": (["--data", "{tmp}/pipe"], "{tmp}/pipe/cat/0.png: not a regular file"),
    "folder-decompression-bomb": (["--data", "{tmp}/bomb"],
                                  "{tmp}/bomb/cat/0.png: cannot be read as an image (Image size (179560000 "
                                  "pixels) exceeds limit of 178956970 pixels, could be decompression bomb"),
    "folder-first-image-too-wide": (["--data", "{tmp}/wide"],
                                    "{tmp}/wide/cat/0.png: the first image, 5000 x 4 pixels, sets the size "
                                    "every image is resized to; set [data] image_size = [H, W], at most 4096 "
                                    "a side"),
    "dataset-not-pairs": (["--data-source", "udata_streamed:triples", *STREAM],
                          "--data-source 'udata_streamed:triples': item 0 is a tuple, not an (x, y) pair"),
    "dataset-label-over-classes": (["--data-source", "udata_streamed:big_labels", "--set", "data.classes=3",
                                    *STREAM], "--data-source 'udata_streamed:big_labels': holds the label 5, "
                                   "but [data] classes = 3 (labels 0..2)"),
}


@pytest.mark.parametrize(("args", "message"), STREAMED_CASES.values(), ids=STREAMED_CASES.keys())
def test_fl_node_bad_streamed_data_is_one_line_exit_2(tmp_path, capsys, monkeypatch, args, message):
    from flmesh.cli.node import main as node_main

    from procs import federation_file

    _streamed_files(tmp_path, monkeypatch)
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=1)
    argv = ["--id", "a", "--federation", str(fed), "--peer", "b=127.0.0.1:1", "--peer", "c=127.0.0.1:1",
            "--listen", "127.0.0.1:0", "--out", str(tmp_path / "out"), *[_fill(a, tmp_path) for a in args]]
    assert node_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl-node a: error: " + _fill(message, tmp_path)), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists(), "nothing ran: no results folder"
