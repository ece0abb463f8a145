"""The federation file: one TOML file that describes a whole federation.

The same file drives ``fl-sim`` on one host and every ``fl-node`` of a real
deployment. Parsing is strict: an unknown key, a wrong type or an out-of-range
value raises :class:`FederationError` with a one-line message naming the file,
the section and key, and what was expected.

Sections (all but ``[federation]`` optional)::

    [federation]  name, seed, rounds, round_timeout_s, max_model_mib, baseline, eval_every,
                  eval_sample, target_accuracy
    [topology]    nodes, graph, params, file, schedule, peers (the epidemic schedule's s)
    [training]    epochs, batch_size, lr, optimizer, momentum, weight_decay, objective, device,
                  learner
    [data]        dataset, root, download, partition, alpha, shards_per_node,
                  test_fraction, min_samples, source, args, classes, label_column
    [model]       name, hidden, channels, norm, groups, weights, small_input; or factory and a
                  [model.args] table (a model from user code)
    [rewind]      mode ("off", "previous", "random"), lambda
    [wire]        dtype ("native", "float16", "bfloat16"), compression ("none", "zstd"), zstd_level,
                  digest ("xxh3_128", "blake3", "sha256")
    [aggregator]  strategy, address, fraction, min_updates, deadline_s, public_fraction,
                  clip_norm, params (present: a star federation); mode ("sync", "async": FedBuff),
                  buffer, max_staleness, staleness_exponent
    [aggregator.params]  the strategy's parameters (docs/algorithms.md)
    [peers]       strategy (how an averaging schedule's nodes combine models; default "dpsgd"), and
                  for barrier-free rounds wait, deadline_s, max_staleness, staleness_exponent
    [algorithm.NAME]     a plug-in's parameters, NAME registered or an import path
    [devices]     step_s, speed, spread, stragglers, slowdown, churn, online_s, offline_s, trace
                  (simulated time: how fast nodes compute, and when they are away)
    [network]     bandwidth_mbps, latency_ms, thin_links, thin_factor (simulated time: the links)
    [nodes.<id>]  address, partition, data (its own file), speed, step_s, bandwidth_mbps, latency_ms,
                  offline, leave_s, and any [training] key as a per-node override;
                  a table for every node (any ids), or, with [topology] nodes = N, for some of the
                  generated node0 .. node<N-1>

Units: ``round_timeout_s`` seconds, ``max_model_mib`` MiB, ``epochs`` may be
fractional (a share of one pass over the node's batches). Numbers have upper bounds
too (``MAX_*`` in :mod:`flmesh.config.checks`; docs/reliability.md), and ``graph``
names one of an allow-list of generators (:data:`flmesh.config.graphs.GENERATORS`).
Every key's check is in :mod:`flmesh.config.schema`.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from flmesh import registry
from flmesh.config.checks import EXACT_EVAL_LIMIT, MAX_NODES, SectionReader, key_text, mib
from flmesh.config.continual import read_continual
from flmesh.config.federation import (
    AggregatorConfig,
    DataConfig,
    DevicesConfig,
    Federation,
    FederationError,
    ModelConfig,
    NetworkConfig,
    NodeConfig,
    NodeDevice,
    PeersConfig,
    RewindConfig,
    TopologyConfig,
    TrainingConfig,
    WireConfig,
)
from flmesh.config.graphs import shown
from flmesh.config.plugin_tables import MOVED_TRAINING, read_plugin_tables
from flmesh.config.schema import (
    ID_RULE,
    NODE_DEVICE,
    NODE_ID,
    NODE_KEYS,
    OPTIMIZERS,
    REQUIRED,
    SECTIONS,
    TRAINING,
)
from flmesh.config.trace import TraceError, read_trace

DEFAULT_MAX_MODEL_MIB = 512.0
GENERATED_ID = re.compile(r"^node\d+$")  # the form of the ids ``[topology] nodes = N`` makes


def model_floor_mib(model: ModelConfig) -> float:
    """A lower bound on the size of ``model`` in MiB: float32 weights without biases, on the
    smallest inputs of any data set (8x8 grey digits, 10 classes). A model past
    ``max_model_mib`` by this bound is too big for every data set."""
    if model.name == "mlp":
        widths = (64, *model.hidden, 10)
        weights = sum(a * b for a, b in zip(widths, widths[1:], strict=False))
    elif model.name == "cnn":  # 3x3 convolutions, then one 2x2 pool before the classifier
        channels = (1, *model.channels)
        weights = 9 * sum(a * b for a, b in zip(channels, channels[1:], strict=False))
        weights += model.channels[-1] * 4 * 4 * 10
    else:  # fixed architectures, far below any max_model_mib that lets a model through
        return 0.0
    return weights * 4 / 2**20


def _check_factory(r: SectionReader, model: Mapping[str, Any]) -> None:
    built_in = [k for k in ("name", "hidden", "channels", "norm", "groups", "small_input") if k in model]
    if "factory" in model and built_in:
        raise r.fail(f"[model] {built_in[0]}", "a built-in model's key; with [model] factory the "
                     "factory builds the model (give its arguments in [model.args])")
    if "args" in model and "factory" not in model:
        raise r.fail("[model] args", "arguments of [model] factory, which is missing")


def _check_model_size(r: SectionReader, model: ModelConfig, max_mib: float) -> None:
    # Layer widths within their bound can still multiply into a model no peer accepts (and
    # that takes the machine's memory to build): say so now, not after the first round.
    floor = model_floor_mib(model)
    if floor > max_mib:
        key = "hidden" if model.name == "mlp" else "channels"
        raise r.fail(f"[model] {key}", f"{list(getattr(model, key))} makes a model of at least "
                     f"{mib(floor)} MiB, over [federation] max_model_mib = {max_mib:g} "
                     "(peers refuse larger models)")


def _node_ids(r: SectionReader, count: int | None, tables: list[str]) -> list[str]:
    """The federation's node ids: ``[topology] nodes = N`` makes node0 .. node<N-1>, and
    ``[nodes.<id>]`` tables either list every node (N of them, any ids) or override some of
    the N generated ones."""
    if count is None:
        if not tables:
            raise r.fail("[topology] nodes", "required: give the node count, or list [nodes.<id>] tables")
        return tables
    made = [f"node{i}" for i in range(count)]
    if not tables or len(tables) == count:
        return made if not tables else tables
    strangers = [t for t in tables if t not in made]
    if not strangers:
        return made
    if len(strangers) == len(tables) and not any(GENERATED_ID.match(t) for t in tables):
        raise r.fail("[topology] nodes", f"says {count} but [nodes] lists {len(tables)}")
    raise r.fail(f"[nodes.{key_text(strangers[0])}]", f"not one of the {count} nodes of [topology] "
                 f"nodes = {count} (node0 to node{count - 1}); to name nodes yourself, give each of "
                 f"the {count} a [nodes.<id>] table")


def parse_federation(raw: Mapping[str, Any], source: str = "<federation>",
                     base_dir: Path | None = None) -> Federation:
    """Validate a parsed TOML document into a :class:`Federation`.

    ``base_dir`` resolves relative paths (graph file, data root); it defaults to
    the current directory. Raises FederationError on the first problem.
    """
    r = SectionReader(source, REQUIRED)
    original = copy.deepcopy(dict(raw))  # kept on the result, as it came in
    known = set(SECTIONS) | {"nodes", "tasks", "replay", "algorithm"}
    for key in raw:
        if key not in known:
            raise r.fail(f"[{key_text(key)}]",
                         f"unknown section (expected one of {', '.join(sorted(known))})")
    fed = r.section(raw, "federation", SECTIONS["federation"])
    topo = r.section(raw, "topology", SECTIONS["topology"])
    training_keys = r.section(raw, "training", TRAINING)
    for moved in MOVED_TRAINING:  # read into the plug-in's table (read_plugin_tables)
        training_keys.pop(moved, None)
    training = TrainingConfig(**training_keys)
    data = r.section(raw, "data", SECTIONS["data"])
    model = ModelConfig(**r.section(raw, "model", SECTIONS["model"]))
    _check_factory(r, raw.get("model", {}))
    rewind_raw = r.section(raw, "rewind", SECTIONS["rewind"])
    rewind = RewindConfig(mode=rewind_raw.get("mode", "off"), lam=rewind_raw.get("lambda", 0.1),
                          scope=rewind_raw.get("scope", "sampled"))
    aggregator, algorithms = read_plugin_tables(r, raw)
    if aggregator is not None and fed.get("baseline", "none") != "none":
        raise r.fail("[federation] baseline", "baselines compare exchange schedules; "
                     "remove [aggregator] to run one")
    if aggregator is not None and fed.get("eval_sample", 0):  # a star round evaluates K models, not N
        raise r.fail("[federation] eval_sample", "peer federations only: a star row needs each "
                     "participant on every test split (WSM's client forgetting, Flashback's F_k,t); "
                     "remove it or [aggregator]")
    base = base_dir or Path.cwd()

    nodes_raw = raw.get("nodes", {})
    if not isinstance(nodes_raw, dict):
        raise r.fail("[nodes]", f"expected a table of node tables, got {shown(nodes_raw)}")
    ids = _node_ids(r, topo.get("nodes"), list(nodes_raw))
    if len(ids) < 2:
        raise r.fail("[nodes]", f"a federation needs at least 2 nodes, got {len(ids)}")
    if len(ids) > MAX_NODES:
        raise r.fail("[nodes]", f"a federation file holds at most {MAX_NODES} nodes, got {len(ids)}")
    if aggregator is not None and aggregator.min_updates > len(ids):
        raise r.fail("[aggregator] min_updates", f"expected at most the federation's {len(ids)} nodes, "
                     f"got {aggregator.min_updates} (the global model would never change)")
    if aggregator is None and len(ids) > EXACT_EVAL_LIMIT and not fed.get("eval_sample", 0):
        raise r.fail("[federation] eval_sample", f"{len(ids)} nodes would evaluate every model on every test "
                     f"split ({len(ids) ** 2} evaluations a round); above {EXACT_EVAL_LIMIT} nodes set "
                     "eval_sample = K (each model on its own split and K-1 others, e.g. 10)")
    if aggregator is not None:
        _check_buffered(r, aggregator, len(ids))
    _check_model_size(r, model, fed.get("max_model_mib", DEFAULT_MAX_MODEL_MIB))

    nodes = []
    partitions_seen: dict[int, str] = {}
    for index, node_id in enumerate(ids):
        if not NODE_ID.match(node_id):
            raise r.fail(f"[nodes.{key_text(node_id)}]", f"node ids are {ID_RULE}")
        label = f"[nodes.{node_id}]"
        entry = r.section(nodes_raw, node_id, NODE_KEYS, label) if nodes_raw else {}
        part = entry.pop("partition", None)
        if part is not None:
            if part >= len(ids):
                raise r.fail(f"{label} partition", f"expected an integer < {len(ids)}, got {part}")
            if part in partitions_seen:
                raise r.fail(f"{label} partition", f"partition {part} is already held by "
                             f"{partitions_seen[part]!r}")
            partitions_seen[part] = node_id
        address = entry.pop("address", None)
        own = entry.pop("data", None)
        device = {k: entry.pop(k) for k in list(entry) if k in NODE_DEVICE}
        nodes.append(NodeConfig(id=node_id, index=index, training=replace(training, **entry),
                                address=address, partition=part,
                                data=str((base / own).resolve()) if own is not None else None,
                                device=NodeDevice(**device) if device else None))

    if rewind.mode != "off":
        for label, cfg in [("[training]", training), *((f"[nodes.{n.id}]", n.training) for n in nodes)]:
            if cfg.optimizer not in OPTIMIZERS:  # the rewind node rebuilds the sender's optimizer
                raise r.fail(f"{label} optimizer", "[rewind] carries the optimizer's state to the rewind "
                             "node, which rebuilds 'sgd' or 'adam' only; use one of them or rewind off")
    if "source" in data and "dataset" in data:
        raise r.fail("[data] source", "names the data instead of dataset: give one of them")
    if "root" in data:
        data["root"] = str((base / data["root"]).resolve())
    if model.weights is not None:
        model = replace(model, weights=str((base / model.weights).resolve()))
    graph_file = topo.pop("file", None)
    topology = TopologyConfig(
        **{k: v for k, v in topo.items() if k != "nodes"},
        file=(base / graph_file).resolve() if graph_file else None,
    )
    tasks, replay = read_continual(r, raw, ids, fed["rounds"], aggregator)
    if aggregator is not None and aggregator.buffered and (tasks is not None or rewind.mode != "off"):
        what = "[tasks]" if tasks is not None else "[rewind] mode"
        raise r.fail("[aggregator] mode", f"asynchronous rounds take no {what}: a node's task and rewind "
                     "peer follow lock-step rounds; use mode = \"sync\"")
    devices, network = _time_model(r, raw, base, ids)
    federation = Federation(
        name=fed["name"], seed=fed.get("seed", 0), rounds=fed["rounds"],
        round_timeout_s=fed.get("round_timeout_s", 120.0),
        max_model_mib=fed.get("max_model_mib", DEFAULT_MAX_MODEL_MIB),
        topology=topology, training=training, data=DataConfig(**data), model=model,
        nodes=tuple(nodes), rewind=rewind, baseline=fed.get("baseline", "none"),
        eval_every=fed.get("eval_every", 1), eval_sample=fed.get("eval_sample", 0),
        metric=fed.get("metric", "accuracy"), distance_guard=fed.get("distance_guard", 0.0),
        raw=original, base_dir=str(base),
        wire=WireConfig(**r.section(raw, "wire", SECTIONS["wire"])),
        aggregator=aggregator, source=source, tasks=tasks, replay=replay, algorithms=algorithms,
        peers=_peers_config(r, raw, topology.schedule if fed.get("baseline", "none") == "none" else ""),
        devices=devices, network=network, target_accuracy=fed.get("target_accuracy"),
    )

    schedule = federation.schedule()  # the graph must exist and admit the schedule: fail now, not mid-run
    _check_peers(r, federation, bool(getattr(schedule, "averages", False)), "peers" in raw)
    _check_leaves(r, federation)
    return federation


def _check_leaves(r: SectionReader, federation: Federation) -> None:
    """Refuse a node that leaves for good where rounds would wait for it or lose its share: a
    walk, neighbour averaging and an aggregator's rounds go on past it (fl-sim decides on
    simulated time who has left); a baseline and push-sum do not."""
    leaves = federation.leave_times()
    peers = federation.peers
    push_sum = peers is not None and peers.strategy == "push_sum"
    if not leaves or (federation.baseline == "none" and not push_sum):
        return
    node = min(leaves, key=federation.node_ids.index)
    own = next(n.device for n in federation.nodes if n.id == node)
    where = f"[nodes.{node}] leave_s" if own is not None and own.leave_s is not None else "[devices] trace"
    if push_sum:
        raise r.fail(where, f"node {node!r} leaves for good, and push-sum would lose the weight it holds: "
                     "use dpsgd, epidemic or fedavg, or give it an offline spell that ends instead")
    raise r.fail(where, f"node {node!r} leaves for good, and a baseline run would wait for it; a walk, "
                 "neighbour averaging and an aggregator's rounds go on past a node that left: give it an "
                 "offline spell that ends instead")


def _check_buffered(r: SectionReader, agg: AggregatorConfig, nodes: int) -> None:
    """Refuse what FedBuff's asynchronous rounds cannot run: a sampled fraction (every node trains
    continuously), a buffer larger than the federation, a strategy that cannot take stale updates."""
    if not agg.buffered:
        return
    if agg.fraction < 1:
        raise r.fail("[aggregator] fraction", f"asynchronous rounds train every node continuously; got "
                     f"{agg.fraction:g}: remove it or use mode = \"sync\"")
    if agg.buffer > nodes:
        raise r.fail("[aggregator] buffer", f"expected at most the federation's {nodes} nodes, got "
                     f"{agg.buffer} (each node adds at most one update to a buffer)")
    if agg.min_updates > agg.buffer:
        raise r.fail("[aggregator] min_updates", f"expected at most buffer = {agg.buffer}, got "
                     f"{agg.min_updates}")
    plugin = registry.algorithms.resolve(agg.strategy)
    if not getattr(plugin, "stale_updates", False):
        able = ", ".join(n for n in registry.algorithms.builtin_names()
                         if getattr(registry.algorithms.resolve(n), "stale_updates", False))
        raise r.fail("[aggregator] strategy", f"{agg.strategy!r} cannot take updates trained from an older "
                     f"global model (asynchronous rounds): use {able}, or a plug-in with stale_updates = "
                     "True, or mode = \"sync\"")


def _time_model(r: SectionReader, raw: Mapping[str, Any], base: Path,
                ids: list[str]) -> tuple[DevicesConfig | None, NetworkConfig | None]:
    """``[devices]`` and ``[network]`` (each None when absent); the trace path made absolute."""
    devices = network = None
    if "devices" in raw:
        given = r.section(raw, "devices", SECTIONS["devices"])
        if "trace" in given:
            given["trace"] = str((base / given["trace"]).resolve())
            try:
                given["trace_events"] = tuple(read_trace(given["trace"], ids))
            except TraceError as exc:
                raise r.fail("[devices] trace", str(exc)) from None
        devices = DevicesConfig(**given)
    if "network" in raw:
        network = NetworkConfig(**r.section(raw, "network", SECTIONS["network"]))
    return devices, network


def _peers_config(r: SectionReader, raw: Mapping[str, Any], schedule: str) -> PeersConfig | None:
    """``[peers]``, or its default when the schedule (by its registered factory) averages."""
    given = r.section(raw, "peers", SECTIONS["peers"]) if "peers" in raw else None
    if given is not None:
        return PeersConfig(**given)
    try:
        factory = registry.schedules.resolve(schedule)
    except ValueError:
        return None  # Federation.schedule() names the unknown schedule
    if not getattr(factory, "averages", False):
        return None
    return PeersConfig(strategy=str(getattr(factory, "strategy", PeersConfig.strategy)))


def _check_peers(r: SectionReader, federation: Federation, averages: bool, given: bool) -> None:
    """Refuse what cannot run with the schedule's pattern: a walk's keys on an averaging schedule
    and the reverse, a strategy that cannot combine a neighbourhood here."""
    fed, name = federation, federation.topology.schedule
    if not averages:
        if given and fed.baseline == "none":  # a baseline runs its own schedule: [peers] rests
            raise r.fail("[peers] strategy", f"combines models of an averaging schedule (gossip, epidemic, "
                         f"exponential); schedule {name!r} walks one model from node to node: remove [peers]")
        return
    if fed.baseline != "none":
        return  # the baseline's own schedule runs instead
    if fed.aggregator is not None:
        raise r.fail("[topology] schedule", f"{name!r} averages models between peers; a federation with "
                     "[aggregator] is a star: remove one of them")
    if fed.rewind.mode != "off":
        raise r.fail("[rewind] mode", f"rewind belongs to a walk (cwt, rwt); schedule {name!r} averages "
                     "models between peers: set mode = \"off\"")
    if fed.peers is None:
        raise r.fail("[peers] strategy", f"schedule {name!r} averages models: name how they are combined")
    plugin = registry.algorithms.resolve(fed.peers.strategy)  # the schema checked it combines
    if fed.peers.barrier_free and fed.peers.strategy == "push_sum":
        raise r.fail("[peers] wait", "push-sum needs every in-peer's weight share each round (a share "
                     "left out is mass lost): use dpsgd, epidemic or fedavg for barrier-free rounds, or "
                     "wait = \"all\"")
    if fed.peers.wait is not None:
        graph = fed.graph()
        degree = graph.in_degree if graph.is_directed() else graph.degree
        node, least = min(((n, degree(n)) for n in fed.node_ids), key=lambda nd: nd[1])
        if fed.peers.wait > least:
            raise r.fail("[peers] wait", f"{fed.peers.wait} models a round, but node {node!r} has {least} "
                         f"in-peer(s) on the graph: set wait to at most {least}, or \"all\"")
    why = plugin.refuse_neighbourhood(fed)
    if why:
        raise r.fail("[peers] strategy", why)
    for other in fed.algorithms:  # a plug-in that sends its own updates along a walk's rounds
        if any(registry.algorithms.resolve(other).gossip(fed, n.training) for n in fed.nodes):
            raise r.fail(f"[algorithm.{other}]", f"{other!r} exchanges its own updates between a walk's "
                         f"rounds; schedule {name!r} averages models: use it with cwt or rwt")


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str], source: str = "--set") -> None:
    """Apply ``SECTION.KEY=VALUE`` (or ``nodes.ID.KEY=VALUE``) overrides in place.

    VALUE is read as a TOML value (``3``, ``0.5``, ``true``, ``[64, 64]``,
    ``"text"``); anything that is not valid TOML is taken as a plain string.
    """
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise FederationError(f"{source} {shown(item)}: expected SECTION.KEY=VALUE, "
                                  "e.g. training.epochs=2")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        table = raw
        for part in parts[:-1]:
            nxt = table.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise FederationError(f"{source} {shown(item)}: {shown(part)} is not a table")
            table = nxt
        table[parts[-1]] = value


def load_federation(path: str | Path, overrides: Iterable[str] = ()) -> Federation:
    """Read, override and validate the federation file at ``path``.

    ``overrides`` are ``SECTION.KEY=VALUE`` strings applied before validation, as
    ``fl-sim --set`` takes them (``"federation.rounds=2"``; VALUE is read as TOML).
    Relative paths inside the file are resolved against the file's folder. Blocking: it
    reads the file and imports the algorithm plug-ins it names. Raises FederationError
    (one line, naming the file) on any problem.
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
