"""Federation file: what a valid file gives, and one clear line for each malformed one."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from flmesh.config import FederationError, GraphError, load_federation
from flmesh.config.graphs import ALIASES, GENERATORS, generate_graph, is_generator

REPO = Path(__file__).resolve().parent.parent

VALID = """
[federation]
name = "demo"
seed = 5
rounds = 3

[topology]
nodes = 4
graph = "ring"

[training]
epochs = 0.5
lr = 0.1

[data]
alpha = 0.3

[model]
name = "cnn"
channels = [8]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fed.toml"
    path.write_text(text)
    return path


def test_valid_file_and_defaults(tmp_path):
    fed = load_federation(write(tmp_path, VALID))
    assert (fed.name, fed.seed, fed.rounds) == ("demo", 5, 3)
    assert fed.node_ids == ["node0", "node1", "node2", "node3"]
    assert fed.training.epochs == 0.5 and fed.training.batch_size == 32
    assert fed.data.alpha == 0.3 and fed.data.partition == "dirichlet"
    assert fed.model.channels == (8,)
    assert fed.schedule().plan(2)["node0"].destination == "node1"


def test_per_node_tables_override_training(tmp_path):
    text = VALID.replace("nodes = 4\n", "") + """
[nodes.alice]
address = "127.0.0.1:5001"
epochs = 2
[nodes.bob]
partition = 0
[nodes.carol]
"""
    fed = load_federation(write(tmp_path, text))
    assert fed.node_ids == ["alice", "bob", "carol"]
    assert fed.node("alice").training.epochs == 2 and fed.node("alice").address == "127.0.0.1:5001"
    assert fed.node("bob").training.epochs == 0.5 and fed.node("bob").partition == 0


def test_overrides(tmp_path):
    fed = load_federation(write(tmp_path, VALID), ["training.epochs=3", "model.name=mlp",
                                                   "federation.name=\"other\""])
    assert fed.training.epochs == 3 and fed.model.name == "mlp" and fed.name == "other"


def test_a_federation_file_takes_every_digest_a_node_can_check(tmp_path):
    from flmesh.format.digests import DIGESTS

    assert load_federation(write(tmp_path, VALID)).wire.digest == DIGESTS[0] == "xxh3_128"
    for digest in DIGESTS:
        text = VALID.replace("[model]", f'[wire]\ndigest = "{digest}"\n[model]', 1)
        assert load_federation(write(tmp_path, text)).wire.digest == digest


def test_every_example_is_valid():
    examples = sorted((REPO / "examples").glob("*.toml"))
    assert examples
    for path in examples:
        load_federation(path)


def test_the_readmes_federation_file_with_its_node_table_is_valid(tmp_path):
    readme = (REPO / "README.md").read_text()
    start = readme.index('```toml\n[federation]\nname = "quickstart"') + len("```toml\n")
    text = readme[start:readme.index("```", start)]
    assert "\n# [nodes.node3]" in text and "\n# epochs = 1\n" in text
    text = text.replace("\n# [nodes.node3]", "\n[nodes.node3]").replace("\n# epochs = 1\n", "\nepochs = 1\n")
    fed = load_federation(write(tmp_path, text))
    assert len(fed.nodes) == 10 and [n.id for n in fed.nodes if n.training.epochs == 1] == ["node3"]


# (replace this, with that) -> the message that must appear, after "fed.toml: "
MALFORMED = [
    ('name = "demo"\n', "", "[federation] name: required key is missing"),
    ("rounds = 3", "rounds = 0", "[federation] rounds: expected an integer >= 1, got 0"),
    ("rounds = 3", 'rounds = "3"', "[federation] rounds: expected an integer >= 1, got '3'"),
    ("seed = 5", "seed = 1.5", "[federation] seed: expected an integer >= 0, got 1.5"),
    ("epochs = 0.5", "epoch = 0.5", "[training] epoch: unknown key (expected one of batch_size,"),
    ("lr = 0.1", "lr = -1", "[training] lr: expected a number > 0, got -1"),
    ("lr = 0.1", "optimizer = \"rmsprop\"", "[training] optimizer: expected one of 'sgd', 'adam', or an"),
    ("alpha = 0.3", "alpha = 0", "[data] alpha: expected a number > 0, got 0"),
    ("alpha = 0.3", "test_fraction = 1.0", "[data] test_fraction: expected a number in (0, 1), got 1.0"),
    ("alpha = 0.3", 'dataset = "imagenet"',
     "[data] dataset: expected one of 'cifar10', 'cifar100', 'digits', 'emnist_balanced', "
     "'emnist_byclass', 'emnist_bymerge', 'emnist_digits', 'emnist_letters', 'emnist_mnist', "
     "'fashion_mnist', 'mnist', or several joined by '+', got 'imagenet'"),
    ("alpha = 0.3", 'dataset = "digits+digits"', "[data] dataset: expected one of"),
    ('name = "cnn"', 'name = "vit"',
     "[model] name: expected one of 'cnn', 'cnn2', 'mlp', 'resnet18', got 'vit'"),
    ("channels = [8]", "channels = [8, 0]", "[model] channels: expected a non-empty list of positive"),
    ('graph = "ring"', 'graph = "path"', "[topology] schedule 'cwt': the graph has no cycle"),
    ('graph = "ring"', 'graph = "nosuch"', "[topology] unknown graph 'nosuch'"),
    ('graph = "ring"', 'schedule = "rumour"', "[topology] schedule: expected one of 'cwt'"),
    ("nodes = 4", "nodes = 1", "[topology] nodes: expected an integer >= 2, got 1"),
    ("nodes = 4\n", "", "[topology] nodes: required: give the node count"),
    ("[model]", "[modle]", "[modle]: unknown section"),
    ("[model]", '[wire]\ndigest = "md5"\n[model]',
     "[wire] digest: expected one of 'xxh3_128', 'blake3', 'sha256', got 'md5'"),
    ("rounds = 3", "rounds = 3\nrounds = 4", "not valid TOML"),
    ('graph = "ring"', 'graph = "ring"\nfile = "missing.graphml"', "missing.graphml: graph file not found"),
]


@pytest.mark.parametrize(("old", "new", "message"), MALFORMED, ids=[m[2][:40] for m in MALFORMED])
def test_malformed_file_gives_one_line_naming_file_and_key(tmp_path, old, new, message):
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(FederationError) as err:
        load_federation(path)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: ")
    assert message in text


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[nodes."bad id!"]\n[nodes.b]\n', "[nodes.bad id!]: node ids are"),
        ('[nodes.a]\naddress = "nohost"\n[nodes.b]\n', "[nodes.a] address: expected HOST:PORT"),
        ("[nodes.a]\npartition = 7\n[nodes.b]\n", "[nodes.a] partition: expected an integer < 2, got 7"),
        ("[nodes.a]\npartition = 1\n[nodes.b]\npartition = 1\n", "partition 1 is already held by 'a'"),
        ("[nodes.a]\nepochs = -1\n[nodes.b]\n", "[nodes.a] epochs: expected a number > 0"),
        ("[nodes.a]\ncolour = 1\n[nodes.b]\n", "[nodes.a] colour: unknown key"),
        ("[nodes.a]\n", "a federation needs at least 2 nodes, got 1"),
    ],
)
def test_malformed_node_tables(tmp_path, table, message):
    path = write(tmp_path, VALID.replace("nodes = 4\n", "") + table)
    with pytest.raises(FederationError) as err:
        load_federation(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_section_that_is_not_a_table(tmp_path):
    path = write(tmp_path, "data = 3\n" + VALID.replace("[data]\nalpha = 0.3\n", ""))
    with pytest.raises(FederationError, match=r"\[data\]: expected a table, got 3"):
        load_federation(path)


def test_node_count_must_agree_with_node_tables(tmp_path):
    path = write(tmp_path, VALID + "[nodes.a]\n[nodes.b]\n")
    with pytest.raises(FederationError, match=r"\[topology\] nodes: says 4 but \[nodes\] lists 2"):
        load_federation(path)


def test_an_unknown_node_is_named_with_the_first_ids_and_how_many_more(tmp_path):
    fed = load_federation(write(tmp_path, VALID.replace("nodes = 4", "nodes = 20")))
    assert fed.has_node("node19") and not fed.has_node("node20") and fed.node("node7").index == 7
    with pytest.raises(FederationError) as err:
        fed.node("node20")
    assert str(err.value).endswith("unknown node 'node20' (the federation has node0, node1, node2, node3, "
                                   "node4, node5, node6, node7 and 12 more)")


def test_a_node_table_overrides_one_of_n_generated_nodes(tmp_path):
    text = VALID.replace("nodes = 4", "nodes = 10") + "[nodes.node3]\nepochs = 1\nlr = 0.01\n"
    fed = load_federation(write(tmp_path, text))
    assert fed.node_ids == [f"node{i}" for i in range(10)]
    by_id = {n.id: n for n in fed.nodes}
    assert by_id["node3"].training.epochs == 1 and by_id["node3"].training.lr == 0.01
    assert by_id["node2"].training.epochs == 0.5 and by_id["node2"].training.lr == 0.1
    assert fed.training.epochs == 0.5


@pytest.mark.parametrize("tables", ["[nodes.node12]\n", "[nodes.node3]\n[nodes.alpha]\n"])
def test_a_node_table_outside_the_n_nodes_is_one_line(tmp_path, tables):
    text = VALID.replace("nodes = 4", "nodes = 10") + tables + "epochs = 1\n"
    with pytest.raises(FederationError) as info:
        load_federation(write(tmp_path, text))
    stranger = tables.split("\n")[-2]
    assert str(info.value) == (f"{tmp_path / 'fed.toml'}: {stranger}: not one of the 10 nodes of [topology] "
                               "nodes = 10 (node0 to node9); to name nodes yourself, give each of the 10 "
                               "a [nodes.<id>] table")


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(FederationError, match="federation file not found"):
        load_federation(tmp_path / "nope.toml")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(FederationError, match="cannot read federation file"):
        load_federation(bad)


def test_bad_override(tmp_path):
    with pytest.raises(FederationError, match="--set 'epochs=3': expected SECTION.KEY=VALUE"):
        load_federation(write(tmp_path, VALID), ["epochs=3"])
    with pytest.raises(FederationError, match=r"\[training\] epochs: expected a number > 0, got 'x'"):
        load_federation(write(tmp_path, VALID), ["training.epochs=x"])


# ----------------------------------------------------------------------------- graph allow-list

# Parameters that make each allowed generator build a graph; the others take their defaults.
SAMPLE_PARAMS = {
    "circulant_graph": {"offsets": [1, 2]}, "turan_graph": {"r": 2}, "erdos_renyi_graph": {"p": 0.5},
    "gnp_random_graph": {"p": 0.5}, "binomial_graph": {"p": 0.5}, "fast_gnp_random_graph": {"p": 0.5},
    "gnm_random_graph": {"m": 5}, "dense_gnm_random_graph": {"m": 5},
    "watts_strogatz_graph": {"k": 2, "p": 0.3}, "newman_watts_strogatz_graph": {"k": 2, "p": 0.3},
    "connected_watts_strogatz_graph": {"k": 2, "p": 0.3}, "barabasi_albert_graph": {"m": 1},
    "dual_barabasi_albert_graph": {"m1": 1, "m2": 2, "p": 0.5}, "powerlaw_cluster_graph": {"m": 1, "p": 0.5},
    "gaussian_random_partition_graph": {"s": 2, "v": 1, "p_in": 0.8, "p_out": 0.2},
    "hnm_harary_graph": {"m": 5},
}


def test_allowed_generators_keep_the_rule():
    for name in GENERATORS:
        func = getattr(nx, name)
        assert is_generator(func), name
        assert func.__module__.startswith("networkx.generators."), name
    # The rule alone is not enough: hypercube_graph(n) fits its shape and builds 2**n nodes.
    assert is_generator(nx.hypercube_graph) and "hypercube_graph" not in GENERATORS
    assert not any(is_generator(f) for f in (nx.write_graphml, nx.read_edgelist, nx.is_connected,
                                             nx.relabel_nodes, nx.random_regular_graph))


@pytest.mark.parametrize("n", [5, 6])
@pytest.mark.parametrize("name", GENERATORS)
def test_every_allowed_generator_builds_exactly_n_nodes(name, n):
    ids = [f"v{i}" for i in range(n)]
    assert list(generate_graph(name, ids, SAMPLE_PARAMS.get(name), seed=1).nodes) == ids


def test_no_other_networkx_name_builds_a_graph():
    allowed = {*ALIASES, *GENERATORS, *(g.removesuffix("_graph") for g in GENERATORS)}
    refused = [name for name in dir(nx) if name not in allowed]
    assert {"write_graphml", "read_graphml", "is_connected", "hypercube_graph", "draw"} <= set(refused)
    for name in refused:
        with pytest.raises(GraphError, match=r"^unknown graph "):
            generate_graph(name, ["a", "b", "c"])
