"""A device model's trace file: events that change a node over simulated time.

CSV with the header ``node,time_s,event,value``, or JSON (a list of objects with those keys).
Events: ``speed`` (a factor of ``[devices] step_s``, from then on), ``step_s``,
``bandwidth_mbps``, ``offline``, ``online`` and ``leave`` (no value: the node leaves the
federation for good; a walk or neighbour averaging). Read and checked when the federation
file is parsed (:func:`read_trace`), so a mistake is one line before anything runs. Pure
standard library.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TRACE_EVENTS = ("speed", "step_s", "bandwidth_mbps", "offline", "online", "leave")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class TraceEvent:
    node: str
    time_s: float
    event: str  # one of TRACE_EVENTS
    value: float | None  # speed, step_s or bandwidth_mbps; None for offline, online and leave


def read_trace(path: str | Path, nodes: Iterable[str]) -> list[TraceEvent]:
    """A trace file's events, checked: CSV with a header ``node,time_s,event,value`` or JSON (a
    list of objects with those keys). Raises TraceError naming the file and the line or entry."""
    path = Path(path)
    known = set(nodes)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace file: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".json":
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise TraceError(f"{path}: not JSON ({exc})") from None
        if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
            raise TraceError(f"{path}: expected a JSON list of objects with node, time_s, event, value")
        rows = [(f"{path}: entry {i}", e) for i, e in enumerate(raw)]
    else:
        reader = csv.DictReader(text.splitlines())
        if reader.fieldnames is None or not {"node", "time_s", "event"} <= set(reader.fieldnames):
            raise TraceError(f"{path}: line 1: expected the header node,time_s,event,value")
        rows = [(f"{path}:{i + 2}", e) for i, e in enumerate(reader)]
    events = [_event(where, e, known) for where, e in rows]
    events.sort(key=lambda e: (e.time_s, e.node))
    _check_returns(path, events)
    return events


def _event(where: str, raw: Mapping[str, object], known: set[str]) -> TraceEvent:
    node, event = str(raw.get("node", "")).strip(), str(raw.get("event", "")).strip()
    if node not in known:
        raise TraceError(f"{where}: unknown node {node!r} (the federation has {len(known)} nodes)")
    if event not in TRACE_EVENTS:
        raise TraceError(f"{where}: unknown event {event!r} (expected one of {', '.join(TRACE_EVENTS)})")
    try:
        time_s = float(raw.get("time_s"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(f"{where}: time_s {raw.get('time_s')!r} is not a number of seconds") from None
    if not math.isfinite(time_s) or time_s < 0:
        raise TraceError(f"{where}: time_s must be a finite number of seconds >= 0, got {time_s:g}")
    value: float | None = None
    if event in ("speed", "step_s", "bandwidth_mbps"):
        try:
            value = float(raw.get("value"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise TraceError(f"{where}: {event} needs a value, got {raw.get('value')!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise TraceError(f"{where}: {event} must be a finite number > 0, got {value:g}")
    return TraceEvent(node, time_s, event, value)


def _check_returns(path: Path, events: list[TraceEvent]) -> None:
    """A node that goes offline must come back (a ``leave`` is the way to go for good): rounds
    that wait for it would never end."""
    last: dict[str, TraceEvent] = {}
    for e in events:
        if e.event in ("offline", "online"):
            last[e.node] = e
    for node, e in sorted(last.items()):
        if e.event == "offline":
            raise TraceError(f"{path}: node {node!r} goes offline at {e.time_s:g} s and never comes back "
                             "online; add an 'online' event (synchronous rounds would wait for it for ever), "
                             "or, for a node that leaves for good, put a 'leave' event in its place")


__all__ = ["TRACE_EVENTS", "TraceError", "TraceEvent", "read_trace"]
