"""The devices and links of a federation in simulated time: steps and transfers in seconds.

:func:`device_model` builds a :class:`DeviceModel` from the federation file's ``[devices]``,
``[network]`` and ``[nodes.ID]`` keys and its trace file: per node, a compute profile (optimizer
steps per second) and an uplink profile (bytes per second), both 0 while the node is offline,
and the one-way latency of what it sends, and when it leaves for good (``leave_s``, a trace's
``leave``: it finishes the round under way, so its profiles do not change; fl-sim's walk
planner acts on it). Where the file asks for a spread, the draws come
from the federation seed, so every run of the file gets the same devices:

- ``[devices] spread``: speeds log-normal around ``speed`` (median ``speed``, sigma ``spread``);
- ``[devices] stragglers``: that share of the nodes is ``slowdown`` times slower (a factor per
  straggler, uniform in ``[low, high]``);
- ``[network] thin_links``: that share of node pairs carries ``thin_factor`` times less;
- ``[devices] churn``: that share of the nodes goes offline now and then: online and offline
  spells drawn from exponentials of means ``online_s`` and ``offline_s``, for the first
  CHURN_HORIZON_S simulated seconds.

A transfer of ``b`` bytes from node i to node j started at ``t`` arrives at
``t + latency_i + b / bandwidth`` where the bandwidth is i's uplink (divided by ``thin_factor``
on a thin pair), integrated over i's profile (nothing moves while i is offline), and not
before j is online. A node's ``k`` concurrent sends share its uplink: each moves at 1/k of it.
Pure; thread-safe once built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from flmesh.config import DevicesConfig, Federation
from flmesh.config.trace import TraceEvent
from flmesh.timing.profiles import INF, Profile

#: Stream ids that keep these draws apart from every other use of the federation seed.
_SEED_SPREAD, _SEED_STRAGGLERS, _SEED_THIN, _SEED_CHURN = 301, 302, 303, 304
#: Simulated seconds churn spells are drawn for (about 11.5 days); beyond, churning nodes stay online.
CHURN_HORIZON_S = 1e6
#: The id the aggregator of a star federation has in the model (never a node id: ids are
#: lowercase letters, digits, "-" and "_", and the aggregator's is reserved).
AGGREGATOR = "aggregator"


@dataclass(frozen=True)
class DeviceModel:
    """Per node (and ``"aggregator"``): steps per second, uplink bytes per second, latency."""

    compute: Mapping[str, Profile]
    uplink: Mapping[str, Profile]
    latency_s: Mapping[str, float]
    online: Mapping[str, Profile]  # 1 while the node is online, 0 while it is not
    step_s: Mapping[str, float]  # each node's step time at time 0 (what the run record states)
    thin_share: float = 0.0
    thin_factor: float = 1.0
    seed: int = 0
    index: Mapping[str, int] | None = None
    overhead_steps: float = 0.0  # a round's own work besides its steps, in steps at the node's speed
    warmup_steps: float = 0.0  # a node's extra work in the first round it trains, likewise
    leaves: Mapping[str, float] = field(default_factory=dict)  # node -> when it leaves for good

    def train_until(self, node: str, start: float, steps: float) -> float:
        """When ``node`` has trained ``steps`` optimizer steps begun at ``start``."""
        return self.compute[node].finish(self.online[node].next_up(start), steps)

    def round_until(self, node: str, start: float, steps: float) -> float:
        """When ``node`` has done a round's own work begun at ``start``: ``steps`` optimizer
        steps and ``[devices] overhead_s`` (at its speed; ``steps`` 0: that work alone)."""
        return self.train_until(node, start, steps + self.overhead_steps)

    def warm_until(self, node: str, start: float) -> float:
        """When ``node``'s first-round extra work (``[devices] warmup_s``) begun at ``start`` is
        done: ``start`` itself without it. Call it before the first round a node trains."""
        return self.train_until(node, start, self.warmup_steps) if self.warmup_steps > 0 else start

    def online_at(self, node: str, t: float) -> bool:
        """Whether ``node`` is online at simulated time ``t`` and has not left for good."""
        return self.online[node].rate_at(t) > 0 and t < self.leaves.get(node, INF)

    def thin(self, a: str, b: str) -> bool:
        """Whether the link between ``a`` and ``b`` is a thin one (seeded; symmetric)."""
        if self.thin_share <= 0 or self.index is None or a not in self.index or b not in self.index:
            return False
        i, j = sorted((self.index[a], self.index[b]))
        return bool(np.random.default_rng([self.seed, _SEED_THIN, i, j]).random() < self.thin_share)

    def transfer_until(self, src: str, dst: str, start: float, nbytes: float, share: int = 1) -> float:
        """When ``nbytes`` sent from ``src`` to ``dst`` at ``start`` have arrived, ``src``'s
        uplink shared among ``share`` sends at once."""
        work = nbytes * max(1, share) * (self.thin_factor if self.thin(src, dst) else 1.0)
        sent = self.uplink[src].finish(self.online[src].next_up(start), work)
        return self.online[dst].next_up(sent + self.latency_s[src])


def _profile(changes: list[tuple[float, float]]) -> Profile:
    """A profile from (time, rate) changes in time order (the last change at a time wins)."""
    times: list[float] = []
    rates: list[float] = []
    for t, r in changes:
        if times and times[-1] == t:
            rates[-1] = r
        elif not rates or rates[-1] != r:
            times.append(t)
            rates.append(r)
    return Profile(times, rates)


def _speeds(federation: Federation) -> dict[str, float]:
    """Each node's speed relative to the reference device: its own, or the default with the
    file's seeded spread and stragglers."""
    devices = federation.devices
    ids = federation.node_ids
    base = {n: devices.speed if devices is not None else 1.0 for n in ids}
    if devices is not None and devices.spread > 0:
        rng = np.random.default_rng([federation.seed, _SEED_SPREAD])
        draws = rng.lognormal(0.0, devices.spread, len(ids))
        base = {n: base[n] * float(d) for n, d in zip(ids, draws, strict=True)}
    if devices is not None and devices.stragglers > 0:
        rng = np.random.default_rng([federation.seed, _SEED_STRAGGLERS])
        count = round(devices.stragglers * len(ids))
        chosen = rng.permutation(len(ids))[:count]
        low, high = devices.slowdown
        for i in sorted(int(c) for c in chosen):
            base[ids[i]] /= float(rng.uniform(low, high)) if high > low else low
    for node in federation.nodes:
        if node.device is not None and node.device.speed is not None:
            base[node.id] = node.device.speed
    return base


def _churn(federation: Federation) -> dict[str, list[tuple[float, float]]]:
    """The offline spells of the nodes ``[devices] churn`` draws (seeded), by node."""
    devices = federation.devices
    if devices is None or devices.churn <= 0:
        return {}
    ids = federation.node_ids
    rng = np.random.default_rng([federation.seed, _SEED_CHURN])
    chosen = sorted(int(i) for i in rng.permutation(len(ids))[:round(devices.churn * len(ids))])
    spells: dict[str, list[tuple[float, float]]] = {}
    for i in chosen:
        node_rng = np.random.default_rng([federation.seed, _SEED_CHURN, i])
        t, out = 0.0, []
        while t < CHURN_HORIZON_S:
            t += float(node_rng.exponential(devices.online_s))
            away = float(node_rng.exponential(devices.offline_s))
            if t < CHURN_HORIZON_S and away > 0:
                out.append((t, t + away))
            t += away
        spells[ids[i]] = out
    return spells


def _union(spells: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching spells merged, in order."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spells):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def device_model(federation: Federation, reference_step_s: float) -> DeviceModel:
    """The devices and links ``federation``'s file describes, with ``reference_step_s`` seconds
    per optimizer step at speed 1 (``[devices] step_s``, or what fl-sim measured); the trace's
    events are those the parser read."""
    fed = federation
    network = fed.network
    speeds = _speeds(fed)
    trace = fed.devices.trace_events if fed.devices is not None else ()
    step: dict[str, float] = {}
    bandwidth: dict[str, float] = {}
    latency: dict[str, float] = {}
    offline: dict[str, tuple[tuple[float, float], ...]] = {}
    default_bw = network.bandwidth_mbps if network is not None else None
    default_latency = network.latency_ms if network is not None else 0.0
    for cfg in fed.nodes:
        own = cfg.device
        step[cfg.id] = own.step_s if own is not None and own.step_s is not None else \
            reference_step_s / speeds[cfg.id]
        bw = own.bandwidth_mbps if own is not None and own.bandwidth_mbps is not None else default_bw
        bandwidth[cfg.id] = bw * 1e6 / 8 if bw is not None else INF
        lat = own.latency_ms if own is not None and own.latency_ms is not None else default_latency
        latency[cfg.id] = lat / 1000
        offline[cfg.id] = own.offline if own is not None else ()
    for node, drawn in _churn(fed).items():
        offline[node] = tuple(_union([*offline[node], *drawn]))
    by_node: dict[str, list[TraceEvent]] = {}
    for e in trace:
        by_node.setdefault(e.node, []).append(e)
    compute, uplink, online = {}, {}, {}
    for node in fed.node_ids:
        changes: list[tuple[float, str, float | None]] = [
            (0.0, "step_s", step[node]), (0.0, "bandwidth", bandwidth[node]), (0.0, "up", 1.0)]
        for a, b in offline[node]:
            changes += [(a, "up", 0.0), (b, "up", 1.0)]
        for e in by_node.get(node, []):
            if e.event == "speed":
                assert e.value is not None
                changes.append((e.time_s, "step_s", reference_step_s / e.value))
            elif e.event == "step_s":
                changes.append((e.time_s, "step_s", e.value))
            elif e.event == "bandwidth_mbps":
                assert e.value is not None
                changes.append((e.time_s, "bandwidth", e.value * 1e6 / 8))
            elif e.event in ("online", "offline"):  # a "leave" is the walk planner's (leaves)
                changes.append((e.time_s, "up", 1.0 if e.event == "online" else 0.0))
        changes.sort(key=lambda c: c[0])
        state = {"step_s": step[node], "bandwidth": bandwidth[node], "up": 1.0}
        steps_per_s, bytes_per_s, up = [], [], []
        for t, key, value in changes:
            assert value is not None
            state[key] = value
            steps_per_s.append((t, state["up"] / state["step_s"]))
            bytes_per_s.append((t, state["up"] * state["bandwidth"] if state["up"] else 0.0))
            up.append((t, state["up"]))
        compute[node], uplink[node], online[node] = _profile(steps_per_s), _profile(bytes_per_s), _profile(up)
    devices = fed.devices or DevicesConfig()
    agg_bw = default_bw * 1e6 / 8 if default_bw is not None else INF
    uplink[AGGREGATOR], online[AGGREGATOR] = Profile.constant(agg_bw), Profile.constant(1.0)
    compute[AGGREGATOR] = Profile.constant(INF)
    latency[AGGREGATOR] = default_latency / 1000
    return DeviceModel(compute, uplink, latency, online, step,
                       thin_share=network.thin_links if network is not None else 0.0,
                       thin_factor=network.thin_factor if network is not None else 1.0,
                       seed=fed.seed, index={n: i for i, n in enumerate(fed.node_ids)},
                       overhead_steps=devices.overhead_s / reference_step_s,
                       warmup_steps=devices.warmup_s / reference_step_s,
                       leaves=fed.leave_times())


__all__ = ["AGGREGATOR", "CHURN_HORIZON_S", "DeviceModel", "device_model"]
