"""Import paths of user code: every way one can be wrong is one line naming the path."""

from __future__ import annotations

import sys

import pytest

from flmesh.user_code import UserCodeError, is_import_path, load_callable, load_object


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("VALUE = 3\n\nclass Factory:\n    @staticmethod\n    def build():\n"
                                   "        return 'built'\n\ndef make():\n    return 'made'\n")
    (pkg / "broken.py").write_text("raise RuntimeError('no GPU here')\n")
    (pkg / "needs.py").write_text("import not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def test_a_path_names_a_callable(user_package):
    assert load_callable("mypkg.models:make")() == "made"
    assert load_callable("mypkg.models:Factory.build")() == "built"
    assert load_object("mypkg.models:VALUE") == 3


@pytest.mark.parametrize(("path", "message"), [
    ("mypkg.models", "'mypkg.models' is not an import path of the form package.module:name"),
    ("mypkg.models:", "'mypkg.models:' is not an import path of the form package.module:name"),
    ("nopkg.models:make", "'nopkg.models:make': no module named 'nopkg' (is its package installed?)"),
    ("mypkg.models:missing", "'mypkg.models:missing': mypkg.models has no attribute 'missing'"),
    ("mypkg.broken:x", "'mypkg.broken:x': importing mypkg.broken failed: RuntimeError: no GPU here"),
    ("mypkg.needs:x", "'mypkg.needs:x': importing mypkg.needs failed: ModuleNotFoundError: "
                      "No module named 'not_installed_anywhere'"),
    ("mypkg.models:VALUE", "'mypkg.models:VALUE' is a int, not something to call"),
])
def test_each_bad_path_is_one_line(user_package, path, message):
    with pytest.raises(UserCodeError) as err:
        load_callable(path)
    assert str(err.value) == message


def test_the_form_is_checked_without_importing():
    assert is_import_path("a.b_c:D.e")
    assert not is_import_path("a b:c") and not is_import_path("os.system('x')")
