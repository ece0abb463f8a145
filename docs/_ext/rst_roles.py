"""A Griffe extension for docs/api.md: flmesh's docstrings speak reStructuredText, the site
Markdown.

The docstrings name other objects with Sphinx roles (``:class:`~flmesh.x.Learner```) and
end a line with ``::`` before a literal block. mkdocstrings renders Markdown, where both
would show as typed; this turns a role into a code span of the name as Sphinx would show
it (the last part after ``~``) and ``::`` into ``:``. Docstrings keep their source form.
mkdocs.yml loads it (``extensions``); it runs only while the site is built.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")
LITERAL = re.compile(r"(\S)::$", re.MULTILINE)


def markdown(text: str) -> str:
    """``text`` with Sphinx roles as code spans and literal-block markers as colons."""

    def role(match: re.Match[str]) -> str:
        short, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return LITERAL.sub(r"\1:", ROLE.sub(role, text))


class RstRoles(griffe.Extension):
    """Rewrites every docstring as it is loaded (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
