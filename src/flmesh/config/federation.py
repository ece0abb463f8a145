"""The federation file's settings as immutable dataclasses (pure: no torch, no grpc).

:func:`flmesh.config.parser.load_federation` builds a :class:`Federation`
from a file; everything else in flmesh reads these objects. Units: seconds
for ``*_s``, MiB for ``*_mib``; ``epochs`` may be fractional (a share of one
pass over the node's batches).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

import networkx as nx

from flmesh import registry
from flmesh.config.graphs import GraphError, build_graph
from flmesh.config.trace import TraceEvent

if TYPE_CHECKING:
    from flmesh.topology.schedules import Schedule

SCENARIOS = ("novel_inputs", "novel_targets")
PARTICIPATION = ("exponential", "uniform", "full")
REPLAY_MODES = ("client", "aggregator", "local")
REWIND_MODES = ("off", "previous", "random")


@dataclass(frozen=True)
class TaskStreamConfig:
    """``[tasks]``: the task sequence, who is present when, and how often they take part."""

    scenario: str = "novel_targets"
    tasks: int = 5
    rounds_per_task: int = 10
    classes_per_task: int = 2
    initial_clients: int = 2
    joining_clients: int = 2
    participation: str = "exponential"
    beta: float = 0.5
    p: float = 0.5

    @property
    def clients_needed(self) -> int:
        """How many nodes the stream brings in by its last task."""
        return self.initial_clients + self.joining_clients * (self.tasks - 1)


@dataclass(frozen=True)
class ReplayConfig:
    """``[replay]``: replay buffers of class means (Zizzo et al., Sec. 3.2).

    ``mode``: "client" (the DP global buffer goes back to the clients, which
    train on it with their local buffer), "aggregator" (the aggregator trains
    the global model on it after averaging), or "local" (the baseline: local
    buffers only, nothing shared, no DP). ``local_means`` / ``global_means``:
    N means per class. ``epsilon``: Laplace DP epsilon of one release;
    ``clip``: the range inputs and outputs are clipped to; ``budget``: the most
    epsilon a client may spend (sequential composition), 0 = no limit;
    ``min_count``: fewest samples of a class a client releases a mean of;
    ``host``: the node that serves the buffer in a federation without an
    aggregator; ``server_epochs``: aggregator training's epochs over the buffer.
    """

    mode: str = "client"
    local_means: int = 5
    global_means: int = 5
    epsilon: float = 10.0
    clip: tuple[float, float] = (0.0, 1.0)
    budget: float = 0.0
    min_count: int = 5
    host: str | None = None
    server_epochs: float = 1.0


def _keywords(factory: Callable[..., Any]) -> set[str]:
    """The keyword arguments ``factory`` takes (empty when its signature cannot be read)."""
    try:
        return {p.name for p in inspect.signature(factory).parameters.values()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    except (TypeError, ValueError):
        return set()


#: How many ids a message lists before it says how many more there are.
IDS_SHOWN = 8


def some_ids(ids: Sequence[str], shown: int = IDS_SHOWN) -> str:
    """``ids`` joined by commas, the first ``shown`` of them and how many more: a message about
    a federation of 10,000 nodes stays a readable line."""
    more = len(ids) - shown
    return ", ".join(ids[:shown]) + (f" and {more} more" if more > 0 else "")


class FederationError(ValueError):
    """A federation file (or an override of it) is invalid. ``str()`` is one line: control
    characters that a user's value carried into the message (a path ending in a carriage
    return, say) are shown escaped."""

    def __init__(self, message: object = "") -> None:
        text = str(message)
        super().__init__("".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                                 for c in text))


@dataclass(frozen=True)
class TrainingConfig:
    """Local training settings. ``epochs`` may be fractional; ``lr`` is per step.

    ``optimizer`` is "sgd", "adam" or an import path of a callable building one;
    ``learner`` is what trains and evaluates (None: the default; a registered name or an
    import path: :mod:`flmesh.learning.learner`). Python passes objects to
    :class:`~flmesh.learning.task.Task` instead: the file stays pure data."""

    epochs: float = 1.0
    batch_size: int = 32
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    objective: str = "ce"
    device: str = "auto"
    learner: str | None = None


@dataclass(frozen=True)
class DataConfig:
    """Which data set, and how it is split across nodes and into train/test.

    ``source`` names user code that returns the data (:mod:`flmesh.learning.user_data`),
    called with ``args``; it replaces ``dataset``."""

    dataset: str = "digits"
    root: str | None = None
    download: bool = False
    partition: str = "dirichlet"
    alpha: float = 0.5
    shards_per_node: int = 2
    test_fraction: float = 0.2
    min_samples: int = 10
    source: str | None = None  # "package.module:callable" returning the data (instead of dataset)
    args: Mapping[str, Any] = field(default_factory=dict)  # the source's keyword arguments
    classes: int | None = None  # the federation's class count (None: from the labels)
    label_column: str = "label"  # a node's CSV file: the column holding the labels
    stream: bool = False  # a source's Dataset is streamed from disk, not read into memory
    workers: int = 0  # DataLoader worker processes reading a streamed set (0: the training thread)
    image_size: tuple[int, int] | None = None  # an image folder's (H, W) (None: its first image's)

    @property
    def origin(self) -> str:
        """What the data comes from: the source's import path, or the data set's name."""
        return self.source or self.dataset


@dataclass(frozen=True)
class ModelConfig:
    """Architecture name and its sizes (``hidden`` for the MLP, ``channels`` for the CNN).

    For ``resnet18``: ``norm`` "batch" or "group" (GroupNorm with ``groups`` groups) and
    ``small_input`` (3x3 stem without max-pool; None: when H and W <= 64). ``weights`` is a
    local state-dict file any model starts from (absolute once parsed).

    ``factory`` (set: ``name`` and its sizes are not used) is what builds the model instead:
    an import path ``"package.module:callable"`` or a registered name; ``args`` are the
    callable's keyword arguments (``[model.args]``). See :mod:`flmesh.learning.models` (a
    Python object goes to :class:`~flmesh.learning.task.Task` instead).
    """

    name: str = "mlp"
    hidden: tuple[int, ...] = (64,)
    channels: tuple[int, ...] = (16, 32)
    norm: str = "batch"
    groups: int = 2
    weights: str | None = None
    small_input: bool | None = None
    factory: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def label(self) -> str:
        """What builds the model, for titles and results: the factory (its import path or
        registered name), else the built-in ``name``."""
        return self.factory if self.factory is not None else self.name


@dataclass(frozen=True)
class RewindConfig:
    """FedRewind (Eq. 2): ``mode`` "off", "previous" (to the source) or "random"
    (RandRewind); ``lam`` is lambda, the share of E spent on the rewind node (0 < lam <= 0.5).

    ``scope`` matters with a server (Eq. 4, Alg. 2): "sampled" (the default) rewinds
    to the previous node of the chain *that the round sampled* (RandRewind: a random
    sampled node), so a round trains only on the data it selected; "chain" rewinds
    to the chain's previous node whether it was sampled or not. At C = 1 they agree."""

    mode: str = "off"
    lam: float = 0.1
    scope: str = "sampled"  # with a server: "sampled" (only nodes sampled this round) or "chain"


@dataclass(frozen=True)
class AggregatorConfig:
    """The optional server role (``[aggregator]``): a star federation around one aggregator.

    ``fraction`` is C, the share of nodes sampled per round (at least one);
    ``deadline_s`` closes a round with the updates that arrived (stragglers are
    dropped); fewer than ``min_updates`` keeps the previous global model.
    ``public_fraction`` of the data set is carved out before partitioning as the
    aggregator's labelled public split (Flashback's server distillation), never
    overlapping client data. ``clip_norm`` > 0 scales every update's change from the
    global model down to that L2 norm before any strategy aggregates (0: no clipping).
    ``max_samples`` bounds the sample count a node may claim (at Join and in every update;
    0: no bound beyond the count of the node's first Join, which a member sets alone).
    ``strategy`` is a registered name or an import path ``package.module:Class``;
    ``params`` its parameters (``[aggregator.params]`` over the strategy's declared
    defaults; docs/algorithms.md lists the built-ins').

    ``mode`` "async" is FedBuff (Nguyen et al. 2022, Alg. 1): every node trains continuously
    from the newest global model, and a "round" is one step of the global model, taken once
    ``buffer`` updates (K) have arrived (or at ``deadline_s`` with at least ``min_updates``);
    an update trained from the global model of ``s`` rounds before counts
    ``(1 + s) ** -staleness_exponent`` as much (FedBuff's 1/sqrt(1 + s) at 0.5), and one older
    than ``max_staleness`` rounds is refused.
    """

    strategy: str = "fedavg"
    address: str | None = None
    fraction: float = 1.0
    min_updates: int = 1
    deadline_s: float = 120.0
    public_fraction: float = 0.1
    clip_norm: float = 0.0
    max_samples: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    mode: str = "sync"
    buffer: int = 10
    max_staleness: int = 10
    staleness_exponent: float = 0.5

    @property
    def buffered(self) -> bool:
        """FedBuff's asynchronous rounds (``mode = "async"``)."""
        return self.mode == "async"


@dataclass(frozen=True)
class WireConfig:
    """How model streams travel (``[wire]``): floats as ``dtype`` ("native": as they are;
    "float16" / "bfloat16": half the bytes, lossy) and the payload compressed with
    ``compression`` ("none" or "zstd" at ``zstd_level``, lossless); the payload's ``digest``
    that the receiver checks every byte against: "xxh3_128" (the default, catches corruption),
    "blake3" or "sha256" (cryptographic, for a digest that must also be a content address)."""

    dtype: str = "native"
    compression: str = "none"
    zstd_level: int = 3
    digest: str = "xxh3_128"


@dataclass(frozen=True)
class TopologyConfig:
    graph: str = "complete"
    params: Mapping[str, Any] = field(default_factory=dict)
    file: Path | None = None
    schedule: str = "cwt"
    peers: int | None = None  # the peers each node sends to per round (the epidemic schedule's s)


@dataclass(frozen=True)
class PeersConfig:
    """How a node of a neighbour-averaging schedule (gossip, epidemic, exponential) combines its
    model with those that came (``[peers]``): ``strategy`` is a registered strategy that can
    combine a neighbourhood, or an import path; its parameters are its ``[algorithm.NAME]``."""

    strategy: str = "dpsgd"
    # barrier-free rounds: combine once ``wait`` of the round's in-peers' models have come (None:
    # all of them) or ``deadline_s`` seconds after the node's own training ended (None: no
    # deadline), with each in-peer's freshest model of the last ``max_staleness`` rounds, a late
    # one weighted by (1 + staleness) ** -staleness_exponent (FedAsync's polynomial rule)
    wait: int | None = None
    deadline_s: float | None = None
    staleness_exponent: float = 0.5
    max_staleness: int = 4

    @property
    def barrier_free(self) -> bool:
        """Whether a round may combine without waiting for every in-peer's model of the round."""
        return self.wait is not None or self.deadline_s is not None


@dataclass(frozen=True)
class DevicesConfig:
    """How fast the nodes compute, in simulated time (``[devices]``).

    ``step_s``: seconds one optimizer step takes on the reference device (None: fl-sim
    measures it on this machine and records it in the run folder); ``speed``: every node's
    speed relative to the reference (0.2: five times slower); ``spread``: sigma of a seeded
    log-normal spread of the nodes' speeds around ``speed`` (0: none); ``stragglers``: the
    share of nodes, drawn from the seed, that are ``slowdown`` times slower (low, high: a
    factor per straggler drawn uniformly between them); ``churn``: the share of nodes, drawn
    from the seed, that go offline now and then: online spells of ``online_s`` seconds on
    average and offline ones of ``offline_s`` (exponential, seeded); ``trace``: a CSV or JSON
    file of events (node, time_s, event, value) that change a node's speed, step time,
    bandwidth or availability over time (absolute path); ``overhead_s``: seconds of a node's
    own work each round besides its optimizer steps, at speed 1 (encoding, decoding, combining
    and evaluating models): a node that averages with its neighbours does it once the models
    it combines are in, any other with its training, before it sends; ``warmup_s``: seconds of
    a node's extra work in the first round it trains, at speed 1 (first-time costs: caches,
    lazy initialisation, a GPU's context), before that round's training."""

    step_s: float | None = None
    speed: float = 1.0
    spread: float = 0.0
    stragglers: float = 0.0
    slowdown: tuple[float, float] = (5.0, 5.0)
    churn: float = 0.0
    online_s: float = 600.0
    offline_s: float = 60.0
    trace: str | None = None
    overhead_s: float = 0.0
    warmup_s: float = 0.0
    # the trace's events as the file was read when the federation was parsed, in time order
    trace_events: tuple[TraceEvent, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class NetworkConfig:
    """The nodes' links, in simulated time (``[network]``): ``bandwidth_mbps`` each node's
    uplink in megabits per second (None: unlimited; the aggregator's too), ``latency_ms`` the
    one-way delay of every message a node sends, ``thin_links`` the share of node pairs, drawn
    from the seed, whose link carries ``thin_factor`` times less."""

    bandwidth_mbps: float | None = None
    latency_ms: float = 0.0
    thin_links: float = 0.0
    thin_factor: float = 10.0


@dataclass(frozen=True)
class NodeDevice:
    """One node's own device and link (``[nodes.ID]``), over ``[devices]`` and ``[network]``:
    ``speed`` or ``step_s`` (seconds per step: this node's, whatever the reference),
    ``bandwidth_mbps``, ``latency_ms``, ``offline``: (from_s, to_s) spells of simulated
    time when it neither trains nor sends, in order, and ``leave_s``: when it leaves for good
    (None: never)."""

    speed: float | None = None
    step_s: float | None = None
    bandwidth_mbps: float | None = None
    latency_ms: float | None = None
    offline: tuple[tuple[float, float], ...] = ()
    leave_s: float | None = None


@dataclass(frozen=True)
class NodeConfig:
    """One node: its id, optional address (HOST:PORT), partition index and training; ``data``
    is the node's own data file (absolute), which fl-node trains on instead of a partition."""

    id: str
    index: int
    training: TrainingConfig
    address: str | None = None
    partition: int | None = None
    data: str | None = None
    device: NodeDevice | None = None  # its own device and link in simulated time (None: the defaults)


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
    wire: WireConfig = WireConfig()
    eval_every: int = 1  # FA/FF/PFA every that many rounds and the last (star: global accuracy each round)
    # > 0: each model evaluated on its own test split and eval_sample - 1 others drawn from
    # (seed, round, node) instead of all N (the N x N cross-evaluation is quadratic); peer only
    eval_sample: int = 0
    metric: str = "accuracy"  # what FA, FF and PFA average: accuracy or a learner's metric
    # > 0: a peer's model farther from the node's own than this many recent medians is refused
    distance_guard: float = 0.0
    # what it was parsed from (overrides applied), so another process can parse the same one
    raw: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    base_dir: str | None = field(default=None, compare=False, repr=False)
    source: str = "<federation>"
    tasks: TaskStreamConfig | None = None  # a continual federation (topology/tasks.py)
    replay: ReplayConfig | None = None  # replay buffers of class means, with DP sharing
    # [algorithm.NAME] tables, each over its plug-in's declared defaults (name or import path)
    algorithms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    peers: PeersConfig | None = None  # how a neighbour-averaging schedule combines models
    # the device and network model of simulated time (None, None and no node's device: none)
    devices: DevicesConfig | None = None
    network: NetworkConfig | None = None
    target_accuracy: float | None = None  # a fraction: runs report the simulated time to reach it

    @property
    def timed(self) -> bool:
        """Whether the file describes devices or links, or has barrier-free rounds or an
        asynchronous aggregator (which decide what arrived in time on simulated time): fl-sim
        then reports simulated time."""
        barrier_free = self.peers is not None and self.peers.barrier_free and self.baseline == "none"
        buffered = self.aggregator is not None and self.aggregator.buffered
        return (self.devices is not None or self.network is not None or any(n.device for n in self.nodes)
                or barrier_free or buffered)

    @property
    def offline_spells(self) -> bool:
        """Whether a node may be offline in simulated time: its own ``offline`` spells or
        ``leave_s``, a trace's ``offline`` or ``leave`` events, or ``[devices] churn``."""
        devices = self.devices
        if devices is not None and (devices.churn > 0 or
                                    any(e.event == "offline" for e in devices.trace_events)):
            return True
        return bool(self.leave_times()) or any(n.device is not None and n.device.offline for n in self.nodes)

    def leave_times(self) -> dict[str, float]:
        """Node -> the simulated seconds at which it leaves the federation for good: its own
        ``leave_s`` or its trace's first ``leave`` event, the earlier. O(nodes + trace)."""
        out: dict[str, float] = {}
        if self.devices is not None:
            for e in self.devices.trace_events:
                if e.event == "leave":
                    out[e.node] = min(e.time_s, out.get(e.node, e.time_s))
        for n in self.nodes:
            if n.device is not None and n.device.leave_s is not None:
                out[n.id] = min(n.device.leave_s, out.get(n.id, n.device.leave_s))
        return out

    @property
    def node_ids(self) -> list[str]:
        """The node ids in file order (a new list: O(N); test membership with :meth:`has_node`)."""
        return [n.id for n in self.nodes]

    def has_node(self, node_id: str) -> bool:
        """Whether ``node_id`` is a node of the federation (O(1))."""
        return node_id in self._nodes_by_id()

    def node(self, node_id: str) -> NodeConfig:
        """Node ``node_id``'s configuration (O(1)); FederationError (one line) for an unknown id."""
        found = self._nodes_by_id().get(node_id)
        if found is None:
            raise FederationError(f"{self.source}: unknown node {node_id!r} "
                                  f"(the federation has {some_ids(self.node_ids)})")
        return found

    def _nodes_by_id(self) -> Mapping[str, NodeConfig]:
        # every node of an fl-sim looks itself and its peers up: a scan would be quadratic
        return self.derived("_by_id", lambda: MappingProxyType({n.id: n for n in self.nodes}))

    def derived(self, key: str, build: Callable[[], Any]) -> Any:
        """A value derived from this file alone (its graph, its schedule), built by ``build`` on
        first use and kept: every node of an fl-sim asks for the same one. ``replace()`` makes a
        new object with nothing kept. Thread-safe enough: two first callers may both build,
        and one result is kept."""
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
        return self.derived("_graph", build)

    def neighbours(self, node_id: str) -> list[str]:
        """The nodes ``node_id`` has an edge to in the graph (successors if directed), in
        federation order."""
        graph = self.graph()
        near = set(graph.successors(node_id) if graph.is_directed() else graph.neighbors(node_id))
        return sorted((n for n in near if n != node_id and self.has_node(n)),
                      key=lambda n: self.node(n).index)  # O(degree), not O(N)

    def schedule(self) -> Schedule:
        """The exchange schedule (built once, through :data:`flmesh.registry.schedules`); the
        Standalone baseline exchanges nothing. Raises FederationError (one line) when the name
        is unknown or the graph does not admit the schedule."""
        return self.derived("_schedule", self._build_schedule)

    def _build_schedule(self) -> Schedule:
        name = "standalone" if self.baseline == "standalone" else self.topology.schedule
        graph = self.graph()
        try:
            factory = registry.schedules.resolve(name)
            peers = self.topology.peers
            if peers is not None and "peers" not in _keywords(factory):
                raise FederationError(f"{self.source}: [topology] peers: the {name!r} schedule draws no "
                                      "peers (the epidemic schedule does); remove it")
            schedule = factory(graph, seed=self.seed, **({"peers": peers} if peers is not None else {}))
        except FederationError:
            raise
        except ValueError as exc:  # RegistryError, or the schedule refusing the graph
            raise FederationError(f"{self.source}: [topology] schedule "
                                  f"{self.topology.schedule!r}: {exc}") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a user's schedule raised (or called sys.exit)
            raise FederationError(f"{self.source}: [topology] schedule {self.topology.schedule!r} raised "
                                  f"{type(exc).__name__}: {exc}") from None
        if not callable(getattr(schedule, "plan", None)):
            raise FederationError(f"{self.source}: [topology] schedule {name!r} made a "
                                  f"{type(schedule).__name__}, which has no plan(round) method")
        return cast("Schedule", schedule)
