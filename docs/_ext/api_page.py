"""Write docs/api.md, the API reference, from the public API's signatures and docstrings.

``python docs/_ext/api_page.py > docs/api.md`` writes the page; tests/test_docs_build.py fails
when the committed page is not what this prints, so a changed signature or docstring shows up
in the diff of the page too. The page is plain Markdown: it reads the same on a forge, in an
editor and on the mkdocs site.

The docstrings speak reStructuredText: a Sphinx role (``:class:`~flmesh.x.Learner```) becomes
a code span of the name as Sphinx would show it, a double-backquoted literal a code span, and
a line that ends in ``::`` before an indented block a colon before a fenced Python block.
Blocking: imports flmesh (and torch).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

import flmesh
import flmesh.testing

#: The page's sections: a heading and the public names under it, in order.
SECTIONS: list[tuple[str, list[str]]] = [
    ("Federations", ["load_federation", "Federation", "FederationError"]),
    ("Running a federation", ["Simulation", "Node", "load_tls_identity"]),
    ("Training", ["Learner", "TrainContext", "EvalContext", "register_model"]),
    ("Data", ["ArrayData", "NodeData"]),
    ("Writing an algorithm", ["Algorithm", "ClientHalf", "ServerHalf", "ClientContext", "ServerContext",
                              "Update", "RemotePhase", "Param", "register_algorithm"]),
    ("Writing a schedule", ["Schedule", "Hop", "Neighbours", "register_schedule"]),
]

HEADER = """\
# API reference

The public API of flmesh: the names `import flmesh` exports, and `flmesh.testing`.
Everything else is internal and may change between versions. This page is written from
the docstrings by `python docs/_ext/api_page.py > docs/api.md` (a test keeps it current);
[custom.md](custom.md) shows the pieces at work, [algorithms.md](algorithms.md) a whole
plug-in.
"""

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")


def markdown(doc: str) -> str:
    """A docstring, reStructuredText as flmesh writes it, as Markdown (see the module's)."""

    def role(match: re.Match[str]) -> str:
        short, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    text = LITERAL.sub(r"`\1`", ROLE.sub(role, doc))
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and i + 1 < len(lines) and not lines[i + 1].strip():
            head = line.rstrip()[:-1]
            out.append(head if head.strip() else "")
            block: list[str] = []
            i += 2
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```python", *textwrap.dedent("\n".join(block)).splitlines(), "```", ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip()


def doc_of(obj: Any) -> str:
    """``obj``'s own docstring (not one a class inherits, nor one a dataclass writes)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    name = getattr(obj, "__name__", "")
    if not doc or doc.startswith(f"{name}("):
        return ""
    return inspect.cleandoc(doc)


QUOTED = re.compile(r"(: |-> )'([^']*)'")
#: A default's repr with a memory address (``<function f at 0x7f...>``, ``<a.B object at 0x...>``):
#: the function's name, or the class's instance, so the page is the same from run to run.
ADDRESS = re.compile(r"<(?:function ([\w.]+)|([\w.]+) object) at 0x[0-9a-f]+>")


def stable(text: str) -> str:
    return ADDRESS.sub(lambda m: m.group(1) or f"{m.group(2).rsplit('.', 1)[-1]}()", text)


def signature(name: str, obj: Callable[..., Any], prefix: str = "def") -> str:
    """``prefix name(parameters) -> returns``, one parameter a line when it is long; the
    annotations as written (``from __future__ import annotations`` keeps them as strings)."""
    try:
        sig = stable(QUOTED.sub(r"\1\2", str(inspect.signature(obj))))
    except (TypeError, ValueError):
        sig = "(...)"
    one = f"{prefix} {name}{sig}"
    if len(one) <= 100:
        return one
    params = sig[1:sig.rindex(")")]
    rest = sig[sig.rindex(")") + 1:]
    parts = _split(params)
    return f"{prefix} {name}(\n" + "".join(f"    {p},\n" for p in parts) + f"){rest}"


def _split(params: str) -> list[str]:
    """Top-level comma-separated parts of a parameter list."""
    parts, depth, current = [], 0, ""
    for ch in params:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def code(text: str) -> str:
    return f"```python\n{text}\n```\n"


def members(cls: type) -> list[tuple[str, Any]]:
    """A class's public methods and properties of its own, in source order."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property | classmethod | staticmethod) or inspect.isfunction(value):
            out.append((name, value))
    return out


def render_member(owner: str, name: str, value: Any) -> str:
    if isinstance(value, property):
        target = value.fget
        head = f"{owner}.{name} (property)"
        try:
            returned = inspect.signature(target).return_annotation if target else inspect.Signature.empty
        except (TypeError, ValueError):
            returned = inspect.Signature.empty
        sig = code(f"{name}: {returned}") if returned is not inspect.Signature.empty else ""
    else:
        target = value.__func__ if isinstance(value, classmethod | staticmethod) else value
        kind = "classmethod" if isinstance(value, classmethod) else "method"
        head = f"{owner}.{name} ({kind})" if kind == "classmethod" else f"{owner}.{name}"
        sig = code(signature(name, target))
    doc = markdown(doc_of(target)) if target is not None else ""
    return f"#### {head}\n\n{sig}" + (f"\n{doc}\n" if doc else "")


def render(name: str, obj: Any, qualified: str) -> str:
    parts = [f"### {name}\n\n<a id=\"{qualified}\"></a>\n"]
    if isinstance(obj, type):
        fields = dataclasses.fields(obj) if dataclasses.is_dataclass(obj) else ()
        if issubclass(obj, BaseException) or fields:  # a dataclass's fields are the table below
            bases = [b.__name__ for b in obj.__bases__ if b is not object]
            parts.append(code(f"class {name}" + (f"({', '.join(bases)})" if bases else "")))
        else:
            parts.append(code(signature(name, obj, "class")))
        doc = markdown(doc_of(obj))
        if doc:
            parts.append(f"\n{doc}\n")
        if fields:
            rows = "".join(f"| `{f.name}` | `{_cell(_type(f.type))}` | {_cell(_default(f))} |\n"
                           for f in fields if not f.name.startswith("_"))
            parts.append(f"\n| field | type | default |\n|---|---|---|\n{rows}")
        for member, value in members(obj):
            parts.append("\n" + render_member(name, member, value))
    else:
        parts.append(code(signature(name, obj)))
        doc = markdown(doc_of(obj))
        if doc:
            parts.append(f"\n{doc}\n")
    return "".join(parts)


def _type(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a table cell ends at a bare "|", code span or not


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{stable(repr(field.default))}`"
    if field.default_factory is not dataclasses.MISSING:
        return "(made per instance)"
    return "required"


def page() -> str:
    """The whole page, Markdown, ending in one newline."""
    out = [HEADER, "\n" + markdown(doc_of(flmesh)) + "\n"]
    listed = {n for _, names in SECTIONS for n in names}
    missing = sorted(set(flmesh.__all__) - listed - {"__version__"})
    if missing:
        raise ValueError(f"public names without a section: {missing}")
    for heading, names in SECTIONS:
        out.append(f"\n## {heading}\n")
        for name in names:
            out.append("\n" + render(name, getattr(flmesh, name), f"flmesh.{name}"))
    testing = flmesh.testing
    out.append("\n## Testing: `flmesh.testing`\n\n<a id=\"flmesh.testing\"></a>\n\n"
               + markdown(doc_of(testing)) + "\n")
    for name in testing.__all__:
        out.append("\n" + render(name, getattr(testing, name), f"flmesh.testing.{name}"))
    return "".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(page(), end="")
