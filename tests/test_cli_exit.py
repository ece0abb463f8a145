"""fl-sim's and fl-node's console entry points: the exit code is ``main``'s, through
``sys.exit``, and nothing an exit writes is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def entry(module: str, env: dict[str, str], stderr: int) -> subprocess.Popen[str]:
    """``module``'s console entry point in a child, its ``main`` replaced by :data:`EXITING`'s."""
    script = (f"import atexit, os, sys, {module} as m\n{EXITING}\n"
              "m.main = main\nm.entry()\nprint('never here')\n")
    return subprocess.Popen([sys.executable, "-c", script], text=True, env=env, stdout=subprocess.PIPE,
                            stderr=stderr)


MODULES = ["flmesh.cli.fl_sim", "flmesh.cli.fl_node"]

EXITING = """
def main():
    atexit.register(lambda: sys.stderr.write("exit handler ran"))
    sys.stdout.write("buffered, no newline")
    return int(os.environ["CODE"])
"""


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("code", [0, 1, 2, 130])
def test_an_entry_point_exits_with_mains_code_after_the_exit_handlers_and_buffered_output(module, code):
    proc = entry(module, {**os.environ, "CODE": str(code)}, subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code
    assert out == "buffered, no newline" and err.endswith("exit handler ran")


@pytest.mark.parametrize("module", MODULES)
def test_output_that_no_pipe_takes_is_exit_120_not_0(module):
    """The reader is gone before the child writes, and its stdout is buffered (no
    PYTHONUNBUFFERED): the interpreter's own exit says 120."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = entry(module, {**env, "CODE": "0"}, subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.close()
    assert proc.wait(timeout=120) == 120


def test_fl_sim_and_fl_node_are_installed_as_their_entry_points():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fl-sim"] == "flmesh.cli.fl_sim:entry"
    assert scripts["fl-node"] == "flmesh.cli.fl_node:entry"
    assert (Path(sys.executable).parent / "fl-sim").read_text().count("entry") >= 2


@pytest.mark.parametrize("module", ["flmesh.cli.fl_sim", "flmesh.cli.fl_node"])
@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("3", "3")])
def test_fl_sim_and_fl_node_give_numpy_one_blas_thread_unless_the_user_chose(module, given, seen):
    """``cli_common.one_blas_thread``: set by the entry point, before main imports numpy."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    script = (f"import os, sys, {module} as m\n"
              "m.main = lambda: print(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules) or 0\n"
              "m.entry()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [seen, "False"]
