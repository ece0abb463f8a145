"""The federation file: one TOML file that describes a whole federation.

The same file drives ``fl-sim`` on one host and every ``fl-node`` of a real
deployment. Parsing is strict: an unknown key, a wrong type or an out-of-range
value raises :class:`FederationError` with a one-line message naming the file,
the section and key, and what was expected.

Sections (all but ``[federation]`` optional)::

    [federation]  name, seed, rounds, round_timeout_s, max_model_mib, baseline
    [topology]    nodes, graph, params, file, schedule
    [training]    epochs, batch_size, lr, optimizer, momentum, weight_decay, objective, device,
                  fedcurv_lambda
    [data]        dataset, root, download, partition, alpha, shards_per_node,
                  test_fraction, min_samples
    [model]       name, hidden, channels, norm, groups, weights, small_input
    [rewind]      mode ("off", "previous", "random"), lambda
    [aggregator]  strategy, address, fraction, min_updates, deadline_s, public_fraction,
                  server_epochs, gamma, fedcurv_lambda (present: a star federation)
    [nodes.<id>]  address, partition, and any [training] key as a per-node override

Units: ``round_timeout_s`` seconds, ``max_model_mib`` MiB, ``epochs`` may be
fractional (a share of one pass over the node's batches).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import networkx as nx

from flmesh.topology.graphs import GraphError, build_graph
from flmesh.topology.schedules import (
    REWIND_MODES,
    SCHEDULES,
    Schedule,
    ScheduleError,
    make_schedule,
)

# Values the node side implements; tests check these match its registries.
DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100")
PARTITIONS = ("dirichlet", "iid", "shards")
MODELS = ("mlp", "cnn", "cnn2", "resnet18")
OPTIMIZERS = ("sgd", "adam")
OBJECTIVES = ("ce", "wsm")

BASELINES = ("none", "standalone", "joint")
STRATEGIES = ("fedavg", "flashback", "fedcurv")

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class FederationError(ValueError):
    """A federation file (or an override of it) is invalid. ``str()`` is one line."""


@dataclass(frozen=True)
class TrainingConfig:
    """Local training settings. ``epochs`` may be fractional; ``lr`` is per step."""

    epochs: float = 1.0
    batch_size: int = 32
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    objective: str = "ce"
    device: str = "auto"
    fedcurv_lambda: float = 0.0  # > 0: FedCurv's penalty without an aggregator (neighbours' Fisher)


@dataclass(frozen=True)
class DataConfig:
    """Which data set, and how it is split across nodes and into train/test."""

    dataset: str = "digits"
    root: str | None = None
    download: bool = False
    partition: str = "dirichlet"
    alpha: float = 0.5
    shards_per_node: int = 2
    test_fraction: float = 0.2
    min_samples: int = 10


@dataclass(frozen=True)
class ModelConfig:
    """Architecture name and its sizes (``hidden`` for the MLP, ``channels`` for the CNN).

    For ``resnet18``: ``norm`` "batch" or "group" (GroupNorm with ``groups`` groups) and
    ``small_input`` (3x3 stem without max-pool; None: when H and W <= 64). ``weights`` is a
    local state-dict file any model starts from (absolute once parsed).
    """

    name: str = "mlp"
    hidden: tuple[int, ...] = (64,)
    channels: tuple[int, ...] = (16, 32)
    norm: str = "batch"
    groups: int = 2
    weights: str | None = None
    small_input: bool | None = None


@dataclass(frozen=True)
class RewindConfig:
    """FedRewind (Eq. 2): ``mode`` "off", "previous" (to the source) or "random"
    (RandRewind); ``lam`` is lambda, the share of E spent on the rewind node (0 < lam <= 0.5)."""

    mode: str = "off"
    lam: float = 0.1


@dataclass(frozen=True)
class AggregatorConfig:
    """The optional server role (``[aggregator]``): a star federation around one aggregator.

    ``fraction`` is C, the share of nodes sampled per round (at least one);
    ``deadline_s`` closes a round with the updates that arrived (stragglers are
    dropped); fewer than ``min_updates`` keeps the previous global model.
    ``public_fraction`` of the data set is carved out before partitioning as the
    aggregator's labelled public split (Flashback's server distillation), never
    overlapping client data. ``server_epochs`` is Flashback's E_s and ``gamma``
    the rate at which its global label count pi grows (Algorithm 1; the paper
    gives no value); ``fedcurv_lambda`` is FedCurv's lambda (Eq. 3).
    """

    strategy: str = "fedavg"
    address: str | None = None
    fraction: float = 1.0
    min_updates: int = 1
    deadline_s: float = 120.0
    public_fraction: float = 0.1
    server_epochs: float = 1.0
    gamma: float = 0.1
    fedcurv_lambda: float = 1.0


@dataclass(frozen=True)
class TopologyConfig:
    graph: str = "complete"
    params: Mapping[str, Any] = field(default_factory=dict)
    file: Path | None = None
    schedule: str = "cwt"


@dataclass(frozen=True)
class NodeConfig:
    """One node: its id, optional address (HOST:PORT), partition index and training."""

    id: str
    index: int
    training: TrainingConfig
    address: str | None = None
    partition: int | None = None


@dataclass(frozen=True)
class Federation:
    """A validated federation file. Immutable; build with :func:`load_federation`."""

    name: str
    seed: int
    rounds: int
    round_timeout_s: float
    max_model_mib: float
    topology: TopologyConfig
    training: TrainingConfig
    data: DataConfig
    model: ModelConfig
    nodes: tuple[NodeConfig, ...]
    rewind: RewindConfig = RewindConfig()
    baseline: str = "none"
    aggregator: AggregatorConfig | None = None
    source: str = "<federation>"

    @property
    def node_ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    def node(self, node_id: str) -> NodeConfig:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise FederationError(f"{self.source}: unknown node {node_id!r} "
                              f"(the federation has {', '.join(self.node_ids)})")

    def _memo(self, key: str, build: Callable[[], Any]) -> Any:
        # Built once per Federation (every node of an fl-sim asks): graphs and schedules are
        # pure functions of the (immutable) file. replace() makes a new object, a new memo.
        if key not in self.__dict__:
            object.__setattr__(self, key, build())
        return self.__dict__[key]

    def graph(self) -> nx.Graph:
        """The communication graph (built once; do not mutate it)."""
        def build() -> nx.Graph:
            try:
                return build_graph(self.topology.graph, self.node_ids, params=self.topology.params,
                                   path=self.topology.file, seed=self.seed)
            except GraphError as exc:
                raise FederationError(f"{self.source}: [topology] {exc}") from None
        return self._memo("_graph", build)

    def schedule(self) -> Schedule:
        """The exchange schedule (built once); the Standalone baseline exchanges nothing."""
        return self._memo("_schedule", self._build_schedule)

    def _build_schedule(self) -> Schedule:
        name = "standalone" if self.baseline == "standalone" else self.topology.schedule
        try:
            return make_schedule(name, self.graph(), self.seed)
        except ScheduleError as exc:
            raise FederationError(f"{self.source}: [topology] schedule "
                                  f"{self.topology.schedule!r}: {exc}") from None


# --------------------------------------------------------------------------- checks
# A check returns the converted value or raises _Bad(expected-description).

class _Bad(Exception):
    pass


Check = Callable[[Any], Any]


def _int(lo: int | None = None) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
            raise _Bad(f"an integer >= {lo}" if lo is not None else "an integer")
        return v
    return check


def _num(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
         hi_open: bool = False) -> Check:
    desc = "a number"
    if lo is not None and hi is not None:
        desc += f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    elif lo is not None:
        desc += f" {'>' if lo_open else '>='} {lo}"

    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise _Bad(desc)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise _Bad(desc)
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise _Bad(desc)
        return float(v)
    return check


def _str(choices: Iterable[str] | None = None) -> Check:
    options = tuple(choices) if choices is not None else None

    def check(v: Any) -> str:
        if not isinstance(v, str) or not v or (options is not None and v not in options):
            raise _Bad(f"one of {', '.join(repr(o) for o in options)}" if options else
                       "a non-empty string")
        return v
    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad("true or false")
    return v


def _table(v: Any) -> dict:
    if not isinstance(v, dict):
        raise _Bad("a table")
    return dict(v)


def _int_list(v: Any) -> tuple[int, ...]:
    if (not isinstance(v, list) or not v
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v)):
        raise _Bad("a non-empty list of positive integers")
    return tuple(v)


def _address(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}", v) \
            or not 0 < int(v.rsplit(":", 1)[1]) < 65536:
        raise _Bad("HOST:PORT with a port from 1 to 65535")
    return v


def _device(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", v):
        raise _Bad("'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return v


_TRAINING: dict[str, Check] = {
    "epochs": _num(0, lo_open=True),
    "batch_size": _int(1),
    "lr": _num(0, lo_open=True),
    "optimizer": _str(OPTIMIZERS),
    "momentum": _num(0, 1, hi_open=True),
    "weight_decay": _num(0),
    "objective": _str(OBJECTIVES),
    "device": _device,
    "fedcurv_lambda": _num(0),
}

_SECTIONS: dict[str, dict[str, Check]] = {
    "federation": {
        "name": _str(), "seed": _int(0), "rounds": _int(1),
        "round_timeout_s": _num(0, lo_open=True), "max_model_mib": _num(0, lo_open=True),
        "baseline": _str(BASELINES),
    },
    "rewind": {"mode": _str(REWIND_MODES), "lambda": _num(0, 0.5, lo_open=True)},
    "aggregator": {
        "strategy": _str(STRATEGIES), "address": _address, "fraction": _num(0, 1, lo_open=True),
        "min_updates": _int(1), "deadline_s": _num(0, lo_open=True),
        "public_fraction": _num(0, 1, hi_open=True), "server_epochs": _num(0),
        "gamma": _num(0, 1, lo_open=True), "fedcurv_lambda": _num(0),
    },
    "topology": {
        "nodes": _int(2), "graph": _str(), "params": _table, "file": _str(),
        "schedule": _str(SCHEDULES),
    },
    "training": _TRAINING,
    "data": {
        "dataset": _str(DATASETS), "root": _str(), "download": _bool,
        "partition": _str(PARTITIONS), "alpha": _num(0, lo_open=True),
        "shards_per_node": _int(1), "test_fraction": _num(0, 1, lo_open=True, hi_open=True),
        "min_samples": _int(1),
    },
    "model": {
        "name": _str(MODELS), "hidden": _int_list, "channels": _int_list,
        "norm": _str(("batch", "group")), "groups": _int(1), "weights": _str(), "small_input": _bool,
    },
}
_NODE_KEYS: dict[str, Check] = {"address": _address, "partition": _int(0), **_TRAINING}
_REQUIRED = {"federation": ("name", "rounds")}


class _Reader:
    """Checks one raw TOML document, collecting nothing: the first error raises."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, msg: str) -> FederationError:
        return FederationError(f"{self.source}: {where}: {msg}")

    def section(self, raw: Mapping[str, Any], name: str, checks: Mapping[str, Check],
                label: str | None = None) -> dict[str, Any]:
        label = label or f"[{name}]"
        table = raw.get(name, {})
        if not isinstance(table, dict):
            raise self.fail(label, f"expected a table, got {table!r}")
        out = {}
        for key, value in table.items():
            check = checks.get(key)
            if check is None:
                raise self.fail(f"{label} {key}", "unknown key (expected one of "
                                f"{', '.join(sorted(checks))})")
            try:
                out[key] = check(value)
            except _Bad as bad:
                raise self.fail(f"{label} {key}", f"expected {bad}, got {value!r}") from None
        for key in _REQUIRED.get(name, ()):
            if key not in out:
                raise self.fail(f"{label} {key}", "required key is missing")
        return out


def parse_federation(raw: Mapping[str, Any], source: str = "<federation>",
                     base_dir: Path | None = None) -> Federation:
    """Validate a parsed TOML document into a :class:`Federation`.

    ``base_dir`` resolves relative paths (graph file, data root); it defaults to
    the current directory. Raises FederationError on the first problem.
    """
    r = _Reader(source)
    known = set(_SECTIONS) | {"nodes"}
    for key in raw:
        if key not in known:
            raise r.fail(f"[{key}]", f"unknown section (expected one of {', '.join(sorted(known))})")
    fed = r.section(raw, "federation", _SECTIONS["federation"])
    topo = r.section(raw, "topology", _SECTIONS["topology"])
    training = TrainingConfig(**r.section(raw, "training", _TRAINING))
    data = r.section(raw, "data", _SECTIONS["data"])
    model = ModelConfig(**r.section(raw, "model", _SECTIONS["model"]))
    rewind_raw = r.section(raw, "rewind", _SECTIONS["rewind"])
    rewind = RewindConfig(mode=rewind_raw.get("mode", "off"), lam=rewind_raw.get("lambda", 0.1))
    aggregator = (AggregatorConfig(**r.section(raw, "aggregator", _SECTIONS["aggregator"]))
                  if "aggregator" in raw else None)
    if aggregator is not None and fed.get("baseline", "none") != "none":
        raise r.fail("[federation] baseline", "baselines compare exchange schedules; "
                     "remove [aggregator] to run one")
    base = base_dir or Path.cwd()

    nodes_raw = raw.get("nodes", {})
    if not isinstance(nodes_raw, dict):
        raise r.fail("[nodes]", f"expected a table of node tables, got {nodes_raw!r}")
    if nodes_raw:
        ids = list(nodes_raw)
        if "nodes" in topo and topo["nodes"] != len(ids):
            raise r.fail("[topology] nodes", f"says {topo['nodes']} but [nodes] lists {len(ids)}")
    elif "nodes" in topo:
        ids = [f"node{i}" for i in range(topo["nodes"])]
    else:
        raise r.fail("[topology] nodes", "required: give the node count, or list [nodes.<id>] tables")
    if len(ids) < 2:
        raise r.fail("[nodes]", f"a federation needs at least 2 nodes, got {len(ids)}")

    nodes = []
    partitions_seen: dict[int, str] = {}
    for index, node_id in enumerate(ids):
        if not NODE_ID.match(node_id):
            raise r.fail(f"[nodes.{node_id}]", "node ids are 1-63 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
        label = f"[nodes.{node_id}]"
        entry = r.section(nodes_raw, node_id, _NODE_KEYS, label) if nodes_raw else {}
        part = entry.pop("partition", None)
        if part is not None:
            if part >= len(ids):
                raise r.fail(f"{label} partition", f"expected an integer < {len(ids)}, got {part}")
            if part in partitions_seen:
                raise r.fail(f"{label} partition", f"partition {part} is already held by "
                             f"{partitions_seen[part]!r}")
            partitions_seen[part] = node_id
        address = entry.pop("address", None)
        nodes.append(NodeConfig(id=node_id, index=index, training=replace(training, **entry),
                                address=address, partition=part))

    if "root" in data:
        data["root"] = str((base / data["root"]).resolve())
    if model.weights is not None:
        model = replace(model, weights=str((base / model.weights).resolve()))
    graph_file = topo.pop("file", None)
    topology = TopologyConfig(
        **{k: v for k, v in topo.items() if k != "nodes"},
        file=(base / graph_file).resolve() if graph_file else None,
    )
    federation = Federation(
        name=fed["name"], seed=fed.get("seed", 0), rounds=fed["rounds"],
        round_timeout_s=fed.get("round_timeout_s", 120.0),
        max_model_mib=fed.get("max_model_mib", 512.0),
        topology=topology, training=training, data=DataConfig(**data), model=model,
        nodes=tuple(nodes), rewind=rewind, baseline=fed.get("baseline", "none"),
        aggregator=aggregator, source=source,
    )
    federation.schedule()  # the graph must exist and admit the schedule: fail now, not mid-run
    return federation


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str], source: str = "--set") -> None:
    """Apply ``SECTION.KEY=VALUE`` (or ``nodes.ID.KEY=VALUE``) overrides in place.

    VALUE is read as a TOML value (``3``, ``0.5``, ``true``, ``[64, 64]``,
    ``"text"``); anything that is not valid TOML is taken as a plain string.
    """
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise FederationError(f"{source} {item!r}: expected SECTION.KEY=VALUE, "
                                  "e.g. training.epochs=2")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        table = raw
        for part in parts[:-1]:
            nxt = table.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise FederationError(f"{source} {item!r}: {part!r} is not a table")
            table = nxt
        table[parts[-1]] = value


def load_federation(path: str | Path, overrides: Iterable[str] = ()) -> Federation:
    """Read, override and validate the federation file at ``path``.

    Relative paths inside the file are resolved against the file's folder.
    Raises FederationError (one line, naming the file) on any problem.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FederationError(f"{path}: federation file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FederationError(f"{path}: cannot read federation file: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FederationError(f"{path}: not valid TOML: {exc}") from None
    apply_overrides(raw, overrides)
    return parse_federation(raw, source=str(path), base_dir=path.parent.resolve())
