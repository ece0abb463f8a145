"""Transports are backends: a third one, registered by a test and touching no flmesh file, runs a
federation through Simulation and flmesh.testing with the numbers of the built-in ones."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from flmesh import registry, testing
from flmesh.config import parse_federation
from flmesh.registry import RegistryError
from flmesh.sim.simulation import Simulation
from flmesh.transports.backend import TransportSettings, create
from flmesh.transports.seam import ByteCounter

from conftest import tiny_raw


class Counted:
    """Forwards every call to ``inner`` and counts it by method name."""

    def __init__(self, inner: Any, calls: Counter[str]):
        self._inner, self._calls = inner, calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._calls[name] += 1
            return value(*args, **kwargs)
        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)


class CountingBackend:
    """The in-memory backend with every transport call counted: what a test's own backend is."""

    name = "counting"
    wire = False
    secure = False
    calls: Counter[str] = Counter()

    def __init__(self, settings: TransportSettings):
        self._memory = create("memory", settings)

    def peer_transport(self, me: str, counter: ByteCounter) -> Any:
        return Counted(self._memory.peer_transport(me, counter), self.calls)

    def aggregator_transport(self, me: str, address: str | None, counter: ByteCounter) -> Any:
        return Counted(self._memory.aggregator_transport(me, address, counter), self.calls)

    def replay_transport(self, me: str, host: str, address: str | None, counter: ByteCounter) -> Any:
        return Counted(self._memory.replay_transport(me, host, address, counter), self.calls)

    def serve_node(self, me: str, listen: str, handlers: Any, replay: Any = None) -> Any:
        self.calls["serve_node"] += 1
        return self._memory.serve_node(me, listen, handlers, replay)

    def serve_aggregator(self, listen: str, handlers: Any, replay: Any = None) -> Any:
        self.calls["serve_aggregator"] += 1
        return self._memory.serve_aggregator(listen, handlers, replay)

    def close(self) -> None:
        self._memory.close()


@pytest.fixture
def counting():
    CountingBackend.calls = Counter()
    registry.transports.register("counting", CountingBackend)
    yield CountingBackend.calls
    registry.transports.unregister("counting")


@pytest.mark.parametrize("star", [False, True], ids=["peer", "star"])
def test_a_registered_backend_runs_a_simulation_with_the_same_numbers(tmp_path, counting, star):
    raw = tiny_raw(nodes=3, rounds=2, rewind={"mode": "previous"}) if not star else \
        tiny_raw(nodes=3, rounds=2, aggregator={"fraction": 1.0})
    fed = parse_federation(raw, source="t.toml")
    finals = {}
    for transport in ("memory", "counting"):
        with Simulation(fed, tmp_path / transport, transport=transport) as sim:
            sim.draw_pictures = False
            summary = sim.run()
        assert summary.config["transport"] == transport
        finals[transport] = summary.final
    assert finals["counting"] == finals["memory"]
    assert counting["serve_node"] == 3 and counting["serve_aggregator"] == (1 if star else 0)
    moved = "deliver" if not star else "submit"
    assert counting[moved] > 0 and (star or counting["train"] > 0), dict(counting)


def test_a_registered_backend_runs_a_testing_cluster_bit_for_bit(counting):
    fed = parse_federation(tiny_raw(nodes=3, rounds=2), source="t.toml")
    memory, counted = testing.run(fed, "memory"), testing.run(fed, "counting")
    assert all(torch.equal(memory[n][k], counted[n][k]) for n in memory for k in memory[n])
    assert counting["deliver"] == 3  # round 1's three models (round 2, the last, delivers none)


def test_an_unknown_transport_is_one_line_listing_the_known_ones(tmp_path):
    fed = parse_federation(tiny_raw(), source="t.toml")
    with pytest.raises(ValueError, match=r"^unknown transport 'carrier-pigeon' \(registered: grpc, memory; "):
        Simulation(fed, tmp_path, transport="carrier-pigeon")
    with pytest.raises(RegistryError, match="unknown transport"):
        testing.Cluster(fed, "carrier-pigeon")
    with pytest.raises(ValueError, match="insecure needs a transport with a wire"):
        create("memory", TransportSettings(fed, insecure=True))
