"""The package as users install it: a wheel built from this tree, installed into a fresh venv,
runs ``fl-sim --version`` and a two-round federation. A module, data file or entry point left
out of the wheel fails here, which the editable install of the test venv would hide.

The fresh venv takes torch and the other dependencies from this environment (a ``.pth``
line to its site-packages), so nothing is downloaded; flmesh itself comes only from the
wheel (a directory named in a ``.pth`` line is not scanned for ``.pth`` files, so the
editable install of this environment stays invisible there)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def test_a_wheel_installs_and_runs_a_federation(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(REPO)], check=True, timeout=600)
    wheel = next(dist.glob("flmesh-*.whl"))
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "zz_dependencies.pth").write_text(here + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=600)

    where = subprocess.run([str(python), "-c", "import flmesh.runtime, json; print(flmesh.runtime.__file__)"],
                           check=True, capture_output=True, text=True).stdout.strip()
    assert where.startswith(purelib), f"flmesh came from {where}, not the wheel"
    version = subprocess.run([str(env / "bin" / "fl-sim"), "--version"], check=True, capture_output=True,
                             text=True, timeout=120).stdout
    assert version.startswith("fl-sim ")
    out = tmp_path / "run"
    subprocess.run([str(env / "bin" / "fl-sim"), str(REPO / "examples" / "quickstart.toml"), "--rounds", "2",
                    "--out", str(out), "--quiet", "--no-pictures"], check=True, timeout=600, cwd=tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["final"]["fa"] is not None
