"""Algorithms from outside the package: by import path, by entry point, registered at run time;
each plug-in's parameters checked from its own table."""

from __future__ import annotations

import sys

import pytest
import torch

from flmesh import algorithms
from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf
from flmesh.config import FederationError
from flmesh.config.params import Param
from flmesh.config.parser import parse_federation
from flmesh.registry import AlgorithmError, register_algorithm
from flmesh.registry import algorithms as registered
from flmesh.testing import run

from conftest import REPO, tiny_raw

PLUGIN = '''
from flmesh.algorithms.base import Algorithm
from flmesh.config.params import Param


class PathAvg(Algorithm):
    name = "pathavg"
    kind = "strategy"
    params = (Param("scale", float, 0.5, "a share", lo=0, hi=1),)


class EntryAvg(Algorithm):
    name = "entryavg"
    kind = "strategy"


class NotOne:
    name = "x"


class Fussy(Algorithm):
    name = "fussy"
    kind = "strategy"

    def __init__(self):
        raise RuntimeError("needs a GPU")
'''


@pytest.fixture
def extpkg(tmp_path, monkeypatch):
    pkg = tmp_path / "extpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "algos.py").write_text(PLUGIN)
    dist = tmp_path / "extpkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extpkg\nVersion: 1.0\n")
    (pkg / "broken.py").write_text("raise ImportError('half installed')\n")
    marker = str(tmp_path / "imported")
    (pkg / "exits.py").write_text(f"import pathlib, sys\npathlib.Path({marker!r}).touch()\nsys.exit(0)\n")
    (dist / "entry_points.txt").write_text("[flmesh.algorithms]\nentryavg = extpkg.algos:EntryAvg\n"
                                           "brokenavg = extpkg.broken:BrokenAvg\n"
                                           "exitavg = extpkg.exits:ExitAvg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    registered.unregister("entryavg")  # the package goes with tmp_path
    for name in [m for m in sys.modules if m == "extpkg" or m.startswith("extpkg.")]:
        del sys.modules[name]


def test_a_strategy_by_import_path_reads_its_own_table(extpkg):
    raw = tiny_raw(aggregator={"strategy": "extpkg.algos:PathAvg", "params": {"scale": 0.25}})
    fed = parse_federation(raw)
    plugin = algorithms.strategy(fed)
    assert plugin.name == "pathavg" and plugin.is_strategy(fed)
    assert plugin.settings(fed) == {"scale": 0.25}
    default = parse_federation(tiny_raw(aggregator={"strategy": "extpkg.algos:PathAvg"}))
    assert plugin.settings(default) == {"scale": 0.5}
    with pytest.raises(FederationError, match=r"^<federation>: \[aggregator.params\] scale: expected a "
                       r"number <= 1, got 2$"):
        parse_federation(tiny_raw(aggregator={"strategy": "extpkg.algos:PathAvg", "params": {"scale": 2}}))


def test_an_installed_entry_point_is_a_name(extpkg):
    assert {"entryavg", "brokenavg"} <= set(registered.names())
    fed = parse_federation(tiny_raw(aggregator={"strategy": "entryavg"}))
    assert algorithms.strategy(fed).name == "entryavg"
    # a broken package stops only the federations that name it
    plain = parse_federation(tiny_raw(aggregator={"strategy": "fedavg"}))
    assert [p.name for p in algorithms.for_node(plain, plain.training)] == ["ce", "fedavg"]


def test_bad_plug_ins_are_one_line(extpkg):
    for strategy, expected in [
        ("extpkg.algos:NotOne", "is not an algorithm plug-in"),
        ("extpkg.algos:Param", "is not an algorithm plug-in"),  # a class, but not a plug-in: not built
        ("extpkg.algos:Missing", "extpkg.algos has no attribute 'Missing'"),
        ("extpkg.algos:Fussy", "building the plug-in failed: RuntimeError: needs a GPU"),
        ("brokenavg", "importing extpkg.broken failed: ImportError: half installed"),
        ("nowhere.at_all:X", "no module named 'nowhere'"),
        ("fedsgd", "expected one of 'fedadam', 'fedavg', .*, an installed plug-in \\('brokenavg', "
                   "'entryavg', 'exitavg'\\), or an import path"),
        ("wsm", "expected a strategy, not the objective plug-in 'wsm'"),
    ]:
        with pytest.raises(FederationError, match=expected) as caught:
            parse_federation(tiny_raw(aggregator={"strategy": strategy}))
        assert "\n" not in str(caught.value)
    with pytest.raises(FederationError, match=r"\[training\] objective: expected one of 'ce', 'wsm', an "
                       r"installed plug-in \('brokenavg', 'entryavg', 'exitavg'\), or"):
        parse_federation(tiny_raw(training={"objective": "fedsgd"}))
    with pytest.raises(FederationError, match=r"objective: expected an objective, not the strategy plug-in"):
        parse_federation(tiny_raw(training={"objective": "fedavg"}))


def test_a_plug_in_that_exits_on_import_is_one_line_and_listing_names_imports_none(extpkg, tmp_path):
    """sys.exit(0) in an installed plug-in's module: a misspelt name lists it without importing it
    (a listing runs no package's code); naming it is one line, not an exit."""
    listed = r"an installed plug-in \('brokenavg', 'entryavg', 'exitavg'\)"
    for raw in (tiny_raw(aggregator={"strategy": "fedavgg"}), tiny_raw(training={"objective": "cee"})):
        with pytest.raises(FederationError, match=listed):
            parse_federation(raw)
    assert not (tmp_path / "imported").exists()
    with pytest.raises(FederationError, match=r"^<federation>: \[aggregator\] strategy: expected a usable "
                       r"strategy: algorithm 'exitavg' \(entry point of flmesh.algorithms\): 'extpkg.exits:"
                       r"ExitAvg': importing extpkg.exits failed: SystemExit: 0, got 'exitavg'$"):
        parse_federation(tiny_raw(aggregator={"strategy": "exitavg"}))
    assert (tmp_path / "imported").exists()


class RunTime(Algorithm):
    name = "runtime_mean"
    kind = "strategy"
    params = (Param("weight", int, 3, "a count", lo=1, hi=9),)

    def server(self, ctx: ServerContext) -> ServerHalf:
        return ServerHalf()


class Impostor(Algorithm):
    name = "fedavg"
    kind = "strategy"


def test_register_at_run_time():
    assert register_algorithm(RunTime) is RunTime
    try:
        fed = parse_federation(tiny_raw(aggregator={"strategy": "runtime_mean", "params": {"weight": 4}}))
        assert algorithms.strategy(fed).settings(fed) == {"weight": 4}
    finally:
        registered.unregister("runtime_mean")
    with pytest.raises(FederationError, match="expected one of 'fedadam', 'fedavg'"):
        parse_federation(tiny_raw(aggregator={"strategy": "runtime_mean"}))
    algorithms.load("fedavg")  # the built-in holds its name
    with pytest.raises(AlgorithmError, match="'fedavg' is already registered by flmesh"):
        register_algorithm(Impostor)


def test_algorithm_tables_and_deprecated_keys():
    raw = tiny_raw(aggregator={"strategy": "fedcurv", "fedcurv_lambda": 3.0})
    assert parse_federation(raw).aggregator.params == {"lambda": 3.0, "average": "plain", "max_age": 0}
    with pytest.raises(FederationError, match=r"\[aggregator\] fedcurv_lambda: deprecated, and "
                       r"\[aggregator.params\] lambda is given too"):
        parse_federation(tiny_raw(aggregator={"strategy": "fedcurv", "fedcurv_lambda": 3.0,
                                              "params": {"lambda": 2.0}}))
    with pytest.raises(FederationError, match=r"\[algorithm.nope\]: unknown algorithm 'nope'"):
        parse_federation({**tiny_raw(), "algorithm": {"nope": {}}})
    with pytest.raises(FederationError, match=r"\[aggregator.params\] x: unknown key \('fedavg' takes no"):
        parse_federation(tiny_raw(aggregator={"params": {"x": 1}}))



def test_the_algorithms_page_lists_every_built_in_and_its_parameters():
    rows = [line.split("|")[1:-1] for line in (REPO / "docs" / "algorithms.md").read_text().splitlines()
            if line.startswith("| ")]
    listed: dict[str, dict[str, str]] = {}
    name = ""
    for cells in rows:
        cells = [c.strip() for c in cells]
        if len(cells) < 8:  # another table of the page (the schedules')
            continue
        if cells[0].startswith("`"):
            name = cells[0].strip("`")
            listed[name] = {}
        if cells[3].startswith("`"):
            listed[name][cells[3].strip("`")] = cells[6]
    for builtin in [n for n in registered.names() if n != "entryavg"]:
        assert builtin in listed, f"docs/algorithms.md has no row for {builtin}"
        plugin = algorithms.load(builtin)
        shown = listed["fedadam"] if builtin == "fedyogi" else listed[builtin]  # "(as `fedadam`)"
        assert set(shown) == {p.name for p in plugin.params}, builtin
        for p in plugin.params:
            assert shown[p.name].strip('`"') == str(p.default), (builtin, p.name)


def test_a_plug_ins_settings_are_typed_and_its_halves_get_them():
    fed = parse_federation(tiny_raw(aggregator={"strategy": "fedavgm", "params": {"server_lr": 2}}))
    settings = algorithms.strategy(fed).settings(fed)
    assert settings.server_lr == 2.0 and isinstance(settings.server_lr, float), "declared float: a float"
    assert settings["momentum"] == settings.momentum == 0.9 and dict(settings) == settings
    with pytest.raises(AttributeError, match="fedavgm declares no parameter 'mu'"):
        settings.mu  # noqa: B018 - the error is the point
    with pytest.raises(AttributeError, match="read-only"):
        settings.momentum = 0.0


def test_the_strategys_table_may_be_its_algorithm_table_but_not_both():
    as_params = parse_federation(tiny_raw(aggregator={"strategy": "fedprox", "params": {"mu": 0.3}}))
    as_table = parse_federation({**tiny_raw(aggregator={"strategy": "fedprox"}),
                                 "algorithm": {"fedprox": {"mu": 0.3}}})
    assert as_params.aggregator.params == as_table.aggregator.params == {"mu": 0.3}
    assert algorithms.load("fedprox").settings(as_table).mu == 0.3
    with pytest.raises(FederationError, match=r"\[aggregator.params\]: the strategy's table is given as "
                                              r"\[algorithm.fedprox\] too: keep one of them"):
        parse_federation({**tiny_raw(aggregator={"strategy": "fedprox", "params": {"mu": 0.1}}),
                          "algorithm": {"fedprox": {"mu": 0.3}}})


def test_fedcurvs_lambda_lives_in_its_table_and_the_old_key_is_read_for_one_version():
    new = parse_federation({**tiny_raw(), "algorithm": {"fedcurv": {"lambda": 2.0}}})
    old = parse_federation(tiny_raw(training={"fedcurv_lambda": 2.0}))
    assert new.algorithms["fedcurv"] == old.algorithms["fedcurv"] == {"lambda": 2.0, "average": "plain",
                                                                      "max_age": 0}
    assert [p.name for p in algorithms.for_node(old, old.training)] == ["ce", "fedcurv"]
    off = parse_federation(tiny_raw(training={"fedcurv_lambda": 0.0}))
    assert "fedcurv" not in off.algorithms, "0 was off"
    for raw, expected in [
        ({**tiny_raw(training={"fedcurv_lambda": 1.0}), "algorithm": {"fedcurv": {"lambda": 2.0}}},
         r"\[training\] fedcurv_lambda: deprecated, and \[algorithm.fedcurv\] lambda is given too"),
        ({**tiny_raw(), "nodes": {"node0": {"fedcurv_lambda": 1.0}}},
         r"\[nodes.node0\] fedcurv_lambda: moved to \[algorithm.fedcurv\] lambda, one value"),
        (tiny_raw(training={"fedcurv_lambda": 1.0}, aggregator={"strategy": "fedcurv"}),
         r"\[training\] fedcurv_lambda: moved to \[algorithm.fedcurv\] lambda; with an aggregator"),
    ]:
        with pytest.raises(FederationError, match=expected):
            parse_federation(raw)


def test_the_strategy_docs_algorithms_shows_runs_as_written(tmp_path, monkeypatch):
    text = (REPO / "docs" / "algorithms.md").read_text()
    block = text.split("```python\n# mystrategies.py\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mystrategies.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    fed = parse_federation(tiny_raw(nodes=3, rounds=2, aggregator={"strategy": "mystrategies:Median",
                                                                   "fraction": 1.0}))
    states = run(fed)
    assert all(torch.isfinite(t).all() for s in states.values() for t in s.values() if t.is_floating_point())
    sys.modules.pop("mystrategies", None)
