"""flmesh.timing: simulated time: how long a federation's rounds take on the devices and links
its file describes.

The device and network model (:mod:`~flmesh.timing.devices`: per-node compute and uplink
profiles, latencies, seeded spreads, trace files) and the replay of a run's rounds on it
(:mod:`~flmesh.timing.timeline`), on piecewise-constant rates (:mod:`~flmesh.timing.profiles`).
Pure: no torch, no grpc, no clock; the same rounds give the same simulated seconds on any machine.

May import: :mod:`flmesh.config`, numpy.
"""

from flmesh.config.trace import TraceError
from flmesh.timing.devices import DeviceModel, device_model
from flmesh.timing.profiles import Profile
from flmesh.timing.timeline import NodeWork, Timeline, trained_until, training_start

__all__ = ["DeviceModel", "NodeWork", "Profile", "Timeline", "TraceError", "device_model", "trained_until",
           "training_start"]
