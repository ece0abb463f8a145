"""What a run folder records so the run can be repeated or continued from it alone.

Every writer (fl-sim, :class:`~flmesh.sim.simulation.Simulation`, fl-node and its aggregator
role) writes, before the first round:

* ``federation.toml``: the effective federation file (the file as read, ``--set`` and the
  flags that override keys applied), written by :func:`toml_text` from
  :attr:`~flmesh.config.Federation.raw`;
* ``run.json``: who wrote the run (``writer``; fl-node's ``node``), the command line (None
  from Python), the file it came from and the folder its relative paths resolve against
  (relative to the run folder, so the two folders may move together), the transport, the
  seed, the device and the flmesh, torch, numpy and Python versions (:func:`write_record`);

and, when the run ends, with a DP replay buffer (``[replay]``), ``privacy_ledger.json``: the
buffer host's privacy ledger (:func:`~flmesh.reports.run_files.write_ledger`).

:func:`load_record` reads both back into a :class:`RunRecord` (``fl-sim rerun`` and
``fl-sim --resume``); a folder without them, a record fl-sim cannot repeat, or a
``federation.toml`` that no longer is the one the run started with, raises
:class:`RecordError` (one line).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flmesh import registry
from flmesh.config import Federation, FederationError, parse_federation
from flmesh.reports.run_files import write_atomic

RUN_FILE = "run.json"
FEDERATION_FILE = "federation.toml"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class RecordError(FederationError):
    """A folder that holds no run record, or a record that cannot be used; one line."""


# ---------------------------------------------------------------------------- TOML
def toml_text(raw: Mapping[str, Any]) -> str:
    """``raw`` (a parsed TOML document: tables, arrays, strings, numbers, booleans) as TOML
    text that :mod:`tomllib` reads back equal to ``raw``. Tables become ``[a.b]`` sections;
    tables inside arrays become inline tables. Raises TypeError on any other value."""
    lines: list[str] = []
    _table(raw, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(table: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    subtables = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    for key, value in table.items():
        if key not in subtables:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in subtables.items():
        lines.extend(["", "[" + ".".join(_key(p) for p in [*path, key]) + "]"])
        _table(value, [*path, key], lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # JSON's escapes are TOML's, but for DEL (TOML wants it escaped) and non-ASCII (kept as is:
    # JSON would write surrogate pairs, which TOML refuses)
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for a {type(value).__name__}")


# ---------------------------------------------------------------------------- the record
@dataclass
class RunRecord:
    """A run folder's record: its federation (parsed again from federation.toml) and how it ran."""

    folder: Path
    federation: Federation
    transport: str
    tls: bool
    values: dict[str, Any]


def versions() -> dict[str, str]:
    """The versions a run's numbers depend on."""
    import numpy
    import torch

    import flmesh

    return {"flmesh": flmesh.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}


def device_of(federation: Federation) -> str:
    """The device ``[training] device`` picks on this machine (``"cpu"``, ``"cuda:0"``, ...)."""
    from flmesh.learning.device import select_device

    return str(select_device(federation.training.device))


def _torch_threads() -> int:
    """torch's intra-op threads in this process (a run's speed depends on them)."""
    import torch

    return torch.get_num_threads()


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def write_record(folder: Path, federation: Federation, *, writer: str, command: Sequence[str] | None,
                 transport: str, tls: bool, node: str | None = None, code: str | None = None) -> None:
    """Write ``folder``/federation.toml and ``folder``/run.json (atomically). ``writer``:
    "fl-sim", "simulation" (from Python), "fl-node" or "aggregator"; ``command``: the command
    line (None from Python); ``node``: fl-node's id; ``code``: what the run's model and learner
    were, when they were given as Python objects rather than named by the file (such a run
    cannot be repeated from the folder). Blocks."""
    base = os.path.relpath(federation.base_dir or Path.cwd(), folder.resolve())
    text = toml_text(federation.raw or {})
    again = f"fl-sim rerun {folder}" if writer in ("fl-sim", "simulation") and code is None else None
    header = (f"# The effective federation file of a run (after --set). Relative paths resolve "
              f"against {base} (from this folder).\n" + (f"# Repeat it: {again}\n" if again else "") + "\n")
    write_atomic(folder / FEDERATION_FILE, header + text)
    record = {"writer": writer, **({"node": node} if node is not None else {}),
              "command": list(command) if command is not None else None, "file": federation.source,
              "base_dir": base, "federation": FEDERATION_FILE, "federation_sha256": _digest(header + text),
              "seed": federation.seed, "transport": transport, "tls": tls, "python_code": code,
              "device": device_of(federation), "threads": _torch_threads(), "versions": versions(),
              "platform": platform.platform(), "started": _now(), "resumed": []}
    write_atomic(folder / RUN_FILE, json.dumps(record, indent=2) + "\n")


def note_resume(folder: Path, after: int, command: Sequence[str] | None) -> None:
    """Add a resume (after round ``after``, by ``command``; None from Python) to
    ``folder``/run.json, when the folder has one."""
    path = folder / RUN_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # a folder of an older version, or none: nothing to add to
    if not isinstance(record, dict):
        return
    record.setdefault("resumed", []).append(
        {"after_round": after, "command": list(command) if command is not None else None,
         "versions": versions(), "at": _now()})
    write_atomic(path, json.dumps(record, indent=2) + "\n")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_record(folder: Path) -> RunRecord:
    """The record in ``folder``. Raises RecordError (one line) when it has none, when a file
    cannot be read, when fl-sim cannot repeat the run (an fl-node or aggregator folder, a
    model or learner given in Python) or when federation.toml is not the file the run started
    with."""
    path, toml_path = folder / RUN_FILE, folder / FEDERATION_FILE
    if not folder.is_dir():
        raise RecordError(f"{folder}: no such run folder")
    if not path.is_file() or not toml_path.is_file():
        raise RecordError(f"{folder}: not an fl-sim run folder (no {RUN_FILE} and {FEDERATION_FILE})")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        text = toml_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(values, dict) or not {"base_dir", "transport", "tls"} <= values.keys():
        raise RecordError(f"{path}: not an fl-sim run record")
    writer = values.get("writer", "fl-sim")
    if writer not in ("fl-sim", "simulation"):
        raise RecordError(f"{path}: a run {writer} wrote; fl-sim repeats and resumes its own runs and "
                          "Simulation's (start the fl-node processes again instead)")
    if values.get("python_code"):
        raise RecordError(f"{path}: the run's {values['python_code']} came as Python objects, which the "
                          "folder cannot hold; run it again from Python")
    transport = values["transport"]
    if not isinstance(transport, str) or transport not in registry.transports.names():
        raise RecordError(f"{path}: unknown transport {values['transport']!r}")
    if _digest(text) != values.get("federation_sha256"):
        raise RecordError(f"{toml_path}: differs from the federation file the run started with "
                          "(edited since?); run it as a new federation instead")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecordError(f"{toml_path}: not valid TOML: {exc}") from None
    base = values["base_dir"]
    if not isinstance(base, str):
        raise RecordError(f"{path}: base_dir is a {type(base).__name__}, not a path")
    federation = parse_federation(raw, source=str(toml_path), base_dir=(folder / base).resolve())
    return RunRecord(folder, federation, transport, bool(values["tls"]), values)


def same_federation(a: Federation, b: Federation) -> bool:
    """Whether two federations were read from the same effective file (keys and values)."""
    return toml_text(a.raw or {}) == toml_text(b.raw or {})


def host(federation: Federation) -> dict[str, Any]:
    """Where a run ran: the versions its numbers depend on, the device, the CPU threads."""
    import torch

    return {**versions(), "device": device_of(federation), "cpus": torch.get_num_threads()}


def partition_text(federation: Federation) -> str:
    """How the data set is split across nodes, with the parameter that kind reads:
    ``dirichlet(alpha=0.25)``, ``shards(2 per node)``, ``iid``."""
    data = federation.data
    if data.partition == "iid":
        return "iid"
    if data.partition == "shards":
        return f"shards({data.shards_per_node} per node)"
    return f"{data.partition}(alpha={data.alpha:g})"


def _own_files(federation: Federation) -> dict[str, str]:
    """The nodes that train on their own ``[nodes.<id>] data``, and the file, relative to the
    federation file's folder when it is below it."""
    base = Path(federation.base_dir) if federation.base_dir else None
    out = {}
    for node in federation.nodes:
        if node.data is not None:
            path = Path(node.data)
            out[node.id] = str(path.relative_to(base)) if base and path.is_relative_to(base) else str(path)
    return out


def data_text(federation: Federation, given: str | None = None) -> str:
    """What the nodes train on, in a few words (a run's title); ``given``: what data given in
    Python was, instead of the file's (:attr:`flmesh.learning.task.Task.data`)."""
    own = _own_files(federation)
    if len(own) == len(federation.nodes):
        return "each node's own data file"
    text = f"{given or federation.data.origin} {partition_text(federation)}"
    if own:
        names = list(own)
        text += f" (own files: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    return text


def data_config(federation: Federation, given: str | None = None) -> dict[str, Any]:
    """What the nodes train on, for a summary's ``config``: ``dataset`` (``given``: what data
    given in Python was) and ``partition`` (None when every node has its own file), and
    ``own_data`` (node -> file) when some do."""
    own = _own_files(federation)
    if own and len(own) == len(federation.nodes):
        return {"dataset": None, "partition": None, "own_data": own}
    data = federation.data
    partition: dict[str, Any] = {"kind": data.partition}
    if data.partition == "shards":
        partition["shards_per_node"] = data.shards_per_node
    elif data.partition != "iid":
        partition["alpha"] = data.alpha
    return {"dataset": given or data.origin, "partition": partition, **({"own_data": own} if own else {})}


def base_config(federation: Federation, model: str | None = None, data: str | None = None) -> dict[str, Any]:
    """What every summary says about the set-up; ``model``: what builds the model (default: the
    file's ``[model]``); ``data``: what data given in Python was (default: the file's)."""
    fed = federation
    return {"nodes": fed.node_ids, **data_config(fed, data),
            "model": model or fed.model.label,
            "objective": fed.training.objective,
            "rewind": {"mode": fed.rewind.mode, "lambda": fed.rewind.lam},
            "epochs": fed.training.epochs}


def sim_config(federation: Federation, transport: str, tls: bool, model: str | None = None,
               data: str | None = None) -> dict[str, Any]:
    """The set-up every summary records, with the transport the run used."""
    return {**base_config(federation, model, data), "transport": transport, "tls": tls}
