"""A helper process that draws a run's pictures, so fl-sim itself never imports matplotlib.

matplotlib's import is ~0.45 s of Python. fl-sim used to run it on a thread beside the
rounds, where it held fl-sim's GIL and made the aggregator's and the workers' calls wait:
in a timeline of the FedAvg job of ``benchmarks/overhead.py`` the three rounds it ran
beside took ~0.3 s longer. :meth:`PictureHelper.start` starts the helper as fl-sim starts:
on Linux a fork of fl-sim taken before any thread, gRPC or torch (:meth:`PictureHelper.fork`:
no interpreter start-up, numpy already loaded), elsewhere a fresh interpreter
(``python -m flmesh.coordinator.picture_helper``, :meth:`PictureHelper.launch`). It imports
matplotlib on the core that fl-sim's own import of torch leaves idle, then waits. At the end,
:meth:`PictureHelper.draw` sends it the rows, or only the path of the rounds.jsonl that holds
them (one JSON line), and it answers with the pictures' paths (one JSON line): the pictures of
:func:`~flmesh.coordinator.pictures.draw`, the same files, drawn two at a time
(:func:`draw_in_two`).

Nothing is lost when the helper cannot help: if it did not start, died, hangs, or could not
import or draw, :meth:`PictureHelper.draw` draws in this process instead, which either
works or raises its own error as before. The helper is in its own session (Ctrl-C in the
terminal, which reaches fl-sim's whole process group, does not kill it before it has drawn
an interrupted run's pictures) and leaves when its stdin closes, so it never outlives
fl-sim; :meth:`PictureHelper.close` ends it at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

#: How long (s) the helper may take to answer before fl-sim ends it and draws itself: far more
#: than it needs (0.1-0.3 s for a run of 40 rounds), so only a helper that hangs meets it.
DRAW_TIMEOUT_S = 300.0

#: The forked helper's process name (``/proc/PID/comm``; at most 15 characters).
FORK_NAME = "flmesh-pictures"


class _Process(Protocol):
    """What :class:`PictureHelper` uses of the helper's process: its pipes, kill and wait."""

    @property
    def stdin(self) -> IO[str] | None: ...

    @property
    def stdout(self) -> IO[str] | None: ...

    def kill(self) -> None: ...

    def wait(self) -> int | None: ...


class _Fork:
    """A forked helper, as the parts of ``subprocess.Popen`` that :class:`PictureHelper` uses."""

    def __init__(self, pid: int, stdin: IO[str], stdout: IO[str]):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self._status: int | None = None

    def kill(self) -> None:
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int | None:
        """Reap it (blocks until it has ended); its exit status."""
        if self._status is None:
            try:
                self._status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            except ChildProcessError:  # reaped already
                self._status = -1
        return self._status


class PictureHelper:
    """The parent's end of the helper. Use from one thread; :meth:`draw` blocks."""

    def __init__(self, proc: _Process | None):
        self._proc = proc

    @classmethod
    def start(cls) -> PictureHelper:
        """Start the helper (returns at once; it imports matplotlib in the background): a fork
        when :func:`may_fork`, else a fresh interpreter. When matplotlib is loaded here already
        (a test or an embedder that ran a simulation before), drawing here costs nothing
        more, and no helper is started."""
        if "matplotlib.figure" in sys.modules:
            return cls(None)
        return cls.fork() if may_fork() else cls.launch()

    @classmethod
    def fork(cls) -> PictureHelper:
        """Fork the helper from this process (returns at once). numpy is imported here first:
        this process loads it anyway (torch does), and the fork starts with it, without an
        interpreter's start-up: the FedAvg job's pictures cost the helper 0.45 CPU-s against
        0.51-0.53 for :meth:`launch` (``benchmarks/picture_cost.py``, medians). Only where
        :func:`may_fork` holds."""
        import numpy  # noqa: F401  (loaded once, for both processes)

        requests, replies = os.pipe(), os.pipe()
        try:
            pid = os.fork()
        except OSError:  # no process to spare: draw() draws here
            for fd in (*requests, *replies):
                os.close(fd)
            return cls(None)
        if pid == 0:  # the helper: its own session, the pipes, nothing on the terminal
            code = 1
            try:
                os.setsid()
                with contextlib.suppress(OSError):  # its name in ps and top: not another fl-sim
                    Path("/proc/self/comm").write_text(FORK_NAME)
                os.close(requests[1])
                os.close(replies[0])
                quiet = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(quiet, fd)
                with open(requests[0], encoding="utf-8") as inbox, \
                        open(replies[1], "w", encoding="utf-8") as outbox:
                    code = serve(inbox, outbox)
            finally:
                os._exit(code)  # nothing of fl-sim's exit: its handlers and buffers are fl-sim's
        os.close(requests[0])
        os.close(replies[1])
        return cls(_Fork(pid, open(requests[1], "w", encoding="utf-8"), open(replies[0], encoding="utf-8")))

    @classmethod
    def launch(cls) -> PictureHelper:
        """Launch the helper whatever this process has loaded (returns at once)."""
        try:
            # one BLAS thread: the helper's numpy multiplies no matrices worth threads, and
            # OpenBLAS's start-up of one per core cost it 0.05-0.1 CPU-s (of ~0.5)
            proc = subprocess.Popen([sys.executable, "-m", "flmesh.coordinator.picture_helper"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                                    env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        except OSError:  # draw() draws here instead
            return cls(None)
        return cls(proc)

    def draw(self, rows: Sequence[Mapping[str, Any]], out_dir: Path,
             rows_file: Path | None = None) -> list[Path]:
        """The pictures of ``rows`` in ``out_dir`` (see :func:`~flmesh.coordinator.pictures.draw`);
        drawn by the helper, or here when it cannot (or has not answered within
        :data:`DRAW_TIMEOUT_S`). ``rows_file``: a rounds.jsonl whose lines are ``rows``; the
        helper then reads them there (this process need not encode them again: ~8 ms for the
        quick start's 0.5 MB) and checks their count. Blocks until they are written."""
        from flmesh.coordinator.pictures import draw

        proc, self._proc = self._proc, None  # one drawing per helper
        if proc is None:
            return draw(rows, out_dir)
        if not rows:  # no pictures: nothing to ask
            _end(proc)
            return []
        reply: dict[str, Any] = {}
        try:
            assert proc.stdin is not None and proc.stdout is not None
            request: dict[str, Any] = ({"rows": list(rows)} if rows_file is None
                                       else {"rows_file": str(rows_file), "count": len(rows)})
            proc.stdin.write(json.dumps({**request, "out_dir": str(out_dir)}) + "\n")
            proc.stdin.flush()
            answered, _, _ = select.select([proc.stdout], [], [], DRAW_TIMEOUT_S)
            reply = json.loads(proc.stdout.readline() or "{}") if answered else {}
        except (OSError, ValueError):  # it died or garbled its answer: draw here
            reply = {}
        finally:
            _end(proc)
        pictures = reply.get("pictures")
        if not isinstance(pictures, list) or not all(Path(p).is_file() for p in pictures):
            return draw(rows, out_dir)  # it could not: here, with this process's own error if any
        return [Path(p) for p in pictures]

    def close(self) -> None:
        """End the helper if it has not drawn (a run that failed before its rounds). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc)


def may_fork() -> bool:
    """Whether this process may fork the helper instead of launching an interpreter: on Linux
    (where fl-sim forks its workers too), with no other thread running and neither gRPC nor
    torch loaded (either may run threads that a fork copies half-way). fl-sim starts the
    helper first thing, so it forks; a test or an embedder with gRPC loaded launches."""
    return (sys.platform == "linux" and threading.active_count() == 1
            and not any(name in sys.modules for name in ("grpc", "torch")))


def _end(proc: _Process) -> None:
    """Kill and reap: the helper holds nothing worth a graceful exit."""
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:  # a flush into a dead helper's pipe
                pass


def draw_in_two(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """:func:`~flmesh.coordinator.pictures.draw`, with the later pictures drawn by a fork of
    this process at the same time: at the end of a run fl-sim's workers are done and the
    cores idle. Only in the helper, which runs no threads, so it may fork. Blocks; raises
    what either process could not draw."""
    from flmesh.coordinator.pictures import plans

    jobs = plans(rows, out_dir)
    split = (len(jobs) + 1) // 2  # two here, the last one there: the slowest is the star's last
    if len(jobs) < 2 or not hasattr(os, "fork"):
        return [plot(rows, path) for plot, path in jobs]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: its pictures, then its error (if any) on the pipe, and out
        os.close(read_end)
        code = 0
        try:
            for plot, path in jobs[split:]:
                plot(rows, path)
        except BaseException as exc:
            os.write(write_end, f"{type(exc).__name__}: {exc}".encode()[:4096])
            code = 1
        os._exit(code)
    os.close(write_end)
    try:
        drawn = [plot(rows, path) for plot, path in jobs[:split]]
    finally:
        with os.fdopen(read_end, "rb") as pipe:
            problem = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(problem or f"the drawing fork ended with status {status}")
    return drawn + [path for _, path in jobs[split:]]


def read_rows(rows_file: Path, count: int) -> list[dict[str, Any]]:
    """The ``count`` rows of a finished rounds.jsonl (one JSON object per line). Raises
    ValueError when it holds another number of rows (it is not the run's: draw them there)."""
    rows = [json.loads(line) for line in Path(rows_file).read_text(encoding="utf-8").splitlines() if line]
    if len(rows) != count:
        raise ValueError(f"{rows_file} holds {len(rows)} rows, not the run's {count}")
    return rows


def main() -> int:
    """The launched helper (``python -m flmesh.coordinator.picture_helper``): :func:`serve` on
    stdin and stdout."""
    return serve(sys.stdin, sys.stdout)


def serve(requests: IO[str], replies: IO[str]) -> int:
    """The helper: import matplotlib, then draw each request (one JSON line in, one out)
    until ``requests`` closes. A request it cannot draw gets ``{"error": ...}``."""
    from flmesh.coordinator.pictures import _pyplot

    try:
        _pyplot()
    except Exception as exc:  # the parent draws itself and reports what is wrong
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), file=replies, flush=True)
        return 1
    for line in requests:
        try:
            request = json.loads(line)
            rows = (read_rows(Path(request["rows_file"]), int(request["count"])) if "rows_file" in request
                    else request["rows"])
            paths = draw_in_two(rows, Path(request["out_dir"]))
            reply: dict[str, Any] = {"pictures": [str(p) for p in paths]}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), file=replies, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
