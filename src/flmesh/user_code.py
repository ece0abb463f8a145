"""User code named by an import path, ``"package.module:name"``: a model factory, a data
source, an algorithm.

Import paths are code: they come only from the files and flags the operator writes (a
federation file, ``fl-node`` flags), never from the wire. Every way a path can be wrong
(not of the form ``module:name``, a module that is missing or raises on import, a missing
attribute, an object that is not callable) is one :class:`UserCodeError` line naming the
path and the problem; callers prefix the file and key.

User code may end in what is no ``Exception``: ``sys.exit()`` raises ``SystemExit``, which would
end the process with its code (0: success) and no word. Wherever flmesh calls user code (an
import, a factory, a source, a learner, a plug-in), it catches every ``BaseException`` but
``KeyboardInterrupt`` (Ctrl-C stays an interrupt) and turns it into its one-line error; one
raised mid-run (a learner's ``train``, a plug-in's half) ends fl-sim, fl-node and the
aggregator with exit 1 and :func:`exit_line`.
"""

from __future__ import annotations

import importlib
import re
import traceback
from typing import Any

#: ``package.module:attribute`` (the attribute may be dotted: ``module:Class.method``).
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class UserCodeError(ValueError):
    """An import path that does not lead to usable code (one line)."""


def is_import_path(value: str) -> bool:
    """Whether ``value`` has the form ``package.module:name`` (no import is tried)."""
    return bool(IMPORT_PATH.match(value))


def load_object(path: str) -> Any:
    """The object ``path`` (``package.module:name``) names. Imports the module: blocking, and
    it runs the module's top-level code. Raises :class:`UserCodeError`."""
    if not is_import_path(path):
        raise UserCodeError(f"{path!r} is not an import path of the form package.module:name")
    module_name, _, attribute = path.partition(":")
    failed = f"{path!r}: importing {module_name} failed"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UserCodeError(f"{path!r}: no module named {exc.name!r} "
                                "(is its package installed?)") from None
        raise UserCodeError(f"{failed}: {type(exc).__name__}: {exc}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's module raised (or called sys.exit) while it was imported
        raise UserCodeError(f"{failed}: {type(exc).__name__}: {exc}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UserCodeError(f"{path!r}: {module_name} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def load_callable(path: str) -> Any:
    """:func:`load_object`, and the object must be callable."""
    target = load_object(path)
    if not callable(target):
        raise UserCodeError(f"{path!r} is a {type(target).__name__}, not something to call")
    return target


def exit_line(exc: BaseException) -> str:
    """One line for ``exc``, a BaseException that is no Exception (``SystemExit`` from
    ``sys.exit``), which only user code raises once a run is under way: what it is and the
    innermost line it came from."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} (in {frames[-1].name})" if frames else ""
    text = " ".join(str(exc).split())
    return f"user code raised {type(exc).__name__}{': ' + text if text else ''}{where}"


__all__ = ["UserCodeError", "exit_line", "is_import_path", "load_callable", "load_object"]
