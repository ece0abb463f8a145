"""fl-sim's picture helper: the pictures it draws are this process's, and nothing is lost
when it cannot draw them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flmesh.coordinator.picture_helper import PictureHelper
from flmesh.coordinator.pictures import draw

from conftest import wait_until

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


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_helper_reads_the_rows_from_rounds_jsonl_and_checks_their_count(tmp_path):
    """fl-sim names its rounds.jsonl instead of sending the rows, and the helper draws what the
    file holds; a file that holds another number of rows is not used (this process draws the
    rows it has)."""
    rows = peer_rows()
    in_file = [{**row, "fa": row["fa"] / 2} for row in rows]  # the same count, other numbers
    cases = {"file": (in_file, in_file), "other": (rows[:2], rows)}  # what the file holds, drawn
    for name, (held, expected) in cases.items():
        (tmp_path / name).mkdir()
        helper = PictureHelper.launch()
        assert helper._proc is not None
        if name == "other":
            # The kernel fills /proc/<pid>/environ a moment after Popen returns (the exec has
            # closed Popen's pipe but not yet set the new stack's environment): wait for it.
            environ_file = Path(f"/proc/{helper._proc.pid}/environ")
            wait_until(lambda f=environ_file: f.read_bytes() != b"")
            environ = environ_file.read_text().split("\0")
            assert "OPENBLAS_NUM_THREADS=1" in environ  # one BLAS thread, whatever fl-sim has
        drawn = helper.draw(rows, tmp_path / name, write_rows(tmp_path / f"{name}.jsonl", held))
        assert [p.name for p in drawn] == NAMES
        (tmp_path / f"{name}-here").mkdir()
        here = draw(expected, tmp_path / f"{name}-here")
        for a, b in zip(drawn, here, strict=True):
            assert a.read_bytes() == b.read_bytes()
    assert (tmp_path / "file" / NAMES[0]).read_bytes() != (tmp_path / "other" / NAMES[0]).read_bytes()


def test_read_rows_takes_a_finished_file_and_refuses_another_count(tmp_path):
    from flmesh.coordinator.picture_helper import read_rows

    path = write_rows(tmp_path / "rounds.jsonl", peer_rows(3))
    assert read_rows(path, 3) == peer_rows(3)
    with pytest.raises(ValueError, match="holds 3 rows, not the run's 4"):
        read_rows(path, 4)


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
    third = PictureHelper.launch()
    proc = third._proc
    assert third.draw([], Path("/nonexistent")) == []  # a run without rows: no pictures, no helper left
    assert proc is not None and proc.poll() is not None


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


def test_fl_sim_no_pictures_draws_none_and_starts_no_helper(tmp_path, monkeypatch, capsys):
    """--no-pictures: no helper process, no picture, the summary lists none; fl-sim report draws
    them from the rows later."""
    from flmesh.coordinator.sim_cli import main

    def no_helper():
        raise AssertionError("a picture helper was started")

    monkeypatch.setattr(PictureHelper, "start", no_helper)
    fed = tmp_path / "fed.toml"
    fed.write_text('[federation]\nname = "p"\nrounds = 2\n[topology]\nnodes = 3\n[model]\nhidden = [16]\n')
    out = tmp_path / "run"
    assert main([str(fed), "--out", str(out), "--quiet", "--workers", "1", "--no-pictures"]) == 0
    assert not list(out.glob("*.png"))
    assert json.loads((out / "summary.json").read_text())["pictures"] == []
    assert "".join(capsys.readouterr().out.split()).endswith("summary.json,rounds.jsonl")  # rich wraps
    assert main(["report", str(out)]) == 0
    assert all((out / n).stat().st_size > 0 for n in NAMES)


def test_fl_sim_with_matplotlib_loaded_draws_in_process():
    import matplotlib.figure  # noqa: F401  (what a test process or an embedder may have loaded)

    assert PictureHelper.start()._proc is None


def test_picture_helper_module_runs_as_a_script():
    """``python -m flmesh.coordinator.picture_helper`` is the helper; an empty stdin ends it."""
    done = subprocess.run([sys.executable, "-m", "flmesh.coordinator.picture_helper"], input="",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == ""


def star_rows(rounds: int = 4) -> list[dict]:
    return [{**row, "kind": "star", "accuracy": 0.11 * row["round"],
             "nodes": {f"node{i}": {"local_forgetting": 0.01 * i} for i in range(3)}}
            for row in peer_rows(rounds)]


IN_TWO = """
import json, sys
from pathlib import Path
from flmesh.coordinator.picture_helper import draw_in_two
try:
    print(json.dumps([str(p) for p in draw_in_two(json.loads(sys.argv[1]), Path(sys.argv[2]))]))
except RuntimeError as exc:
    print("error:", exc)
"""


def in_two(rows: list[dict], out: Path) -> str:
    """draw_in_two in a fresh interpreter: single-threaded, as the helper that forks is."""
    done = subprocess.run([sys.executable, "-c", IN_TWO, json.dumps(rows), str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_helper_draws_the_later_pictures_in_a_fork_at_the_same_time(tmp_path):
    """A star run's three pictures, two in the helper and the last in its fork: the files this
    process draws alone."""
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    two = [Path(p) for p in json.loads(in_two(star_rows(), tmp_path / "two"))]
    one = draw(star_rows(), tmp_path / "one")
    assert [p.name for p in two] == [p.name for p in one] == [*NAMES, "local_forgetting.png"]
    for a, b in zip(two, one, strict=True):
        assert a.read_bytes() == b.read_bytes()


def test_a_picture_the_fork_cannot_draw_is_an_error_of_the_helper(tmp_path):
    rows = star_rows()
    rows[1]["nodes"] = {}  # the node-forgetting picture (the fork's) reads every row's nodes
    said = in_two(rows, tmp_path)
    assert said.startswith("error: KeyError") and "node0" in said
    assert (tmp_path / "accuracy.png").exists()  # what the helper drew itself is there


def test_pictures_that_cannot_be_drawn_are_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    """A full disk, say, where the pictures go: the rows and the summary are written, and
    fl-sim says so in one line instead of a traceback, exit 1."""
    from flmesh.coordinator import pictures
    from flmesh.coordinator.sim_cli import main

    def full(rows, out_dir):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pictures, "draw", full)
    monkeypatch.setattr(PictureHelper, "start", classmethod(lambda cls: cls(None)))
    fed = tmp_path / "fed.toml"
    fed.write_text('[federation]\nname = "p"\nrounds = 2\n[topology]\nnodes = 3\n[model]\nhidden = [16]\n')
    out = tmp_path / "run"
    assert main([str(fed), "--out", str(out), "--quiet", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"fl-sim: error: cannot draw the pictures in {out}: OSError: [Errno 28] No space left "
                     "on device"], err
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 2


def test_a_helper_that_never_answers_is_ended_and_the_pictures_drawn_here(tmp_path, monkeypatch):
    from flmesh.coordinator import picture_helper

    monkeypatch.setattr(picture_helper, "DRAW_TIMEOUT_S", 0.2)
    mute = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    helper = PictureHelper(mute)
    assert [p.name for p in helper.draw(peer_rows(), tmp_path)] == NAMES
    assert mute.poll() is not None  # ended, not left behind


FORKED = """
import json, os, sys, threading, time
from pathlib import Path
from flmesh.coordinator import picture_helper
rows, out, what = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if what == "thread":  # another thread running: launch, never fork
    stop = threading.Event()
    threading.Thread(target=stop.wait).start()
    print(picture_helper.may_fork()); stop.set(); sys.exit(0)
helper = picture_helper.PictureHelper.start()
proc = helper._proc
deadline = time.monotonic() + 60  # the fork names itself as it starts: poll for it
comm = Path(f"/proc/{proc.pid}/comm")
while (name := comm.read_text().strip()) != "flmesh-pictures" and time.monotonic() < deadline:
    time.sleep(0.01)
print(type(proc).__name__, "numpy" in sys.modules, "matplotlib" in sys.modules, name)
if what == "draw":
    paths = [str(p) for p in helper.draw(rows, out)]
    try:
        os.kill(proc.pid, 0)
        print(json.dumps(paths), "matplotlib" in sys.modules, "still there")
    except ProcessLookupError:
        print(json.dumps(paths), "matplotlib" in sys.modules, "gone")
else:  # what fl-sim's death does to the pipe: the fork reads its end and leaves
    proc.stdin.close()
    print(proc.wait())
"""


def forked(what: str, out: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", FORKED, json.dumps(peer_rows()), str(out), what],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_fresh_process_forks_its_helper_which_draws_the_same_pictures(tmp_path):
    (tmp_path / "fork").mkdir()
    (tmp_path / "here").mkdir()
    started, drawn = forked("draw", tmp_path / "fork")
    # numpy loaded for both; matplotlib only in the fork, which says what it is in ps
    assert started == "_Fork True False flmesh-pictures"
    paths, loaded, status = drawn.rsplit(" ", 2)
    assert loaded == "False", "the fork drew them, not this process"
    assert status == "gone", "the fork ended, and was reaped, once it drew"
    here = draw(peer_rows(), tmp_path / "here")
    assert [Path(p).name for p in json.loads(paths)] == NAMES
    for a, b in zip(json.loads(paths), here, strict=True):
        assert Path(a).read_bytes() == b.read_bytes()


def test_a_forked_helper_leaves_when_its_pipe_closes(tmp_path):
    assert forked("leave", tmp_path) == ["_Fork True False flmesh-pictures", "0"]


def test_a_process_with_threads_grpc_or_torch_launches_instead_of_forking(tmp_path):
    from flmesh.coordinator.picture_helper import may_fork

    assert not may_fork()  # this test process has torch and gRPC loaded
    assert forked("thread", tmp_path) == ["False"]
