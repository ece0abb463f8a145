"""docs/custom.md runs as written: every fenced block, in order, in one empty folder.

How each block is used, by its info string:

- ``python`` whose first line is ``# NAME.py``: written to the folder as NAME.py;
- other ``python``: executed in one namespace shared by all of them, in the folder, with
  the folder on ``sys.path`` (an interpreter session);
- ``toml``: written to the file its first line (``# NAME.toml``) names, after a TOML check;
- ``sh``: commands of one shell session (below);
- ``text``: not run (output, or a snippet that is not a step).

Any other info string fails the test, so a block is never skipped silently. The shell
commands understood are ``export NAME=VALUE`` (``$NAME`` expanded; it holds for the later
blocks too), ``fl-sim ...`` and ``python ...`` (run to their end), ``fl-node ... &``
(started) and ``wait`` (every started node must exit 0 before a deadline). Nodes started
with ``&`` also get ``--listen 127.0.0.1:0 --ready-file --peers-file``: each binds a free
port instead of its address in the file, and the test hands the addresses out, so no port
is guessed. Every command must exit 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, wait_until

DOC = REPO / "docs" / "custom.md"
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NAMED = re.compile(r"\A# ([\w.-]+\.(?:py|toml))\n")
DEADLINE_S = 300  # a bound on a hung command, not a timing check


@dataclass(frozen=True)
class Block:
    info: str
    body: str
    line: int  # where the block starts in the doc, for messages

    @property
    def where(self) -> str:
        return f"docs/custom.md:{self.line} ({self.info or 'no info string'})"


def blocks(text: str) -> list[Block]:
    return [Block(m["info"].strip(), m["body"], text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


class Shell:
    """The commands of the doc's ``sh`` blocks, as one shell session would run them."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PWD": str(folder)}
        self.started: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.logs = folder / "logs"
        self.logs.mkdir()

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.env.get(m[1], ""), text)

    def run(self, block: Block) -> None:
        text = re.sub(r"\\\n", " ", block.body)
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                self.command(line, block)
        assert not self.started, f"{block.where}: nodes started with & and no wait after them"

    def command(self, line: str, block: Block) -> None:
        words = shlex.split(self.expand(line))
        background = words[-1] == "&"
        words = words[:-1] if background else words
        name = words[0]
        if name == "export" and len(words) == 2 and "=" in words[1]:
            key, _, value = words[1].partition("=")
            self.env[key] = value
        elif name == "wait" and len(words) == 1:
            self.wait(block)
        elif name == "fl-node" and background:
            self.start(words, block)
        elif name in ("fl-sim", "fl-certs", "python") and not background:
            program = sys.executable if name == "python" else str(BIN / name)
            done = subprocess.run([program, *words[1:]], cwd=self.folder, env=self.env, capture_output=True,
                                  text=True, timeout=DEADLINE_S)
            assert done.returncode == 0, (f"{block.where}: {line!r} exited {done.returncode}\n"
                                          f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        else:
            raise AssertionError(f"{block.where}: the test runs no {line!r}; mark the block ```text "
                                 "if it is not a step, or teach tests/test_docs_custom.py the command")

    def start(self, words: list[str], block: Block) -> None:
        assert "--id" in words, f"{block.where}: {shlex.join(words)} has no --id"
        node = words[words.index("--id") + 1]
        addr = self.folder / ".addr"
        addr.mkdir(exist_ok=True)
        assert node not in self.started, f"{block.where}: two nodes {node} started at once"
        log = self.logs / f"{node}-line{block.line}.log"
        with log.open("w") as out:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(
                [str(BIN / "fl-node"), *words[1:], "--listen", "127.0.0.1:0", "--ready-file",
                 str(addr / node), "--peers-file", str(addr / "peers.json")],
                cwd=self.folder, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)
        self.started[node] = (proc, log)

    def wait(self, block: Block) -> None:
        """Hand out the started nodes' addresses, then wait until all exit 0. A node that fails
        stops the others at once: the failure, not their wait for it, is what the test shows."""
        addr = self.folder / ".addr"
        procs, self.started = self.started, {}

        def failed() -> bool:
            return any(p.poll() not in (None, 0) for p, _ in procs.values())

        try:
            wait_until(lambda: failed() or all((addr / n).exists() for n in procs), timeout=DEADLINE_S,
                       interval=0.1)
            if not failed():
                peers = {n: (addr / n).read_text().strip() for n in procs}
                (addr / ".peers.json").write_text(json.dumps(peers))
                os.replace(addr / ".peers.json", addr / "peers.json")
                wait_until(lambda: failed() or all(p.poll() is not None for p, _ in procs.values()),
                           timeout=DEADLINE_S, interval=0.1)
        finally:
            stopped = set()
            for node, (proc, _) in procs.items():
                if proc.poll() is None:
                    stopped.add(node)
                    proc.kill()
                proc.wait()
        bad = {n: (p.returncode, log) for n, (p, log) in procs.items()
               if p.returncode != 0 and n not in stopped}  # the failures, not the nodes stopped after them
        assert not bad, f"{block.where}: " + "\n".join(
            f"fl-node --id {n} exited {code}:\n{log.read_text()[-2000:]}" for n, (code, log) in bad.items())


def run_doc(folder: Path) -> None:
    shell = Shell(folder)
    namespace: dict[str, object] = {"__name__": "__docs_custom__"}
    for block in blocks(DOC.read_text()):
        lang = block.info.split()[0] if block.info else ""
        named = NAMED.match(block.body)
        if lang == "text":
            continue
        if lang == "python" and named:
            (folder / named[1]).write_text(block.body)
        elif lang == "python":
            code = compile("\n" * (block.line) + block.body, str(DOC), "exec")  # tracebacks name doc lines
            exec(code, namespace)
        elif lang == "toml":
            assert named, f"{block.where}: a TOML block names its file on its first line (# NAME.toml)"
            tomllib.loads(block.body)
            (folder / named[1]).write_text(block.body)
        elif lang == "sh":
            shell.run(block)
        else:
            raise AssertionError(f"{block.where}: unknown info string; use python, toml, sh or text")


@pytest.fixture
def doc_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:  # the doc's modules: another test may write its own
        if getattr(sys.modules[name], "__file__", None) and str(tmp_path) in str(sys.modules[name].__file__):
            del sys.modules[name]


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_custom_code_tutorial_runs_as_written(doc_folder):
    run_doc(doc_folder)
    runs = doc_folder / "runs"
    for run in ("sim", "python"):  # fl-sim and Simulation, over the learner's metric
        summary = json.loads((runs / run / "summary.json").read_text())
        assert summary["rounds"] == 3 and summary["error"] is None, summary
        last = rows(runs / run)[-1]
        assert last["metric"] == "macro_f1"
        assert all(0.0 <= n["metrics"]["macro_f1"] <= 1.0 for n in last["nodes"].values())
        assert summary["final"]["fa"] > 0.5, "four separated classes are learnt above chance"
    for node in ("alice", "bob", "carol"):  # fl-node on its own .npz
        summary = json.loads((runs / f"sensors-{node}" / "summary.json").read_text())
        assert summary["rounds"] == 3 and not summary["interrupted"], summary
        data = summary["config"]["data"]
        assert data["own"] and data["origin"].endswith(f"{node}.npz")
        assert data["train_samples"] + data["test_samples"] == 200
        assert "macro_f1" in rows(runs / f"sensors-{node}")[-1]["nodes"][node]["metrics"]


def test_every_block_is_one_the_test_runs():
    found = blocks(DOC.read_text())
    kinds = [b.info.split()[0] if b.info else "" for b in found]
    assert set(kinds) <= {"python", "toml", "sh", "text"}, kinds
    assert {"python", "toml", "sh"} <= set(kinds)
    # a fence the pattern missed (unbalanced, or indented) would leave blocks unrun
    assert DOC.read_text().count("```") == 2 * len(found)
