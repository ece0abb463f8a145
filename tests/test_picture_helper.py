"""fl-sim's picture helper: the pictures it draws are this process's, and nothing is lost
when it cannot draw them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flmesh.coordinator.picture_helper import PictureHelper
from flmesh.coordinator.pictures import draw

NAMES = ["accuracy.png", "per_class.png"]


def peer_rows(rounds: int = 4) -> list[dict]:
    return [{"round": t, "kind": "peer", "fa": 0.1 * t, "ff": 0.02, "pfa": 0.12 * t,
             "per_class_accuracy": [0.1 * t] * 9 + [None], "nodes": {}} for t in range(1, rounds + 1)]


def test_the_helper_draws_the_pictures_this_process_would_and_leaves(tmp_path):
    helper = PictureHelper.launch()
    proc = helper._proc
    assert proc is not None
    (tmp_path / "helper").mkdir()
    (tmp_path / "here").mkdir()
    drawn = helper.draw(peer_rows(), tmp_path / "helper")
    assert [p.name for p in drawn] == NAMES
    assert proc.poll() is not None  # ended once it drew
    here = draw(peer_rows(), tmp_path / "here")
    for a, b in zip(drawn, here, strict=True):
        assert a.read_bytes() == b.read_bytes()


def test_a_helper_that_died_leaves_the_pictures_to_this_process(tmp_path):
    helper = PictureHelper.launch()
    assert helper._proc is not None
    helper._proc.kill()
    helper._proc.wait()
    assert [p.name for p in helper.draw(peer_rows(), tmp_path)] == NAMES
    assert all((tmp_path / n).stat().st_size > 0 for n in NAMES)


def test_rows_the_helper_cannot_draw_raise_this_process_error(tmp_path):
    """The helper answers with an error; this process draws and raises the same error itself,
    as fl-sim did before the helper (the run exits non-zero)."""
    helper = PictureHelper.launch()
    proc = helper._proc
    with pytest.raises(KeyError, match="pfa"):
        helper.draw([{"round": 1, "kind": "peer", "fa": 0.5}], tmp_path)
    assert proc is not None and proc.poll() is not None


def test_a_helper_leaves_when_fl_sim_goes_and_close_ends_it():
    helper = PictureHelper.launch()
    proc = helper._proc
    assert proc is not None and proc.stdin is not None
    proc.stdin.close()  # what fl-sim's death does to the pipe
    assert proc.wait(timeout=60) == 0
    other = PictureHelper.launch()
    assert other._proc is not None
    other.close()
    assert other._proc is None and helper._proc is not None
    other.close()  # idempotent


def test_fl_sim_draws_its_pictures_without_importing_matplotlib(tmp_path):
    """A fresh fl-sim (a process with nothing loaded) leaves matplotlib to the helper."""
    fed = tmp_path / "fed.toml"
    fed.write_text('[federation]\nname = "p"\nrounds = 2\n[topology]\nnodes = 3\n[model]\nhidden = [16]\n')
    out = tmp_path / "run"
    script = ("import sys; from flmesh.coordinator.sim_cli import main; "
              f"rc = main([{str(fed)!r}, '--out', {str(out)!r}, '--quiet']); "
              "print('matplotlib' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert all((out / n).stat().st_size > 0 for n in NAMES)


def test_fl_sim_with_matplotlib_loaded_draws_in_process():
    import matplotlib.figure  # noqa: F401  (what a test process or an embedder may have loaded)

    assert PictureHelper.start()._proc is None


def test_picture_helper_module_runs_as_a_script():
    """``python -m flmesh.coordinator.picture_helper`` is the helper; an empty stdin ends it."""
    done = subprocess.run([sys.executable, "-m", "flmesh.coordinator.picture_helper"], input="",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == ""
