"""The documentation site builds with ``mkdocs build --strict``: a broken link between pages or
a page missing from the navigation fails the build. Every page of docs/ is in the navigation
and in the site; docs/api.md, written from the docstrings by docs/_ext/api_page.py, is what
that script prints now and documents every public name."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

import flmesh

from conftest import REPO

PUBLIC = sorted(set(flmesh.__all__) - {"__version__"})


API_PAGE = REPO / "docs" / "api.md"
WRITE = "python docs/_ext/api_page.py > docs/api.md"


def test_the_api_page_is_what_the_docstrings_write_now():
    done = subprocess.run([sys.executable, str(REPO / "docs" / "_ext" / "api_page.py")], capture_output=True,
                          text=True, timeout=300, check=True)
    assert API_PAGE.read_text(encoding="utf-8") == done.stdout, f"docs/api.md is stale: {WRITE}"


def test_the_api_page_names_every_public_name_in_plain_markdown():
    text = API_PAGE.read_text(encoding="utf-8")
    anchors = set(re.findall(r'<a id="(flmesh[\w.]*)"></a>', text))
    missing = [name for name in [*(f"flmesh.{n}" for n in PUBLIC), "flmesh.testing", "flmesh.testing.run"]
               if name not in anchors]
    assert not missing, f"docs/api.md has no entry for {missing}"
    assert ":::" not in text and ":class:" not in text and not re.search(r"``[^`\n]+``", text), \
        "no generator or reStructuredText markup left"


def own_docstring(obj: object) -> str:
    """``obj``'s docstring, not one a class inherits or one dataclass writes (its signature)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    name = getattr(obj, "__name__", "")
    return "" if not doc or doc.startswith(f"{name}(") else doc


def nav_pages(nav: list) -> list[str]:
    """The Markdown files a mkdocs ``nav`` names, nested sections included."""
    out: list[str] = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out.extend(nav_pages(value) if isinstance(value, list) else [value])
    return out


PAGES = sorted(p.name for p in (REPO / "docs").glob("*.md"))


def test_every_page_of_docs_is_in_the_navigation_and_none_is_excluded():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert sorted(nav_pages(config["nav"])) == PAGES
    excluded = [line.strip() for line in config.get("exclude_docs", "").splitlines() if line.strip()]
    assert excluded == ["_ext/"]


def test_the_readme_links_every_page():
    readme = (REPO / "README.md").read_text()
    assert [page for page in PAGES if page != "index.md" and f"](docs/{page})" not in readme] == []
    assert "`make docs`" in readme and ".venv/bin/mkdocs serve" in readme


def test_every_public_name_has_its_own_docstring():
    bare = [name for name in PUBLIC if not own_docstring(getattr(flmesh, name))]
    assert not bare, f"public names without a docstring of their own: {bare}"


def test_the_site_builds_strictly_with_every_public_name(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    page = (site / "api" / "index.html").read_text()
    anchors = set(re.findall(r'id="(flmesh[\w.]*)"', page))
    missing = [name for name in [*(f"flmesh.{n}" for n in PUBLIC), "flmesh.testing.run"]
               if name not in anchors]
    assert not missing, f"the API page renders no entry for {missing}"
    built = [site / ("index.html" if p == "index.md" else f"{p.removesuffix('.md')}/index.html")
             for p in PAGES]
    assert [str(p) for p in built if not p.exists()] == []
