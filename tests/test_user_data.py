"""User data: a ``[data] source`` in fl-sim's Simulation, and fl-node processes on their own files.

The source is a module the test writes (2-D Gaussian blobs, seeded), imported by its path.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import tracemalloc

import numpy as np
import pytest
import torch

from flmesh.cli.sim_console import title
from flmesh.config import parse_federation
from flmesh.learning.arrays import ArrayData, DataError
from flmesh.learning.data import federation_data
from flmesh.learning.node_files import read_file
from flmesh.learning.task import Task
from flmesh.reports.record import data_config
from flmesh.sim.simulation import Simulation
from flmesh.testing import run

from conftest import tiny_raw
from procs import federation_file, launch, read_results

BLOBS = textwrap.dedent("""
    import numpy as np
    import torch

    def make(n, seed):
        rng = np.random.default_rng(seed)
        centres = np.array([[0.0, 4.0], [4.0, 0.0], [-4.0, -4.0]])
        y = rng.integers(0, 3, n)
        return (centres[y] + rng.normal(0, 1.5, size=(n, 2))).astype(np.float32), y

    def blobs(n=240, seed=0):
        return make(n, seed)

    def with_test(n=240, seed=0):
        x, y = make(n, seed)
        xt, yt = make(n // 2, seed + 1)
        return {"x": torch.from_numpy(x), "y": torch.from_numpy(y), "x_test": xt, "y_test": yt}

    class Points(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            self.x, self.y = make(n, seed)
        def __len__(self):
            return len(self.y)
        def __getitem__(self, i):
            return torch.from_numpy(self.x[i]), int(self.y[i])

    def dataset(n=240, seed=0):
        return Points(n, seed)

    def per_node(node_id, n=240, seed=0):
        return make(n + 10 * int(node_id[-1]), seed)

    def one(**kwargs):
        return make(1, 0)

    def five(**kwargs):
        return make(5, 0)
""")


@pytest.fixture
def blobs_module(tmp_path, monkeypatch):
    (tmp_path / "user_blobs.py").write_text(BLOBS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_blobs"


def blob_federation(source: str, partition: str = "dirichlet", **args):
    raw = tiny_raw(rounds=2, data={"partition": partition, "alpha": 1.0, "min_samples": 5},
                   training={"batch_size": 16, "lr": 0.1})
    del raw["data"]["dataset"]
    raw["data"].update(source=source, args={"n": 240, "seed": 7, **args})
    return parse_federation(raw, source="blobs.toml")


def test_a_source_runs_a_peer_federation_reproducibly(tmp_path, blobs_module):
    fed = blob_federation(f"{blobs_module}:blobs")
    finals = []
    for attempt in ("a", "b"):
        torch.manual_seed(0)
        with Simulation(fed, tmp_path / attempt) as sim:
            summary = sim.run()
        assert summary.config["dataset"] == "user_blobs:blobs"
        assert summary.final is not None and summary.final.fa is not None
        finals.append((summary.final.fa, summary.final.ff, summary.final.pfa))
    assert finals[0] == finals[1]
    assert finals[0][0] > 0.5, "three well-separated blobs are learnt above chance (1/3)"
    shares = federation_data(fed)
    assert sum(len(s.train) + len(s.test) for s in shares.values()) == 240
    assert all(s.train.input_shape == (2,) and s.train.num_classes == 3 for s in shares.values())


def test_data_given_in_python_runs_as_the_same_data_from_a_source(tmp_path, blobs_module):
    import user_blobs

    fed = blob_federation(f"{blobs_module}:blobs")
    want = run(fed)
    x, y = user_blobs.blobs(n=240, seed=7)
    raw = dict(fed.raw or {})
    raw["data"] = {k: v for k, v in raw["data"].items() if k not in ("source", "args")}
    plain = parse_federation(raw, source="plain.toml")  # no [data] source: the default data set
    for given in ((x, y), ArrayData(torch.from_numpy(x), torch.from_numpy(y), 3),
                  user_blobs.Points(240, 7)):
        got = run(plain, task=Task.of(plain, data=given))
        assert got.keys() == want.keys()
        for node, state in want.items():
            assert all(torch.equal(got[node][k], v) for k, v in state.items()), (type(given), node)
    with Simulation(plain, tmp_path / "sim", data=(x, y)) as sim:
        summary = sim.run()
    assert summary.config["dataset"] == "tuple from Python"
    assert json.loads((tmp_path / "sim" / "run.json").read_text())["python_code"] == "data"
    with pytest.raises(DataError, match=r"^data= returned a str; expected "):
        Simulation(plain, tmp_path / "bad", data="data.csv").start()


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "dirichlet_equal", "shards"])
def test_every_partition_splits_a_source_disjointly(blobs_module, partition):
    fed = blob_federation(f"{blobs_module}:blobs", partition)
    shares = federation_data(fed)
    seen = [tuple(map(float, row)) for s in shares.values() for part in (s.train, s.test)
            for row in part.x.numpy()]
    assert len(seen) == len(set(seen)) == 240
    again = federation_data(fed)
    assert all(torch.equal(shares[n].train.x, again[n].train.x) for n in shares)


def test_a_torch_dataset_source_is_read_into_the_same_tensors(blobs_module):
    arrays = federation_data(blob_federation(f"{blobs_module}:blobs"))
    dataset = federation_data(blob_federation(f"{blobs_module}:dataset"))
    for node, share in arrays.items():
        assert torch.equal(share.train.x, dataset[node].train.x)
        assert torch.equal(share.test.y, dataset[node].test.y)


def test_a_separate_test_pair_is_dealt_out_in_each_partitions_label_mix(blobs_module):
    fed = blob_federation(f"{blobs_module}:with_test")
    shares = federation_data(fed)
    assert sum(len(s.train) for s in shares.values()) == 240  # every sample trains
    assert sum(len(s.test) for s in shares.values()) == 120  # every test sample is used once
    for share in shares.values():
        train = np.bincount(share.train.y.numpy(), minlength=3) / len(share.train)
        test = np.bincount(share.test.y.numpy(), minlength=3) / len(share.test)
        assert np.abs(train - test).max() < 0.2, (train, test)


def test_a_node_source_gets_the_node_id_and_a_seeded_test_split(blobs_module):
    from flmesh.learning.user_data import own_data

    fed = blob_federation(f"{blobs_module}:blobs")
    shares = [own_data(fed, node, source=f"{blobs_module}:per_node", what="--data-source")
              for node in ("node1", "node2", "node2")]
    assert [len(s.train) + len(s.test) for s in shares] == [250, 260, 260]
    assert len(shares[1].test) == round(0.2 * 260) and shares[1].train.num_classes == 3
    assert torch.equal(shares[1].test.x, shares[2].test.x), "the split is seeded"


def _write_npz(path, n, seed):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    x = np.array([[0.0, 4.0], [4.0, 0.0], [-4.0, -4.0]])[y] + rng.normal(0, 1.0, size=(n, 2))
    np.savez(path, x=x.astype(np.float32), y=y)
    return x, y


def test_fl_sim_reads_each_nodes_own_file(tmp_path):
    sizes = {"a": 30, "b": 45, "c": 60}
    for i, (node, n) in enumerate(sizes.items()):
        _write_npz(tmp_path / f"{node}.npz", n, i)
    raw = tiny_raw(rounds=2, data={"classes": 3})
    del raw["topology"]["nodes"]
    raw["nodes"] = {node: {"data": f"{node}.npz"} for node in sizes}
    fed = parse_federation(raw, source="own.toml", base_dir=tmp_path)
    shares = federation_data(fed)
    assert {n: len(s.train) + len(s.test) for n, s in shares.items()} == sizes
    assert all(s.train.num_classes == 3 and s.train.input_shape == (2,) for s in shares.values())
    with Simulation(fed, tmp_path / "run") as sim:
        summary = sim.run()
    assert summary.final is not None and summary.final.fa is not None and summary.final.fa > 0.5
    # the record says what the nodes trained on, not the [data] defaults they never read
    assert summary.config["dataset"] is None and summary.config["partition"] is None
    assert summary.config["own_data"] == {node: f"{node}.npz" for node in sizes}
    assert title(fed, "out").count("each node's own data file") == 1 and "digits" not in title(fed, "out")


def test_fl_sim_refuses_nodes_whose_files_differ_in_shape_in_one_line(tmp_path):
    """Each node would build its own model and every delivery would fail mid-run (a traceback)."""
    _write_npz(tmp_path / "a.npz", 30, 0)
    x, y = _write_npz(tmp_path / "wide.npz", 30, 1)
    np.savez(tmp_path / "wide.npz", x=np.concatenate([x, x], axis=1).astype(np.float32), y=y)
    np.savez(tmp_path / "four.npz", x=x.astype(np.float32), y=np.arange(30) % 4)
    for other, said in (("wide", "a's data has inputs [2] and 3 classes, b's inputs [4] and 3 classes: every "
                                 "node of a federation needs data of one shape (they train one model)"),
                        ("four", "a's data has inputs [2] and 3 classes, b's inputs [2] and 4 classes: every "
                                 "node of a federation needs data of one shape (they train one model); set "
                                 "[data] classes")):
        raw = tiny_raw(rounds=2)
        del raw["topology"]["nodes"]
        raw["nodes"] = {"a": {"data": "a.npz"}, "b": {"data": f"{other}.npz"}, "c": {"data": "a.npz"}}
        fed = parse_federation(raw, source="own.toml", base_dir=tmp_path)
        with pytest.raises(DataError) as err:
            federation_data(fed)
        assert str(err.value) == f"own.toml: {said}"


@pytest.mark.parametrize(("partition", "source", "said"), [
    ("iid", "one", "node0's share holds 1 of the 1 samples split over 3 nodes"),
    ("iid", "five", "node2's share holds 1 of the 5 samples split over 3 nodes"),
    ("dirichlet_equal", "five", "node2's share holds 1 of the 5 samples split over 3 nodes"),
])
def test_a_source_too_small_for_its_nodes_is_refused_in_one_line(blobs_module, partition, source, said):
    """Not a run in which a node trains on nothing and tests on nothing (0 %)."""
    fed = blob_federation(f"{blobs_module}:{source}", partition=partition)
    with pytest.raises(DataError) as err:
        federation_data(fed)
    assert str(err.value) == (f"blobs.toml: [data] source '{blobs_module}:{source}': {said}; a node needs 2 "
                              "or more (to train and to test)")


def test_a_csv_is_read_into_float32_without_a_python_object_per_value(tmp_path):
    """The rows used to be lists of Python floats (some 24 bytes a value, then a float64 copy): a
    154 MB file took 3.7 GB. Now each value is 4 bytes once read."""
    rows, columns = 20_000, 20
    rng = np.random.default_rng(0)
    values = rng.random((rows, columns)).astype(np.float32)
    path = tmp_path / "big.csv"
    with path.open("w") as f:
        f.write(",".join([*(f"f{i}" for i in range(columns)), "label"]) + "\n")
        for i, row in enumerate(values):
            f.write(",".join(f"{v:.6f}" for v in row) + f",{i % 3}\n")
    tracemalloc.start()
    try:
        (x, y), test = read_file(path, "--data big.csv", "label")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert test is None and x.shape == (rows, columns) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_allclose(x, values, atol=1e-6)
    assert peak < 1.5 * rows * (columns * 4 + 8) < path.stat().st_size, (peak, path.stat().st_size)


def test_the_record_names_the_partition_and_the_nodes_with_their_own_files(tmp_path):
    _write_npz(tmp_path / "n1.npz", 30, 0)
    raw = tiny_raw(nodes=3, data={"partition": "iid", "classes": 3})
    raw["nodes"] = {"node1": {"data": "n1.npz"}}
    fed = parse_federation(raw, source="mixed.toml", base_dir=tmp_path)
    assert data_config(fed) == {"dataset": "digits", "partition": {"kind": "iid"},
                                "own_data": {"node1": "n1.npz"}}
    assert "digits iid (own files: node1)" in title(fed, "out")
    shards = parse_federation(tiny_raw(data={"partition": "shards", "shards_per_node": 3}))
    assert data_config(shards)["partition"] == {"kind": "shards", "shards_per_node": 3}
    assert "digits shards(3 per node)" in title(shards, "out")
    assert data_config(parse_federation(tiny_raw(data={"alpha": 0.3})))["partition"] == {"kind": "dirichlet",
                                                                                        "alpha": 0.3}


@pytest.mark.slow
def test_fl_node_processes_train_on_their_own_files(tmp_path):
    ids = ["a", "b", "c"]
    sizes = {"a": 40, "b": 60, "c": 90}
    for i, node in enumerate(ids[:2]):
        _write_npz(tmp_path / f"{node}.npz", sizes[node], i)
    x, y = _write_npz(tmp_path / "c.npz", sizes["c"], 2)  # c holds a CSV with its labels in "kind"
    lines = ["f1,kind,f2", *(f"{a:.6f},{k},{b:.6f}" for (a, b), k in zip(x, y, strict=True))]
    (tmp_path / "c.csv").write_text("\n".join(lines) + "\n")
    fed = federation_file(tmp_path, ids, rounds=2, graph="complete",
                          node_extra={"a": 'data = "a.npz"', "b": 'data = "b.npz"', "c": 'data = "c.csv"'})
    # [data] names a set that is not there: a node with its own data never reads it
    procs = launch(tmp_path, fed, ids, "--set", "data.classes=3", "--set", 'data.label_column="kind"',
                   "--set", 'data.dataset="mnist"', "--set", 'data.root="nowhere"')
    try:
        outputs = {i: p.communicate(timeout=300) for i, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    for node in ids:
        assert procs[node].returncode == 0, outputs[node][1][-3000:]
        rows, summary = read_results(tmp_path / "runs" / f"procs-{node}")
        assert [r["round"] for r in rows] == [1, 2] and not summary["interrupted"]
        data = summary["config"]["data"]
        assert data["own"] and data["origin"].endswith(f"{node}.{'csv' if node == 'c' else 'npz'}")
        assert data["train_samples"] + data["test_samples"] == sizes[node]
        assert data["test_samples"] == round(0.2 * sizes[node]) and data["classes"] == 3
        assert sum(data["label_counts"]) == data["train_samples"]


# ----------------------------------------------------------------------------- streamed Datasets

def streamed_federation(source: str, rounds: int = 2, **data):
    raw = tiny_raw(rounds=rounds, data={"partition": "dirichlet", "alpha": 1.0, "min_samples": 5,
                                        "stream": True, **data},
                   training={"batch_size": 16, "lr": 0.1})
    del raw["data"]["dataset"]
    raw["data"].update(source=source, args={"n": 240, "seed": 7})
    return parse_federation(raw, source="blobs.toml")


def _finals(fed, out):
    torch.manual_seed(0)
    with Simulation(fed, out) as sim:
        summary = sim.run()
    assert summary.final is not None and summary.final.fa is not None
    return summary.final.fa, summary.final.ff, summary.final.pfa


def test_a_streamed_dataset_repeats_and_trains_as_its_tensors_do(tmp_path, blobs_module):
    from flmesh.learning.streamed import DatasetData

    fed = streamed_federation(f"{blobs_module}:dataset")
    shares, arrays = federation_data(fed), federation_data(blob_federation(f"{blobs_module}:blobs"))
    for node, share in shares.items():
        assert isinstance(share.train, DatasetData) and isinstance(share.test, DatasetData)
        assert share.train.input_shape == (2,) and share.train.num_classes == 3
        assert torch.equal(share.train.y, arrays[node].train.y), "split by the same labels"
        assert torch.equal(share.train.x[:], arrays[node].train.x), "the same samples, read on demand"
    streamed = [_finals(fed, tmp_path / attempt) for attempt in ("a", "b")]
    assert streamed[0] == streamed[1]
    assert streamed[0][0] > 0.5, "three well-separated blobs are learnt above chance (1/3)"
    # The DataLoader is handed the order the in-memory path indexes with (one seeded permutation
    # per pass) and reads the same float32 inputs, so the numbers are the same, not just close.
    assert _finals(blob_federation(f"{blobs_module}:blobs"), tmp_path / "tensors") == streamed[0]


def test_dataloader_workers_give_the_numbers_of_the_training_thread(tmp_path, blobs_module):
    source = f"{blobs_module}:dataset"
    one = _finals(streamed_federation(source, rounds=1), tmp_path / "w0")
    assert _finals(streamed_federation(source, rounds=1, workers=2), tmp_path / "w2") == one


LABELLED = textwrap.dedent("""
    import torch

    class Counted(torch.utils.data.Dataset):
        reads = 0
        def __init__(self, n):
            self.targets = [i % 3 for i in range(n)]
        def __len__(self):
            return len(self.targets)
        def __getitem__(self, i):
            Counted.reads += 1
            return torch.full((4,), float(self.targets[i])), self.targets[i]
""")


def test_labels_come_from_targets_without_reading_the_items(tmp_path, monkeypatch):
    from flmesh.learning.streamed import streamed

    (tmp_path / "user_counted.py").write_text(LABELLED)
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_counted

    data = streamed(user_counted.Counted(30), "counted", classes=None)
    assert user_counted.Counted.reads == 1, "item 0 only, for the input shape"
    assert data.label_counts() == [10, 10, 10] and data.input_shape == (4,)
    part = data.subset(np.array([4, 5]))
    assert part.y.tolist() == [1, 2] and torch.equal(part.x[:], torch.tensor([[1.0] * 4, [2.0] * 4]))


def test_federations_that_need_in_memory_data_refuse_a_streamed_one(blobs_module):
    from flmesh.learning.arrays import DataError

    raw = tiny_raw(nodes=4, rounds=4, tasks={"tasks": 2, "rounds_per_task": 2},
                   data={"stream": True, "source": f"{blobs_module}:dataset", "args": {"n": 240, "seed": 7}})
    del raw["data"]["dataset"]
    with pytest.raises(DataError, match=r"^\[data\] source 'user_blobs:dataset' is streamed from disk, "
                                        r"but a continual federation \(\[tasks\]\) cuts the data into tasks"):
        federation_data(parse_federation(raw, source="c.toml"))
    joint = dataclasses.replace(streamed_federation(f"{blobs_module}:dataset"), baseline="joint")
    with pytest.raises(DataError, match='baseline = "joint" joins every node'):
        federation_data(joint)


def test_a_star_federation_tunes_on_a_streamed_public_split(tmp_path, blobs_module):
    from flmesh.learning.data import public_data
    from flmesh.learning.streamed import DatasetData

    raw = tiny_raw(rounds=2, data={"stream": True, "source": f"{blobs_module}:dataset", "partition": "iid",
                                   "args": {"n": 240, "seed": 7}},
                   aggregator={"strategy": "fedavg_ft", "public_fraction": 0.1})
    del raw["data"]["dataset"]
    fed = parse_federation(raw, source="star.toml")
    public = public_data(fed)
    assert isinstance(public, DatasetData) and 20 <= len(public) <= 28
    assert _finals(fed, tmp_path / "run")[0] > 0.5


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "dirichlet_equal", "shards"])
def test_every_partition_splits_a_streamed_dataset_into_subsets_by_its_labels(blobs_module, partition):
    from torch.utils.data import Subset

    shares = federation_data(streamed_federation(f"{blobs_module}:dataset", partition=partition))
    arrays = federation_data(blob_federation(f"{blobs_module}:blobs", partition))
    for node, share in shares.items():
        assert isinstance(share.train.dataset, Subset)
        for mine, theirs in ((share.train, arrays[node].train), (share.test, arrays[node].test)):
            assert torch.equal(mine.y, theirs.y) and torch.equal(mine.x[:], theirs.x)
