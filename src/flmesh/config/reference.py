"""The federation-file reference, written from the schema: every section and key, what it
accepts, its default and what it means.

``python -m flmesh.config.reference > docs/federation-file.md`` writes the page;
tests/test_federation_reference.py fails when the committed page differs from
:func:`reference_text`. What a key accepts is what its check says when it refuses a value
(:mod:`flmesh.config.checks`), its default is what :func:`~flmesh.config.parser.
parse_federation` makes of a file without it, and its meaning is
:data:`flmesh.config.schema.DESCRIPTIONS`: none of it is written twice. Pure, no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from flmesh.config.checks import Bad, Check
from flmesh.config.continual import REPLAY_KEYS, TASK_KEYS
from flmesh.config.federation import DevicesConfig, NetworkConfig, PeersConfig
from flmesh.config.parser import parse_federation
from flmesh.config.schema import DESCRIPTIONS, NODE_KEYS, REQUIRED, SECTIONS, TRAINING

#: A file with every optional section and none of its keys: what it parses to gives the defaults.
_BARE = {"federation": {"name": "reference", "rounds": 50}, "topology": {"nodes": 10},
         "aggregator": {}, "tasks": {}, "replay": {}}
#: Keys stored under another name than the file's.
_FIELD = {("rewind", "lambda"): "lam"}
#: Defaults that no field holds.
_OTHER = {("topology", "nodes"): "required without [nodes.<id>] tables",
          ("peers", "strategy"): "the schedule's (dpsgd for gossip and exponential, epidemic for epidemic)"}

HEADER = """\
# Federation file reference

Every section and key of the federation file, generated from the schema
(`flmesh.config.schema`) by `python -m flmesh.config.reference`; a test fails when
this page and the schema differ. "Accepts" is what the key's check asks for (a value
outside it stops the run with one line naming the file, the key and this text).
[docs/reliability.md](reliability.md) lists the bounds and their messages,
[docs/algorithms.md](algorithms.md) the strategies' `[aggregator.params]` and the
`[algorithm.NAME]` tables. `[nodes.<id>]` tables either list every node (any ids) or,
with `[topology] nodes = N`, override some of the generated `node0` .. `node<N-1>`.
"""


def accepts(check: Check) -> str:
    """What ``check`` accepts, in its own words: what it says when it refuses a value that is
    no value at all, and an infinite one (an upper bound's message)."""
    said: list[str] = []
    for probe in (object(), math.inf):
        try:
            check(probe)
        except Bad as bad:
            if str(bad) not in said:
                said.append(str(bad))
    if len(said) == 2:
        kind = said[0].split(" ")[:2]
        if said[1].split(" ")[:2] == kind:  # "a number > 0", "a number <= 10": one phrase
            said = [f"{said[0]}, {' '.join(said[1].split(' ')[2:])}"]
    return "; ".join(said)


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def _defaults() -> dict[str, Any]:
    """Section -> the object its keys' defaults are read from."""
    fed = parse_federation(_BARE, source="<reference>")
    return {"federation": fed, "rewind": fed.rewind, "aggregator": fed.aggregator, "wire": fed.wire,
            "topology": fed.topology, "training": fed.training, "data": fed.data, "model": fed.model,
            "tasks": fed.tasks, "replay": fed.replay, "peers": fed.peers or PeersConfig(),
            "devices": DevicesConfig(), "network": NetworkConfig()}


def _default(holders: Mapping[str, Any], section: str, key: str) -> str:
    if key in REQUIRED.get(section, ()):
        return "required"
    if (section, key) in _OTHER:
        return _OTHER[(section, key)]
    if section == "nodes.<id>":
        if key in TRAINING:
            return "[training]'s"
        if key in ("speed", "bandwidth_mbps", "latency_ms"):
            return "[devices]'s" if key == "speed" else "[network]'s"
        return "the node's position" if key == "partition" else "unset"
    if (section, key) == ("peers", "wait"):
        return '"all"'
    name = _FIELD.get((section, key), key)
    holder = holders[section]
    if not hasattr(holder, name):  # a deprecated key, read into another table
        return "unset"
    return _shown(getattr(holder, name))


def _cell(text: str) -> str:
    # "|" would end the cell, "<id>" would be read as an HTML tag and vanish
    return re.sub(r"<(?=[A-Za-z/])", "&lt;", text.replace("|", "\\|"))


def reference_text() -> str:
    """The whole page, Markdown, ending in one newline. Raises KeyError when a key of the
    schema has no line in :data:`~flmesh.config.schema.DESCRIPTIONS`, ValueError when a line
    names no key of the schema."""
    sections: dict[str, Mapping[str, Check]] = {**SECTIONS, "tasks": TASK_KEYS, "replay": REPLAY_KEYS,
                                                "nodes.<id>": NODE_KEYS}
    for section, lines in DESCRIPTIONS.items():
        extra = sorted(set(lines) - set(sections.get(section, {})))
        if extra:
            raise ValueError(f"DESCRIPTIONS[{section!r}] describes {extra}, which the schema lacks")
    holders = _defaults()
    out = [HEADER]
    for section, checks in sections.items():
        out.append(f"\n## [{_cell(section)}]\n\n| key | accepts | default | meaning |\n|---|---|---|---|\n")
        for key, check in checks.items():
            meaning = DESCRIPTIONS[section][key]
            out.append(f"| `{key}` | {_cell(accepts(check))} | {_cell(_default(holders, section, key))} "
                       f"| {_cell(meaning)} |\n")
    return "".join(out)


if __name__ == "__main__":
    print(reference_text(), end="")
