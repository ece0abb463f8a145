"""docs/federation-file.md is written from the schema (flmesh.config.reference): the committed
page must be what the schema makes now, so a key added without its line, or a changed bound or
default, fails here until the page is written again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flmesh.config import schema
from flmesh.config.checks import integer
from flmesh.config.continual import REPLAY_KEYS, TASK_KEYS
from flmesh.config.reference import accepts, reference_text

from conftest import REPO

PAGE = REPO / "docs" / "federation-file.md"
WRITE = "python -m flmesh.config.reference > docs/federation-file.md"


def test_the_committed_page_is_what_the_schema_writes():
    assert PAGE.read_text(encoding="utf-8") == reference_text(), f"docs/federation-file.md is stale: {WRITE}"


def test_the_module_prints_the_page():
    done = subprocess.run([sys.executable, "-m", "flmesh.config.reference"], capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout == reference_text()


def test_every_key_of_every_section_has_a_row():
    page = reference_text()
    tables = {**schema.SECTIONS, "tasks": TASK_KEYS, "replay": REPLAY_KEYS, "nodes.&lt;id>": schema.NODE_KEYS}
    for section, keys in tables.items():
        body = page.split(f"\n## [{section}]\n", 1)[1].split("\n## ", 1)[0]
        rows = [line.split("`")[1] for line in body.splitlines() if line.startswith("| `")]
        assert rows == list(keys), section
    for key in ("small_input", "zstd_level", "trim", "clip_norm"):
        assert f"| `{key}` |" in page
    assert "| `lambda` | a number in (0, 0.5] | 0.1 |" in page  # bounds and the default as parsed
    assert "| `rounds` | an integer >= 1, <= 100000 | required |" in page


def test_a_key_without_a_description_fails(monkeypatch):
    monkeypatch.setitem(schema.SECTIONS, "wire", {**schema.SECTIONS["wire"], "window": integer(1)})
    with pytest.raises(KeyError, match="window"):
        reference_text()


def test_a_description_of_no_key_fails(monkeypatch):
    gone = {**schema.DESCRIPTIONS["wire"], "gone": "a removed key"}
    monkeypatch.setitem(schema.DESCRIPTIONS, "wire", gone)
    with pytest.raises(ValueError, match="gone"):
        reference_text()


def test_accepts_joins_a_lower_and_an_upper_bound():
    assert accepts(schema.SECTIONS["wire"]["zstd_level"]) == "an integer >= 1, <= 19"
    assert accepts(schema.SECTIONS["data"]["download"]) == "true or false"
