"""fl-deploy and each node's own data file (``[nodes.ID] data``), offline: compose mounts a node's
file into that node's container only and the derived federation file names it there; Kubernetes
and systemd keep its absolute path and say where it must exist; bad paths are one line.
(tests/test_deploy_podman.py runs such a deployment under podman-compose.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from flmesh.cli import fl_deploy as deploy_cli
from flmesh.config import load_federation

FEDERATION = """
[federation]
name = "own-files"
seed = 3
rounds = 2

[topology]
graph = "ring"

[data]
classes = 3

[model]
name = "mlp"
hidden = [8]

[nodes.alpha]
data = "data/alpha.npz"
[nodes.bravo]
data = "{bravo}"
[nodes.charlie]
"""


def setup(tmp_path: Path, bravo: str | None = None) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "alpha.npz").write_bytes(b"")  # fl-deploy never reads it
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "bravo.CSV").write_text("label,x\n")
    fed = tmp_path / "fed.toml"
    fed.write_text(FEDERATION.format(bravo=bravo or tmp_path / "elsewhere" / "bravo.CSV"))
    return fed


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = deploy_cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("tls", [True, False], ids=["mtls", "insecure"])
def test_compose_mounts_each_nodes_file_into_its_own_container_only(tmp_path, capsys, tls):
    fed = setup(tmp_path)
    out = tmp_path / "d"
    code, stdout, err = run(capsys, "compose", fed, "--out", out, *([] if tls else ["--insecure"]))
    assert code == 0, err
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    mounts = {node: [v for v in svc["volumes"] if "/etc/flmesh/data" in v] for node, svc in services.items()}
    assert mounts == {
        "alpha": [f"{tmp_path / 'data' / 'alpha.npz'}:/etc/flmesh/data/alpha.npz:ro"],
        "bravo": [f"{tmp_path / 'elsewhere' / 'bravo.CSV'}:/etc/flmesh/data/bravo.csv:ro"],
        "charlie": [],
    }
    derived = load_federation(out / "federation.toml")
    assert {n.id: n.data for n in derived.nodes} == {
        "alpha": "/etc/flmesh/data/alpha.npz", "bravo": "/etc/flmesh/data/bravo.csv", "charlie": None}
    assert "data" not in stdout, "compose mounts the files: no note to mount them"
    try:
        from compose_spec import PyCompose
    except ImportError:
        return
    PyCompose.from_yaml((out / "compose.yaml").read_text()).validate()


@pytest.mark.parametrize("kind", ["k8s", "systemd"])
def test_k8s_and_systemd_keep_the_absolute_path_and_say_where_it_must_be(tmp_path, capsys, kind):
    fed = setup(tmp_path)
    text = fed.read_text()
    if kind == "systemd":  # units need every process's address
        for node in ("alpha", "bravo", "charlie"):
            text = text.replace(f"[nodes.{node}]\n", f'[nodes.{node}]\naddress = "{node}.example.org:9000"\n')
        fed.write_text(text)
    out = tmp_path / "d"
    code, stdout, err = run(capsys, kind, fed, "--out", out, "--insecure")
    assert code == 0, err
    nodes = tomllib.loads((out / "federation.toml").read_text())["nodes"]
    assert nodes["alpha"]["data"] == str(tmp_path / "data" / "alpha.npz"), "relative to the source file"
    assert nodes["bravo"]["data"] == str(tmp_path / "elsewhere" / "bravo.CSV")
    where = "that node's pod" if kind == "k8s" else "that node's machine"
    assert f"note: [nodes.alpha] data {tmp_path / 'data' / 'alpha.npz'} must exist in {where}" in stdout


def test_user_code_gets_a_note(tmp_path, capsys):
    fed = setup(tmp_path)
    fed.write_text(fed.read_text().replace("[data]\n", '[training]\nlearner = "pkg.mod:L"\n\n[data]\n'))
    code, stdout, err = run(capsys, "compose", fed, "--out", tmp_path / "d")
    assert code == 0, err
    assert "note: [training] learner pkg.mod:L must be importable where every process runs" in stdout


@pytest.mark.parametrize(("bravo", "expected"), [
    ("{tmp}/nowhere.npz", "[nodes.bravo] data {tmp}/nowhere.npz: no such file here (it is mounted into "
                          "bravo's container)"),
    ("{tmp}/elsewhere", "[nodes.bravo] data {tmp}/elsewhere: no such file here"),
    ("{tmp}/a:b/bravo.npz", "[nodes.bravo] data '{tmp}/a:b/bravo.npz': a compose volume cannot mount a path "
                            "with ':'"),
])
def test_a_data_file_compose_cannot_mount_is_one_line(tmp_path, capsys, bravo, expected):
    fed = setup(tmp_path, bravo.format(tmp=tmp_path))
    out = tmp_path / "d"
    code, stdout, err = run(capsys, "compose", fed, "--out", out)
    assert code == 2 and err.count("\n") == 1 and err.startswith("fl-deploy: error: "), err
    assert expected.format(tmp=tmp_path) in err, err
    assert not out.exists(), "nothing written"
