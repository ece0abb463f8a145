"""fl-sim's and fl-node's quick exit (``cli_common.exit_after``): the exit code, and nothing a
normal exit writes is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import atexit, logging, sys
from pathlib import Path
from flmesh.node.cli_common import exit_after

folder = Path(sys.argv[1])
atexit.register(lambda: (folder / "atexit").write_text("ran"))
log = logging.getLogger("child")
log.addHandler(logging.FileHandler(folder / "child.log", delay=False))
log.setLevel(logging.INFO)

def main():
    log.info("logged before the exit")
    sys.stdout.write("buffered, no newline")  # a pipe: block-buffered, flushed by nobody else
    sys.stderr.write("stderr too")
    if sys.argv[2] == "raise":
        raise RuntimeError("a bug in main")
    return int(sys.argv[2])

exit_after(main)
print("never here")
"""


def child(tmp_path: Path, outcome: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), outcome], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("code", [0, 1, 2, 130])
def test_a_quick_exit_keeps_the_code_the_exit_handlers_the_log_and_the_buffered_output(tmp_path, code):
    out = child(tmp_path, str(code))
    assert out.returncode == code
    assert out.stdout == "buffered, no newline" and out.stderr == "stderr too"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "child.log").read_text() == "logged before the exit\n"


def test_an_exception_from_main_takes_the_ordinary_way_out(tmp_path):
    out = child(tmp_path, "raise")
    assert out.returncode == 1
    assert "RuntimeError: a bug in main" in out.stderr and "never here" not in out.stdout
    assert (tmp_path / "atexit").read_text() == "ran"


def test_output_that_no_pipe_takes_is_exit_120_not_0(tmp_path):
    """The reader is gone before the child writes, and its stdout is buffered (no
    PYTHONUNBUFFERED), so the exit's flush is what fails: Python's own exit would say 120."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    proc.stdout.close()
    assert proc.wait(timeout=120) == 120
    assert (tmp_path / "atexit").read_text() == "ran"


def test_fl_sim_and_fl_node_are_installed_with_the_quick_exit():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fl-sim"] == "flmesh.coordinator.sim_cli:entry"
    assert scripts["fl-node"] == "flmesh.coordinator.node_entry:entry"
    assert (Path(sys.executable).parent / "fl-sim").read_text().count("entry") >= 2


@pytest.mark.parametrize("module", ["flmesh.coordinator.sim_cli", "flmesh.coordinator.node_entry"])
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
