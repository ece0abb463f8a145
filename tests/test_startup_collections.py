"""A command's start-up runs with the garbage collector paused (``cli_common.collections_paused``),
and the collector is on again afterwards, whatever way the start-up ends."""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flmesh.node import cli_common
from flmesh.node.cli_common import collections_paused

from procs import federation_file


@pytest.fixture(autouse=True)
def collector_as_it_was() -> Iterator[None]:
    """Each test leaves the collector on and nothing frozen, as it found them."""
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    yield
    gc.enable()
    if gc.get_freeze_count() > frozen:
        gc.unfreeze()


def test_the_collector_is_off_inside_and_on_again_after_even_when_the_block_raises():
    with collections_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="start-up failed"), collections_paused():
        assert not gc.isenabled()
        raise RuntimeError("start-up failed")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    with collections_paused():
        pass
    assert not gc.isenabled()


def test_what_a_first_start_up_imported_is_frozen_and_a_later_one_freezes_nothing(tmp_path, monkeypatch):
    (tmp_path / "fresh_startup_module.py").write_text("TABLE = {i: [i] for i in range(1000)}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fresh_startup_module", raising=False)
    before = gc.get_freeze_count()
    with collections_paused():
        module = importlib.import_module("fresh_startup_module")
    assert gc.get_freeze_count() > before + len(module.TABLE)  # the table's lists among them
    after = gc.get_freeze_count()
    with collections_paused():
        importlib.import_module("fresh_startup_module")  # imported already: a later main's start-up
    assert gc.get_freeze_count() == after


def test_fl_node_prepares_with_the_collector_paused_and_leaves_it_on(tmp_path, capsys, monkeypatch):
    from flmesh.node import cli

    seen: list[bool] = []

    def prepare(args: object) -> None:
        seen.append(gc.isenabled())
        raise cli.UsageError("stopped by the test")

    monkeypatch.setattr(cli, "prepare", prepare)
    fed = federation_file(tmp_path, ["a", "b"], rounds=1)
    assert cli.main(["--id", "a", "--federation", str(fed), "--listen", "127.0.0.1:0",
                     "--peer", "b=127.0.0.1:1"]) == 2
    assert "stopped by the test" in capsys.readouterr().err
    assert seen == [False]
    assert gc.isenabled()


@pytest.mark.parametrize("module, argv", [
    ("flmesh.coordinator.sim_cli", ["MISSING.toml"]),
    ("flmesh.coordinator.aggregator_cli", ["--federation", "MISSING.toml", "--listen", "127.0.0.1:0"]),
])
def test_fl_sim_and_the_aggregator_import_with_the_collector_paused_and_leave_it_on(
        tmp_path, capsys, monkeypatch, module, argv):
    command = importlib.import_module(module)
    entered: list[bool] = []

    @contextmanager
    def recorded() -> Iterator[None]:
        with cli_common.collections_paused():
            entered.append(gc.isenabled())
            yield

    monkeypatch.setattr(command, "collections_paused", recorded)
    argv = [str(tmp_path / a) if a == "MISSING.toml" else a for a in argv]
    assert command.main(argv) == 2
    assert "MISSING.toml" in capsys.readouterr().err
    assert entered == [False]
    assert gc.isenabled()
