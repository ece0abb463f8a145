"""torchvision data sets from a local root and the vision models (cnn2, resnet18 with BN/GN, weights).

Every data set is written here, tiny, in the on-disk format torchvision reads
(idx files for MNIST, Fashion-MNIST and EMNIST, pickled batches for CIFAR), then
loaded through the federation file like a user's run would.

torchvision checks the MD5 of every CIFAR file on every load (not only after a
download), against the digests of the real files. Tiny files cannot match
those, so the CIFAR tests register a subclass of torchvision's class whose
checksum lists hold the tiny files' digests, through flmesh's own
``VISION_SETS`` registry; torchvision itself is not patched, and its loading
code, checksum test included, runs unchanged. One test checks that the
unmodified classes refuse the tiny files with a one-line DataError.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from flmesh.cli.fl_sim import main
from flmesh.config import FederationError, ModelConfig, parse_federation
from flmesh.learning import vision as data_mod
from flmesh.learning.arrays import DataError
from flmesh.learning.data import federation_data, load_dataset
from flmesh.learning.models import ModelError, build_model
from flmesh.learning.trainer import evaluate, train

from conftest import tiny_raw

VISION = ("mnist", "fashion_mnist", "cifar10", "cifar100")
# name -> (split, classes) as torchvision.datasets.EMNIST defines them
EMNIST = {"emnist_byclass": ("byclass", 62), "emnist_bymerge": ("bymerge", 47),
          "emnist_balanced": ("balanced", 47), "emnist_letters": ("letters", 26),
          "emnist_digits": ("digits", 10), "emnist_mnist": ("mnist", 10)}


# ------------------------------------------------------------------ tiny files
def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> None:
    """An idx file (big-endian magic 0x08 0x<ndim>, dims, uint8 bytes), as on the MNIST mirrors."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    raw = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)


def write_mnist(root: Path, folder: str, n_train: int = 30, n_test: int = 10, gz: bool = False,
                files: tuple[str, str, str, str] = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                                    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
                num_classes: int = 10, label_offset: int = 0, transposed: bool = False):
    """Tiny MNIST-format files under root/folder/raw; returns the pool (uint8 NCHW, labels 0..C-1).

    ``files`` are the train images, train labels, test images and test labels file names;
    ``label_offset`` is added to the labels written; ``transposed`` writes every image
    transposed, as the EMNIST files hold them (the returned pool is upright).
    """
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n_train + n_test, 28, 28), dtype=np.uint8)
    images[0] = 0
    images[1] = 255  # both ends of the range
    labels = np.arange(n_train + n_test) % num_classes
    on_disk = images.transpose(0, 2, 1) if transposed else images
    raw = root / folder / "raw"
    write_idx(raw / files[0], on_disk[:n_train], gz)
    write_idx(raw / files[1], labels[:n_train] + label_offset, gz)
    write_idx(raw / files[2], on_disk[n_train:], gz)
    write_idx(raw / files[3], labels[n_train:] + label_offset, gz)
    return images[:, None], labels


def emnist_files(split: str) -> tuple[str, str, str, str]:
    return (f"emnist-{split}-train-images-idx3-ubyte", f"emnist-{split}-train-labels-idx1-ubyte",
            f"emnist-{split}-test-images-idx3-ubyte", f"emnist-{split}-test-labels-idx1-ubyte")


def write_emnist(root: Path, name: str, n_train: int = 60, n_test: int = 10, gz: bool = False):
    """Tiny files of one EMNIST split under root/EMNIST/raw as torchvision reads them: images
    transposed, letters labelled 1..26. Returns the upright pool with labels 0..C-1."""
    split, classes = EMNIST[name]
    return write_mnist(root, "EMNIST", n_train, n_test, gz, files=emnist_files(split), num_classes=classes,
                       label_offset=1 if split == "letters" else 0, transposed=True)


def _pickle(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj))


def _cifar_images(n: int, seed: int) -> np.ndarray:
    """Rows of 3072 bytes as in the CIFAR files: 1024 red, then green, then blue, row-major."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3072), dtype=np.uint8)


def write_cifar10(root: Path, per_batch: int = 6, n_test: int = 10):
    folder = root / "cifar-10-batches-py"
    rows, labels = [], []
    for i in range(1, 6):
        x, y = _cifar_images(per_batch, i), [(i + j) % 10 for j in range(per_batch)]
        _pickle(folder / f"data_batch_{i}", {
            "batch_label": f"training batch {i} of 5", "labels": y, "data": x,
            "filenames": [f"{i}_{j}.png" for j in range(per_batch)],
        })
        rows.append(x)
        labels += y
    x, y = _cifar_images(n_test, 9), [j % 10 for j in range(n_test)]
    _pickle(folder / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": y, "data": x,
                                    "filenames": [f"t_{j}.png" for j in range(n_test)]})
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    _pickle(folder / "batches.meta", {"label_names": names, "num_cases_per_batch": per_batch,
                                      "num_vis": 3072})
    pool = np.concatenate([*rows, x])
    return pool.reshape(-1, 3, 32, 32), np.array(labels + y)


def write_cifar100(root: Path, n_train: int = 20, n_test: int = 10):
    folder = root / "cifar-100-python"
    out = []
    for split, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
        x = _cifar_images(n, seed)
        fine = [(7 * j + seed) % 100 for j in range(n)]
        fine[0] = 99
        _pickle(folder / split, {"filenames": [f"{split}_{j}.png" for j in range(n)],
                                 "batch_label": f"{split} batch", "fine_labels": fine,
                                 "coarse_labels": [f // 5 for f in fine], "data": x})
        out.append((x, fine))
    _pickle(folder / "meta", {"fine_label_names": [f"class{i}" for i in range(100)],
                              "coarse_label_names": [f"super{i}" for i in range(20)]})
    pool = np.concatenate([x for x, _ in out])
    return pool.reshape(-1, 3, 32, 32), np.array(out[0][1] + out[1][1])


WRITERS = {
    "mnist": lambda root: write_mnist(root, "MNIST"),
    "fashion_mnist": lambda root: write_mnist(root, "FashionMNIST"),
    "cifar10": write_cifar10,
    "cifar100": write_cifar100,
}


def trust_tiny_files(monkeypatch: pytest.MonkeyPatch, name: str, root: Path) -> None:
    """Register a subclass of torchvision's CIFAR class whose MD5 lists are the tiny files'."""
    spec = data_mod.VISION_SETS[name]
    base = spec.dataset_class()

    def md5(fname: str) -> str:
        return hashlib.md5((root / spec.folder / fname).read_bytes()).hexdigest()

    tiny = type(f"Tiny{base.__name__}", (base,), {
        "train_list": [[f, md5(f)] for f, _ in base.train_list],
        "test_list": [[f, md5(f)] for f, _ in base.test_list],
        "meta": {**base.meta, "md5": md5(base.meta["filename"])},
    })
    monkeypatch.setitem(data_mod.VISION_SETS, name, dataclasses.replace(spec, cls=tiny))


def write_dataset(name: str, root: Path, monkeypatch: pytest.MonkeyPatch):
    pool = WRITERS[name](root)
    if name.startswith("cifar"):
        trust_tiny_files(monkeypatch, name, root)
    return pool


def vision_federation(dataset: str, base: Path, root: str = "data", **model):
    raw = tiny_raw(nodes=2, data={"dataset": dataset, "root": root, "partition": "iid",
                                  "test_fraction": 0.25},
                   model={"name": "cnn2", **model})
    return parse_federation(raw, source="vision.toml", base_dir=base)


def assert_one_line(message: str, *parts: str) -> None:
    assert "\n" not in message and "Traceback" not in message
    for part in parts:
        assert part in message, (part, message)


# ------------------------------------------------------------------ data sets
def test_registries_list_the_torchvision_sets():
    from flmesh import registry

    assert set(VISION) | set(EMNIST) | {"digits"} == set(registry.datasets.builtin_names())
    assert set(data_mod.VISION_SETS) == set(VISION) | set(EMNIST)
    assert {name: (spec.num_classes, dict(spec.kwargs)) for name, spec in data_mod.VISION_SETS.items()
            if name in EMNIST} == {name: (c, {"split": split}) for name, (split, c) in EMNIST.items()}


@pytest.mark.parametrize("name", VISION)
def test_dataset_loads_from_root_and_trains(name, tmp_path, monkeypatch):
    images, labels = write_dataset(name, tmp_path / "data", monkeypatch)
    fed = vision_federation(name, tmp_path, **({"name": "resnet18", "norm": "group"}
                                              if name == "cifar100" else {}))
    assert fed.data.root == str((tmp_path / "data").resolve())

    pool = load_dataset(fed.data)
    channels = 1 if "mnist" in name else 3
    assert pool.x.dtype == torch.float32 and pool.y.dtype == torch.int64
    assert pool.x.shape == (len(labels), channels, *((28, 28) if channels == 1 else (32, 32)))
    assert pool.num_classes == (100 if name == "cifar100" else 10)
    assert float(pool.x.min()) >= 0.0 and float(pool.x.max()) <= 1.0
    # train files then test files, channels first, pixel / 255, every value where torchvision put it
    assert torch.equal(pool.x, torch.from_numpy(images).float() / 255)
    assert torch.equal(pool.y, torch.from_numpy(labels).long())

    shares = federation_data(fed, pool)
    assert sum(len(s.train) + len(s.test) for s in shares.values()) == len(pool)
    node = shares["node0"]
    assert node.train.input_shape == pool.input_shape and len(node.test) > 0
    model = build_model(fed.model, node.train.input_shape, node.train.num_classes, seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    stats = train(model, node.train, fed.training, epochs=1, seed=0)
    assert stats.steps == math.ceil(len(node.train) / fed.training.batch_size)
    assert math.isfinite(stats.loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    result = evaluate(model, node.test)
    assert result.total == len(node.test) and len(result.per_class_total) == pool.num_classes


@pytest.mark.parametrize("name", EMNIST)
def test_emnist_split_loads_upright_with_labels_from_zero(name, tmp_path):
    import torchvision

    images, labels = write_emnist(tmp_path / "data", name)
    split, classes = EMNIST[name]
    fed = vision_federation(name, tmp_path)
    assert fed.data.dataset == name
    pool = load_dataset(fed.data)
    assert pool.x.shape == (70, 1, 28, 28) and pool.x.dtype == torch.float32
    assert pool.y.dtype == torch.int64 and pool.num_classes == classes
    assert float(pool.x.min()) == 0.0 and float(pool.x.max()) == 1.0
    assert int(pool.y.min()) == 0 and int(pool.y.max()) == classes - 1  # every class 0..C-1 once at least
    assert torch.equal(pool.x, torch.from_numpy(images).float() / 255)
    assert torch.equal(pool.y, torch.from_numpy(labels).long())
    # torchvision's own class: the same files, images transposed, letters labelled 1..26
    tv = torchvision.datasets.EMNIST(str(tmp_path / "data"), split=split, train=True)
    assert torch.equal(pool.x[:60, 0], tv.data.transpose(1, 2).float() / 255)
    assert torch.equal(pool.y[:60], tv.targets - (1 if split == "letters" else 0))


def test_emnist_letters_trains_through_the_federation(tmp_path):
    write_emnist(tmp_path / "data", "emnist_letters")
    fed = vision_federation("emnist_letters", tmp_path)
    node = federation_data(fed)["node0"]
    assert node.train.num_classes == 26 and node.train.input_shape == (1, 28, 28)
    model = build_model(fed.model, node.train.input_shape, node.train.num_classes, seed=1)
    assert math.isfinite(train(model, node.train, fed.training, epochs=1, seed=0).loss)
    assert len(evaluate(model, node.test).per_class_total) == 26


def test_emnist_splits_share_one_folder(tmp_path):
    letters, _ = write_emnist(tmp_path, "emnist_letters")
    write_emnist(tmp_path, "emnist_balanced", n_train=50)
    assert len(data_mod.load_vision("emnist_letters", tmp_path)) == 70
    assert len(data_mod.load_vision("emnist_balanced", tmp_path)) == 60


def test_gzipped_emnist_files_are_read(tmp_path):
    images, labels = write_emnist(tmp_path, "emnist_balanced", gz=True)
    assert not (tmp_path / "EMNIST/raw/emnist-balanced-train-images-idx3-ubyte").exists()
    pool = data_mod.load_vision("emnist_balanced", tmp_path)
    assert torch.equal(pool.x, torch.from_numpy(images).float() / 255)
    assert torch.equal(pool.y, torch.from_numpy(labels).long())


def test_missing_emnist_file_is_named_in_one_line(tmp_path):
    write_emnist(tmp_path, "emnist_letters")
    (tmp_path / "EMNIST/raw/emnist-letters-test-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError) as info:
        load_dataset(vision_federation("emnist_letters", tmp_path, root=str(tmp_path)).data)
    assert_one_line(str(info.value), "emnist_letters: expected EMNIST/raw/{emnist-letters-train-images-idx3",
                    "(or .gz)", f"under {tmp_path}; missing emnist-letters-test-labels-idx1-ubyte;",
                    "folder that holds EMNIST/")
    assert "no such folder" not in str(info.value)
    # the files of another split do not stand in for balanced's
    with pytest.raises(DataError) as info:
        data_mod.load_vision("emnist_balanced", tmp_path)
    assert_one_line(str(info.value), "emnist_balanced: expected EMNIST/raw/{emnist-balanced-train-images",
                    "emnist-balanced-test-labels-idx1-ubyte}", "none found")


def test_emnist_letters_label_zero_is_refused(tmp_path):
    write_mnist(tmp_path, "EMNIST", files=emnist_files("letters"), num_classes=26)  # 0..25 on disk
    with pytest.raises(DataError) as info:
        data_mod.load_vision("emnist_letters", tmp_path)
    assert_one_line(str(info.value), "emnist_letters: labels must be 0..25, found -1..24")


def test_gzipped_mnist_files_are_read(tmp_path):
    images, labels = write_mnist(tmp_path, "FashionMNIST", gz=True)
    assert not (tmp_path / "FashionMNIST/raw/train-images-idx3-ubyte").exists()
    pool = data_mod.load_vision("fashion_mnist", tmp_path)
    assert torch.equal(pool.x, torch.from_numpy(images).float() / 255)
    assert torch.equal(pool.y, torch.from_numpy(labels).long())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mnist", ["MNIST/raw/", "train-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "(or .gz)"]),
        ("fashion_mnist", ["FashionMNIST/raw/", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"]),
        ("cifar10", ["cifar-10-batches-py/", "data_batch_1", "data_batch_5", "test_batch", "batches.meta"]),
        ("cifar100", ["cifar-100-python/", "train", "test", "meta"]),
        ("emnist_balanced", ["EMNIST/raw/", "emnist-balanced-train-images-idx3-ubyte",
                             "emnist-balanced-test-labels-idx1-ubyte", "(or .gz)", "none found"]),
        ("emnist_letters", ["EMNIST/raw/", "emnist-letters-train-labels-idx1-ubyte",
                            "emnist-letters-test-images-idx3-ubyte", "(or .gz)"]),
    ],
)
def test_missing_files_give_one_line_naming_files_and_root(name, expected, tmp_path):
    fed = vision_federation(name, tmp_path, root="nowhere")
    with pytest.raises(DataError) as info:
        federation_data(fed)
    assert_one_line(str(info.value), f"{name}: expected", *expected, str(tmp_path / "nowhere"),
                    "(no such folder)", "download = true")


def test_partly_missing_files_are_named(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py/data_batch_3").unlink()
    with pytest.raises(DataError) as info:
        data_mod.load_vision("cifar10", tmp_path)
    assert_one_line(str(info.value), "missing data_batch_3;", str(tmp_path))
    assert "no such folder" not in str(info.value)


def test_cifar_tarball_without_extraction_is_pointed_out(tmp_path):
    (tmp_path / "cifar-100-python.tar.gz").write_bytes(b"not extracted")
    with pytest.raises(DataError) as info:
        data_mod.load_vision("cifar100", tmp_path)
    assert_one_line(str(info.value), "cifar-100-python.tar.gz is there", "extract it")


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_torchvision_checksums_refuse_files_that_are_not_the_originals(name, tmp_path):
    WRITERS[name](tmp_path)  # torchvision's own classes, with the real CIFAR digests
    with pytest.raises(DataError) as info:
        data_mod.load_vision(name, tmp_path)
    first = "data_batch_1" if name == "cifar10" else "train"
    assert_one_line(str(info.value), f"{name}: ", f"/{first} fails torchvision's MD5 check")


def test_unreadable_mnist_file_is_one_line(tmp_path):
    write_mnist(tmp_path, "MNIST")
    (tmp_path / "MNIST/raw/t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    with pytest.raises(DataError) as info:
        data_mod.load_vision("mnist", tmp_path)
    assert_one_line(str(info.value), "mnist: cannot read", str(tmp_path / "MNIST/raw"))


def test_root_must_be_set_for_torchvision_sets(tmp_path):
    fed = parse_federation(tiny_raw(data={"dataset": "cifar10"}), base_dir=tmp_path)
    with pytest.raises(DataError, match=r"cifar10: \[data\] root is not set"):
        load_dataset(fed.data)


def test_failed_download_surfaces_torchvision_error_as_one_line(tmp_path, monkeypatch):
    spec = data_mod.VISION_SETS["mnist"]

    class Offline(spec.dataset_class()):  # what torchvision raises when no mirror answers
        def download(self):
            raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried https://a/, got:\n"
                               "<urlopen error [Errno -3] Temporary failure in name resolution>\n")

    monkeypatch.setitem(data_mod.VISION_SETS, "mnist", dataclasses.replace(spec, cls=Offline))
    fed = parse_federation(tiny_raw(data={"dataset": "mnist", "root": "d", "download": True}),
                           base_dir=tmp_path)
    with pytest.raises(DataError) as info:
        load_dataset(fed.data)
    assert_one_line(str(info.value), f"mnist: download into {tmp_path / 'd'} failed: RuntimeError: "
                    "Error downloading train-images-idx3-ubyte.gz: Tried https://a/, got:",
                    "Temporary failure in name resolution")


def test_fl_sim_prints_the_data_error_and_exits_2(tmp_path, capsys):
    path = tmp_path / "fed.toml"
    path.write_text('[federation]\nname = "v"\nrounds = 1\n[topology]\nnodes = 2\n'
                    '[data]\ndataset = "mnist"\nroot = "mnist-data"\n[model]\nname = "cnn2"\n')
    assert main([str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl-sim: error: mnist: expected MNIST/raw/") and err.count("\n") == 1
    assert str(tmp_path / "mnist-data") in err and "Traceback" not in err


def test_fl_sim_runs_a_round_on_tiny_mnist(tmp_path, capsys):
    write_mnist(tmp_path / "mnist-data", "MNIST", n_train=60, n_test=20)
    path = tmp_path / "fed.toml"
    path.write_text('[federation]\nname = "v"\nrounds = 1\nround_timeout_s = 30\n[topology]\nnodes = 2\n'
                    '[training]\nbatch_size = 16\n'
                    '[data]\ndataset = "mnist"\nroot = "mnist-data"\npartition = "iid"\n'
                    '[model]\nname = "cnn2"\n')
    assert main([str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert summary["rounds"] == 1 and summary["config"]["dataset"] == "mnist" and len(rows) == 1
    assert 0 <= rows[0]["fa"] <= 1 and len(rows[0]["per_class_accuracy"]) == 10
    # 80 images split IID over 2 nodes, 20% of each share held out for testing
    sizes = [n["train_size"] for n in rows[0]["nodes"].values()]
    tests = [sum(n["per_class_total"]) for n in rows[0]["nodes"].values()]
    assert sizes == [32, 32] and tests == [8, 8]


# ------------------------------------------------------------------ models
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
@pytest.mark.parametrize("cfg", [ModelConfig(name="mlp", hidden=(8,)), ModelConfig(name="cnn"),
                                 ModelConfig(name="cnn2"), ModelConfig(name="resnet18"),
                                 ModelConfig(name="resnet18", norm="group", groups=4)],
                         ids=lambda c: f"{c.name}-{c.norm}")
def test_forward_shapes(cfg, shape):
    model = build_model(cfg, shape, 7, seed=0)
    model.train()
    assert model(torch.rand(2, *shape)).shape == (2, 7)


def test_registries_list_the_models():
    from flmesh import registry

    assert set(registry.models.builtin_names()) == {"mlp", "cnn", "cnn2", "resnet18"}


def test_cnn2_is_the_fedavg_cnn():
    mnist = build_model(ModelConfig(name="cnn2"), (1, 28, 28), 10)
    assert sum(p.numel() for p in mnist.parameters()) == 1_663_370  # McMahan et al. 2017
    convs = [m for m in mnist.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(32, (5, 5)), (64, (5, 5))]
    assert sum(isinstance(m, nn.MaxPool2d) for m in mnist.modules()) == 2
    cifar = build_model(ModelConfig(name="cnn2"), (3, 32, 32), 10)
    assert cifar.fc[0].in_features == 64 * 8 * 8 and cifar.fc[0].out_features == 512


def test_group_norm_replaces_batch_norm():
    bn = build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10)
    gn = build_model(ModelConfig(name="resnet18", norm="group", groups=4), (3, 32, 32), 10)
    assert any(isinstance(m, nn.BatchNorm2d) for m in bn.modules())
    assert not any(isinstance(m, nn.GroupNorm) for m in bn.modules())
    groups = [m for m in gn.modules() if isinstance(m, nn.GroupNorm)]
    assert len(groups) == 20 and {m.num_groups for m in groups} == {4}
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gn.modules())
    assert not any("running_mean" in k for k in gn.state_dict())
    default = build_model(ModelConfig(name="resnet18", norm="group"), (1, 28, 28), 10)
    assert {m.num_groups for m in default.modules() if isinstance(m, nn.GroupNorm)} == {2}
    with pytest.raises(ModelError, match="needs groups dividing 64 .* got 3"):
        build_model(ModelConfig(name="resnet18", norm="group", groups=3), (3, 32, 32), 10)


def test_resnet_stem_follows_input_size():
    small = build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, nn.Identity)
    big = build_model(ModelConfig(name="resnet18"), (3, 96, 96), 10)
    assert big.conv1.kernel_size == (7, 7) and isinstance(big.maxpool, nn.MaxPool2d)
    forced = build_model(ModelConfig(name="resnet18", small_input=False), (1, 32, 32), 10)
    assert forced.conv1.kernel_size == (7, 7) and forced.conv1.in_channels == 1
    assert forced(torch.rand(2, 1, 32, 32)).shape == (2, 10)


def test_same_seed_same_resnet():
    cfg = ModelConfig(name="resnet18", norm="group")
    a, b = build_model(cfg, (3, 32, 32), 10, seed=5), build_model(cfg, (3, 32, 32), 10, seed=5)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


# ------------------------------------------------------------------ model schema and weights
def model_federation(tmp_path: Path, **model):
    return parse_federation(tiny_raw(model={"name": "resnet18", **model}), source="w.toml",
                            base_dir=tmp_path)


def test_model_keys_are_parsed_and_weights_resolved(tmp_path):
    fed = model_federation(tmp_path, norm="group", groups=8, weights="w/r18.pth", small_input=False)
    assert (fed.model.norm, fed.model.groups, fed.model.small_input) == ("group", 8, False)
    assert fed.model.weights == str((tmp_path / "w/r18.pth").resolve())
    plain = model_federation(tmp_path)
    assert (plain.model.norm, plain.model.groups, plain.model.weights, plain.model.small_input) == \
        ("batch", 2, None, None)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("norm", "layer", "[model] norm: expected one of 'batch', 'group', got 'layer'"),
        ("groups", 0, "[model] groups: expected an integer >= 1, got 0"),
        ("weights", 3, "[model] weights: expected a non-empty string, got 3"),
        ("small_input", "yes", "[model] small_input: expected true or false, got 'yes'"),
        ("name", "vgg", "[model] name: expected one of 'cnn', 'cnn2', 'mlp', 'resnet18', got 'vgg'"),
    ],
)
def test_bad_model_keys_are_one_line(tmp_path, key, value, expected):
    with pytest.raises(FederationError) as info:
        model_federation(tmp_path, **{key: value})
    assert_one_line(str(info.value), "w.toml: " + expected)


def test_weights_file_initialises_the_model(tmp_path):
    source = build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10, seed=1)
    torch.save(source.state_dict(), tmp_path / "r18.pth")
    fed = model_federation(tmp_path, weights="r18.pth")
    loaded = build_model(fed.model, (3, 32, 32), 10, seed=2)
    fresh = build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10, seed=2)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in source.state_dict().items())
    assert not torch.equal(fresh.conv1.weight, loaded.conv1.weight)

    # another number of classes: all but the classifier comes from the file
    hundred = build_model(fed.model, (3, 32, 32), 100, seed=2)
    for key, value in source.state_dict().items():
        if key.startswith("fc."):
            assert hundred.state_dict()[key].shape[0] == 100
        else:
            assert torch.equal(value, hundred.state_dict()[key]), key
    assert torch.equal(hundred.fc.weight,
                       build_model(ModelConfig(name="resnet18"), (3, 32, 32), 100, seed=2).fc.weight)


def test_checkpoint_wrappers_are_unwrapped(tmp_path):
    source = build_model(ModelConfig(name="cnn2"), (1, 28, 28), 10, seed=1)
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}},
               tmp_path / "ckpt.pth")
    loaded = build_model(ModelConfig(name="cnn2", weights=str(tmp_path / "ckpt.pth")), (1, 28, 28), 10)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in source.state_dict().items())


def test_mismatching_weights_name_the_file_and_tensor(tmp_path):
    gn = build_model(ModelConfig(name="resnet18", norm="group"), (3, 32, 32), 10, seed=1)
    torch.save(gn.state_dict(), tmp_path / "gn.pth")
    with pytest.raises(ModelError) as info:
        build_model(ModelConfig(name="resnet18", weights=str(tmp_path / "gn.pth")), (3, 32, 32), 10)
    assert_one_line(str(info.value), f"[model] weights {tmp_path / 'gn.pth'} does not fit model",
                    "'bn1.running_mean' is missing", "[model] norm")

    imagenet_stem = build_model(ModelConfig(name="resnet18", small_input=False), (3, 32, 32), 10)
    torch.save(imagenet_stem.state_dict(), tmp_path / "big.pth")
    with pytest.raises(ModelError) as info:
        build_model(ModelConfig(name="resnet18", weights=str(tmp_path / "big.pth")), (3, 32, 32), 10)
    assert_one_line(str(info.value), "tensor 'conv1.weight' has shape [64, 3, 7, 7] in the file, "
                    "the model needs [64, 3, 3, 3]", "small_input")

    torch.save({"extra": torch.zeros(1), **gn.state_dict()}, tmp_path / "extra.pth")
    with pytest.raises(ModelError, match="the file has tensor 'extra', which the model lacks"):
        build_model(ModelConfig(name="resnet18", norm="group", weights=str(tmp_path / "extra.pth")),
                    (3, 32, 32), 10)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "file not found"),
        (b"this is not a torch file", "not a state dict saved with torch.save"),
        ([1, 2, 3], "expected a state dict (tensor name -> tensor), got list"),
    ],
)
def test_unusable_weights_files_are_one_line(tmp_path, content, expected):
    path = tmp_path / "w.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(ModelError) as info:
        build_model(ModelConfig(name="cnn2", weights=str(path)), (1, 28, 28), 10)
    assert_one_line(str(info.value), f"[model] weights {path}", expected)


def test_mnist_and_fashion_mnist_join_into_20_classes_for_novel_targets(tmp_path):
    write_mnist(tmp_path / "root", "MNIST", n_train=40, n_test=20)
    write_mnist(tmp_path / "root", "FashionMNIST", n_train=40, n_test=20)
    raw = {"federation": {"name": "j", "rounds": 10, "seed": 1},
           "topology": {"nodes": 20},
           "data": {"dataset": "mnist+fashion_mnist", "root": str(tmp_path / "root"), "partition": "iid"},
           "tasks": {"scenario": "novel_targets", "tasks": 10, "rounds_per_task": 1, "classes_per_task": 2}}
    fed = parse_federation(raw, source="j.toml")
    joined = load_dataset(fed.data)
    assert joined.num_classes == 20 and len(joined) == 120
    assert sorted(set(joined.y.tolist())) == list(range(20)), "Fashion-MNIST's labels follow MNIST's"
    from flmesh.learning.tasks import TaskSource

    last = TaskSource(fed, "node0", lambda: joined).share(9)
    assert set(last.train.y.tolist()) | set(last.test.y.tolist()) <= {18, 19}, "task 9: two Fashion classes"


def test_without_torchvision_the_core_runs_and_vision_names_the_extra(monkeypatch):
    """A CPU build of torch cannot load PyPI's torchvision: the core never imports it, and
    asking for a vision set or ResNet-18 without it is one line naming flmesh[vision]."""
    import sys

    from flmesh.config import ModelConfig
    from flmesh.learning.extras import MissingExtra, require
    from flmesh.learning.models import build_model

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision now fails
    with pytest.raises(MissingExtra, match=r"model 'resnet18' needs torchvision.*flmesh\[vision\]"):
        build_model(ModelConfig(name="resnet18"), (3, 32, 32), 10, seed=1)
    with pytest.raises(MissingExtra, match="flmesh.vision."):
        require("torchvision.datasets", "vision", "data set MNIST")
    assert build_model(ModelConfig(hidden=(8,)), (1, 8, 8), 10, seed=1) is not None


# ------------------------------------------------------------------ a node's own image folder

COLOURS = {"blue": 2, "green": 1, "red": 0}  # class name -> the channel its images are bright in


def write_images(folder: Path, per_class: int, seed: int, size: tuple[int, int] = (8, 8),
                 classes: tuple[str, ...] = ("red", "green", "blue")) -> None:
    """Tiny PNGs, ``folder/<class>/<i>.png``: noise with one channel bright per class; every
    third image ``size`` + 2 pixels a side (resized when read)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in classes:
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = (size[0] + 2, size[1] + 2) if i % 3 == 2 else size
            pixels = rng.integers(0, 90, size=(h, w, 3), dtype=np.uint8)
            pixels[..., COLOURS[name]] += 160
            Image.fromarray(pixels).save(folder / name / f"{i}.png")


def image_federation(tmp_path: Path, folders: dict[str, str], **data):
    raw = tiny_raw(rounds=2, data={"classes": 3, **data}, training={"batch_size": 8, "lr": 0.1})
    del raw["topology"]["nodes"]
    raw["nodes"] = {node: {"data": folder} for node, folder in folders.items()}
    return parse_federation(raw, source="own.toml", base_dir=tmp_path)


def test_an_image_folder_streams_with_sorted_classes_one_size_and_a_seeded_split(tmp_path):
    from flmesh.learning.streamed import DatasetData
    from flmesh.learning.user_data import own_data

    write_images(tmp_path / "a", per_class=5, seed=0)
    fed = image_federation(tmp_path, {"a": "a", "b": "a"}, image_size=[6, 7])
    share = own_data(fed, "a", path=tmp_path / "a", what="--data a")
    assert isinstance(share.train, DatasetData) and share.train.num_classes == 3
    assert len(share.train) + len(share.test) == 15 and len(share.test) == 3
    assert share.train.input_shape == (3, 6, 7), "RGB, resized to [data] image_size"
    x = share.train.x[:]
    assert x.shape == (12, 3, 6, 7) and 0 <= float(x.min()) and float(x.max()) <= 1
    # ImageFolder's order: blue, green, red are labels 0, 1, 2; each is bright in its channel
    bright = x.mean(dim=(2, 3)).argmax(dim=1)
    assert torch.equal(bright, torch.tensor([COLOURS[n] for n in ("blue", "green", "red")])[share.train.y])
    again = own_data(fed, "a", path=tmp_path / "a", what="--data a")
    assert torch.equal(again.test.y, share.test.y) and torch.equal(again.test.x[:], share.test.x[:])
    unsized = own_data(image_federation(tmp_path, {"a": "a", "b": "a"}), "a", path=tmp_path / "a", what="a")
    assert unsized.train.input_shape == (3, 8, 8), "without image_size: the first image's size"


def test_a_folder_of_grey_scale_images_is_one_channel_and_one_colour_image_makes_it_rgb(tmp_path):
    from PIL import Image

    from flmesh.learning.user_data import own_data

    rng = np.random.default_rng(0)
    for name, level in (("dark", 40), ("light", 200)):
        (tmp_path / "a" / name).mkdir(parents=True)
        for i in range(4):
            pixels = np.clip(rng.normal(level, 20, size=(8, 8)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(tmp_path / "a" / name / f"{i}.png")
    fed = image_federation(tmp_path, {"a": "a", "b": "a"}, classes=2)
    share = own_data(fed, "a", path=tmp_path / "a", what="a")
    assert share.train.input_shape == (1, 8, 8), "grey-scale stays one channel"
    x = share.train.x[:]
    assert x.shape[1] == 1 and float(x[share.train.y == 1].mean()) > float(x[share.train.y == 0].mean())
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a" / "dark" / "rgb.png")
    assert own_data(fed, "a", path=tmp_path / "a", what="a").train.input_shape == (3, 8, 8)


def test_train_and_test_subfolders_are_the_split_matched_by_class_name(tmp_path):
    from flmesh.learning.user_data import own_data

    write_images(tmp_path / "a" / "train", per_class=4, seed=0)
    write_images(tmp_path / "a" / "test", per_class=2, seed=1, classes=("red", "blue"))
    share = own_data(image_federation(tmp_path, {"a": "a", "b": "a"}), "a", path=tmp_path / "a", what="a")
    assert len(share.train) == 12 and share.train.label_counts() == [4, 4, 4]
    assert share.test.label_counts() == [2, 0, 2], "test/ has no green: blue and red keep train's labels"


def test_fl_sim_trains_nodes_on_their_image_folders(tmp_path):
    for i, node in enumerate("abc"):
        write_images(tmp_path / node, per_class=6, seed=i)
    fed = image_federation(tmp_path, {n: n for n in "abc"})
    from flmesh.sim.simulation import Simulation

    with Simulation(fed, tmp_path / "run") as sim:
        summary = sim.run()
    assert summary.final is not None and summary.final.fa is not None and summary.final.fa > 0.5


@pytest.mark.slow
def test_fl_node_processes_train_on_their_image_folders(tmp_path):
    import os
    import subprocess

    from procs import FL_NODE, federation_file, read_results, wait_until

    ids = ["a", "b", "c"]
    for i, node in enumerate(ids):
        write_images(tmp_path / f"images_{node}", per_class=6, seed=i)
    fed = federation_file(tmp_path, ids, rounds=2, graph="complete")
    work = tmp_path / "addr"
    work.mkdir()
    procs = {i: subprocess.Popen([FL_NODE, "--id", i, "--federation", str(fed), "--listen", "127.0.0.1:0",
                                  "--ready-file", str(work / f"{i}.addr"), "--peers-file",
                                  str(work / "peers.json"), "--data", f"images_{i}",
                                  "--set", "data.classes=3", "--insecure"],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in ids}
    try:
        wait_until(lambda: all((work / f"{i}.addr").exists() or procs[i].poll() is not None for i in ids),
                   timeout=120)
        addresses = {i: (work / f"{i}.addr").read_text().strip() for i in ids}
        (work / ".peers.json").write_text(json.dumps(addresses))
        os.replace(work / ".peers.json", work / "peers.json")
        outputs = {i: p.communicate(timeout=300) for i, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    for node in ids:
        assert procs[node].returncode == 0, outputs[node][1][-3000:]
        rows, summary = read_results(tmp_path / "runs" / f"procs-{node}")
        assert [r["round"] for r in rows] == [1, 2] and not summary["interrupted"]
        data = summary["config"]["data"]
        assert data["own"] and data["origin"] == f"images_{node}" and data["classes"] == 3
        assert data["train_samples"] + data["test_samples"] == 18


def test_an_image_folder_without_torchvision_names_the_extra(tmp_path, monkeypatch):
    import sys

    from flmesh.learning.extras import MissingExtra
    from flmesh.learning.user_data import own_data

    write_images(tmp_path / "a", per_class=2, seed=0)
    fed = image_federation(tmp_path, {"a": "a", "b": "a"})
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    needs = r"^--data a \(a folder of images\) needs torchvision.*flmesh\[vision\]"
    with pytest.raises(MissingExtra, match=needs):
        own_data(fed, "a", path=tmp_path / "a", what="--data a")


def test_an_image_damaged_past_its_header_is_named_when_a_batch_reads_it(tmp_path):
    from flmesh.learning.arrays import DataError
    from flmesh.learning.image_folder import read_image_folder
    from flmesh.learning.trainer import train

    write_images(tmp_path / "a", per_class=2, seed=0)
    damaged = tmp_path / "a" / "red" / "1.png"
    damaged.write_bytes(damaged.read_bytes()[:60])  # the header stays: the check before training passes
    fed = image_federation(tmp_path, {"a": "a", "b": "a"})
    data, test = read_image_folder(tmp_path / "a", "--data a", fed.data)
    assert test is None and len(data) == 6
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3))
    named = rf"^--data a: item \d raised DataError: {re.escape(str(damaged))}: cannot be read as an image"
    with pytest.raises(DataError, match=named):
        train(model, data, fed.training, epochs=1)
