"""fl-deploy (compose, Kubernetes, systemd) and the health probe: files, validation, one-line errors.

Everything here is offline and loopback-only: manifests are validated with
``kubernetes-validate --strict`` and rendered with ``kubectl kustomize`` (no
cluster), compose files are parsed strictly by ``compose-spec`` and units are
checked with ``systemd-analyze verify`` when those exist, and the probe asks a
real flmesh health server on 127.0.0.1. The containers
themselves run in tests/test_deploy_podman.py (``make test-deploy``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from flmesh.cli import fl_deploy as deploy_cli
from flmesh.cli.probe import main as probe_main
from flmesh.config import Federation, load_federation
from flmesh.deploy.files import dump_toml
from flmesh.pki.certs import federation_pki, load_identity
from flmesh.transports.grpc.server import serve
from flmesh.transports.grpc.tls import load_tls

from conftest import REPO

BIN = Path(sys.executable).parent
KUBECTL = shutil.which("kubectl")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")

BASE = """
[federation]
name = "{name}"
seed = 3
rounds = 4
round_timeout_s = 30

[training]
epochs = 1
batch_size = 16

[model]
name = "mlp"
hidden = [16]
"""
PEER = BASE.format(name="peer-cwt") + """
[topology]
graph = "ring"
schedule = "cwt"

[rewind]
mode = "previous"
lambda = 0.1

[nodes.alpha]
partition = 3
[nodes.bravo]
epochs = 2
[nodes.charlie]
[nodes.delta]
"""
STAR = BASE.format(name="Star_FedAvg") + """
[topology]
nodes = 3

[aggregator]
strategy = "fedavg"
fraction = 0.5
"""
CONTINUAL = BASE.format(name="continual") + """
[topology]
nodes = 4
graph = "complete"
schedule = "cwt"

[rewind]
mode = "previous"

[tasks]
scenario = "novel_inputs"
tasks = 2
rounds_per_task = 2
initial_clients = 2
joining_clients = 2
participation = "full"

[replay]
mode = "client"
host = "node1"
"""
FILES = {"peer": PEER, "star": STAR, "continual": CONTINUAL}


def write(tmp_path: Path, kind: str, text: str | None = None) -> Path:
    path = tmp_path / f"{kind}.toml"
    path.write_text(text if text is not None else FILES[kind])
    return path


def deploy(*args: str | Path) -> tuple[int, str, str]:
    """fl-deploy as a user runs it (its console script)."""
    done = subprocess.run([str(BIN / "fl-deploy"), *map(str, args)], capture_output=True, text=True,
                          timeout=120)
    return done.returncode, done.stdout, done.stderr


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """fl-deploy in this process (quick)."""
    code = deploy_cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def logical(federation: Federation) -> Federation:
    """A federation without what a deployment changes: addresses and where the file lives."""
    nodes = tuple(dataclasses.replace(n, address=None) for n in federation.nodes)
    aggregator = (dataclasses.replace(federation.aggregator, address=None)
                  if federation.aggregator is not None else None)
    return dataclasses.replace(federation, nodes=nodes, aggregator=aggregator, source="")


def yaml_file(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# --------------------------------------------------------------------------------------------- compose
@pytest.mark.parametrize("kind", FILES)
def test_compose_one_service_per_process_with_its_own_key_volume_and_healthcheck(tmp_path, capsys, kind):
    src = write(tmp_path, kind)
    out = tmp_path / "dep"
    code, stdout, err = run(capsys, "compose", src, "--out", out, "--port", "6000", "--image", "reg/flmesh:1")
    assert code == 0, err
    assert "podman-compose up -d" in stdout
    original = load_federation(src)
    derived = load_federation(out / "federation.toml")
    assert logical(derived) == logical(original), "the same logical federation drives the containers"
    star = original.aggregator is not None
    ids = original.node_ids + (["aggregator"] if star else [])
    assert {n.id: n.address for n in derived.nodes} == {i: f"{i}:6000" for i in original.node_ids}
    if star:
        assert derived.aggregator is not None and derived.aggregator.address == "aggregator:6000"
    doc = yaml_file(out / "compose.yaml")
    assert list(doc["services"]) == ids
    assert doc["networks"] == {"flmesh": {"driver": "bridge"}}
    for node_id, svc in doc["services"].items():
        assert svc["image"] == "reg/flmesh:1" and svc["restart"] == "on-failure"
        assert svc["networks"] == ["flmesh"] and svc["hostname"] == node_id
        command = svc["command"]
        assert command[:2] == (["--role", "aggregator"] if node_id == "aggregator" else ["--id", node_id])
        assert "--resume" in command and command[command.index("--listen") + 1] == "0.0.0.0:6000"
        assert command[command.index("--out") + 1] == "/var/lib/flmesh"
        volumes = svc["volumes"]
        assert f"./state/{node_id}:/var/lib/flmesh" in volumes
        assert f"./certs/{node_id}.key:/etc/flmesh/tls/node.key:ro" in volumes
        foreign = [v for v in volumes if v.endswith(".key:ro") and f"/{node_id}.key" not in v]
        assert not foreign, "own key only"
        assert all(v.endswith(":ro") for v in volumes if not v.startswith("./state/"))
        health = svc["healthcheck"]
        service = "flmesh.v1.Aggregator" if node_id == "aggregator" else "flmesh.v1.Peer"
        assert health["test"][:6] == ["CMD", "python", "-m", "flmesh.cli.probe", "127.0.0.1:6000",
                                      "--service"]
        assert health["test"][6] == service and "--tls-cert" in health["test"]
        assert (out / "state" / node_id).is_dir()
        identity = load_identity(out / "certs" / f"{node_id}.pem", out / "certs" / f"{node_id}.key",
                                 out / "certs" / "ca.pem", expected_id=node_id)
        assert node_id in identity.dns and identity.warnings == ()
        assert stat.S_IMODE((out / "certs" / f"{node_id}.key").stat().st_mode) == 0o600
    assert not (out / "certs" / "ca.key").exists() and (out / "ca" / "ca-private" / "ca.key").exists()
    assert stat.S_IMODE((out / "ca" / "ca-private").stat().st_mode) == 0o700
    assert "ca/ca-private/" in (out / ".gitignore").read_text().splitlines()  # never committed with the rest
    if os.geteuid() == 0:  # the containers run as the image's user, who must read its key and write its state
        assert {s["user"] for s in doc["services"].values()} == {"10001:10001"}
        assert (out / "certs" / f"{ids[0]}.key").stat().st_uid == 10001
        assert (out / "state" / ids[0]).stat().st_uid == 10001


@pytest.mark.parametrize("kind", FILES)
@pytest.mark.parametrize("tls", [True, False], ids=["mtls", "insecure"])
def test_compose_files_follow_the_compose_specification(tmp_path, capsys, kind, tls):
    """Strict parsing by compose-spec (bindings of the Rust compose_spec crate): unknown keys, bad
    durations, restart policies or volume syntax are errors; every network reference resolves."""
    try:
        from compose_spec import PyCompose
    except ImportError:
        pytest.skip("compose-spec is not installed (pip install compose-spec): compose files not validated")
    out = tmp_path / "d"
    flags = [] if tls else ["--insecure"]
    code, _, err = run(capsys, "compose", write(tmp_path, kind), "--out", out, *flags)
    assert code == 0, err
    parsed = PyCompose.from_yaml((out / "compose.yaml").read_text())
    parsed.validate()
    assert parsed.service_names() == list(yaml_file(out / "compose.yaml")["services"])
    with pytest.raises(ValueError, match="restart"):  # and the check can fail
        PyCompose.from_yaml((out / "compose.yaml").read_text().replace("on-failure", "sometimes"))


def test_compose_insecure_has_no_certificates(tmp_path, capsys):
    code, _, err = run(capsys, "compose", write(tmp_path, "peer"), "--out", tmp_path / "d", "--insecure")
    assert code == 0, err
    svc = yaml_file(tmp_path / "d" / "compose.yaml")["services"]["alpha"]
    assert "--insecure" in svc["command"] and "--tls-ca" not in svc["command"]
    assert "--tls-ca" not in svc["healthcheck"]["test"] and not (tmp_path / "d" / "certs").exists()


def test_compose_reuses_given_certificates_and_never_copies_the_ca_key(tmp_path, capsys):
    src = write(tmp_path, "peer")
    pki = tmp_path / "pki"
    federation_pki(pki, ["alpha", "bravo", "charlie", "delta"])
    code, _, err = run(capsys, "compose", src, "--out", tmp_path / "d", "--certs", pki)
    assert code == 0, err
    certs = tmp_path / "d" / "certs"
    assert sorted(p.name for p in certs.iterdir()) == sorted(
        ["ca.pem"] + [f"{i}.{e}" for i in ("alpha", "bravo", "charlie", "delta") for e in ("pem", "key")])
    assert (certs / "alpha.pem").read_bytes() == (pki / "alpha.pem").read_bytes()
    assert not (tmp_path / "d" / "ca").exists()
    # a certificate of another process is refused, naming it
    shutil.copy(pki / "charlie.pem", pki / "delta.pem")
    shutil.copy(pki / "charlie.key", pki / "delta.key")
    code, _, err = run(capsys, "compose", src, "--out", tmp_path / "d2", "--certs", pki)
    assert code == 2 and "delta.pem" in err and "charlie" in err and err.count("\n") == 1, err


def test_rerunning_refuses_to_overwrite_without_force_and_keeps_results(tmp_path, capsys):
    src, out = write(tmp_path, "peer"), tmp_path / "d"
    assert run(capsys, "compose", src, "--out", out)[0] == 0
    (out / "state" / "alpha" / "summary.json").write_text("{}")
    ca = (out / "ca" / "ca.pem").read_bytes()
    code, _, err = run(capsys, "compose", src, "--out", out, "--port", "7000")
    assert code == 2 and err.count("\n") == 1 and "already exists (--force" in err
    assert "alpha:50051" in (out / "federation.toml").read_text(), "nothing was written"
    code, _, err = run(capsys, "compose", src, "--out", out, "--port", "7000", "--force")
    assert code == 0, err
    assert "alpha:7000" in (out / "federation.toml").read_text()
    assert (out / "state" / "alpha" / "summary.json").read_text() == "{}", "results are kept"
    assert (out / "ca" / "ca.pem").read_bytes() == ca, "the CA is kept: certificates stay trusted"


# ------------------------------------------------------------------------------------------ kubernetes
def _validate(paths: list[Path]) -> None:
    command = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *map(str, paths)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _render(folder: Path) -> list[dict]:
    if KUBECTL is None:  # the files as written were checked before this
        pytest.skip("kubectl is not installed: the kustomization was not rendered")
    done = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (folder.parent / "rendered.yaml").write_text(done.stdout)
    _validate([folder.parent / "rendered.yaml"])
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.parametrize("kind", FILES)
@pytest.mark.parametrize("tls", [True, False], ids=["mtls", "insecure"])
def test_k8s_manifests_validate_strictly_and_render(tmp_path, capsys, kind, tls):
    src, out = write(tmp_path, kind), tmp_path / "k8s"
    flags = [] if tls else ["--insecure"]
    code, stdout, err = run(capsys, "k8s", src, "--out", out, "--namespace", "fl", "--port", "6000", *flags)
    assert code == 0, err
    assert "kubectl apply -k" in stdout
    original = load_federation(src)
    name = "star-fedavg" if kind == "star" else original.name
    star = original.aggregator is not None
    kustomization = yaml_file(out / "kustomization.yaml")
    resources = [out / r for r in kustomization["resources"]]
    _validate(resources)
    node_files = [out / f"statefulset-{i}.yaml" for i in range(len(original.nodes))]
    assert set(node_files) < set(resources) and (out / "pdb.yaml") in resources
    assert ((out / "aggregator-statefulset.yaml") in resources) == star
    # the derived file: node i is the one pod of StatefulSet NAME-i, named by the headless Service
    derived = load_federation(out / "federation.toml")
    assert logical(derived) == logical(original)
    expected = [f"{name}-{i}-0.{name}:6000" for i in range(len(derived.nodes))]
    assert [n.address for n in derived.nodes] == expected
    if star:
        assert derived.aggregator is not None
        assert derived.aggregator.address == f"{name}-aggregator-0.{name}-aggregator:6000"

    # the files as written (kubectl may be missing: these checks need none)
    for i, (path, node_id) in enumerate(zip(node_files, original.node_ids, strict=True)):
        assert path.read_text().startswith(f"# fl-deploy k8s: {path.name} ({node_id}). ")
        assert "&id" not in path.read_text(), "no YAML anchors: each value where it is used"
        sts_doc = yaml_file(path)
        assert sts_doc["metadata"]["name"] == f"{name}-{i}"
        assert sts_doc["metadata"]["annotations"] == {"flmesh/node-id": node_id}
        sts = sts_doc["spec"]
        assert sts["replicas"] == 1 and sts["serviceName"] == name
        assert sts["selector"]["matchLabels"]["flmesh/node-index"] == str(i), "its own pod, no other"
        assert sts["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
        pod = sts["template"]["spec"]
        main = pod["containers"][0]
        assert main["args"][:2] == ["--id", node_id]
        assert [m["name"] for m in main["volumeMounts"]] == (["config", "identity", "state", "tmp"] if tls
                                                             else ["config", "state", "tmp"]), \
            "the node container never mounts the Secret"
        assert [c["name"] for c in pod.get("initContainers", [])] == (["identity"] if tls else [])
        assert "--resume" in main["args"] and main["resources"]["requests"]["cpu"] == "500m"
        assert pod["securityContext"]["runAsNonRoot"] and main["securityContext"]["readOnlyRootFilesystem"]
        readiness = main["readinessProbe"]
        if tls:
            assert "--tls-cert" in readiness["exec"]["command"] and "grpc" not in readiness
        else:
            assert readiness["grpc"] == {"port": 6000, "service": "flmesh.v1.Peer"}
            assert "--insecure" in main["args"] and "--tls-key" not in main["args"]
        assert "--finished-file" in main["livenessProbe"]["exec"]["command"]
    service = yaml_file(out / "service.yaml")["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"]
    assert "flmesh/node-index" not in service["selector"], "the Service names every node's pod"
    pdb = yaml_file(out / "pdb.yaml")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"] == service["selector"]
    if star:
        agg = yaml_file(out / "aggregator-statefulset.yaml")["spec"]
        assert agg["replicas"] == 1 and agg["template"]["spec"]["containers"][0]["args"][:2] == [
            "--role", "aggregator"]
    else:
        assert not (out / "aggregator-statefulset.yaml").exists()

    # rendered by kustomize: generated (hashed) names, the namespace, one Secret per process
    docs = _render(out)
    by_kind: dict[str, list[dict]] = {}
    for d in docs:
        assert d["metadata"].get("namespace") == "fl"
        by_kind.setdefault(d["kind"], []).append(d)
    secrets = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in by_kind.get("Secret", [])}
    workloads = {f"{name}-{i}": node_id for i, node_id in enumerate(original.node_ids)}
    workloads.update({f"{name}-aggregator": "aggregator"} if star else {})
    assert set(secrets) == ({f"{sts}-tls" for sts in workloads} if tls else set())
    for sts, process in workloads.items() if tls else ():
        assert set(secrets[f"{sts}-tls"]["data"]) == {"ca.pem", f"{process}.pem", f"{process}.key"}
    configmap = by_kind["ConfigMap"][0]
    assert set(configmap["data"]) == {"federation.toml"}
    sets = {d["metadata"]["name"]: d for d in by_kind["StatefulSet"]}
    assert set(sets) == set(workloads)
    for sts in workloads:
        volumes = {v["name"]: v for v in sets[sts]["spec"]["template"]["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"], "the hashed name"
        if tls:
            assert volumes["tls"]["secret"]["secretName"] == secrets[f"{sts}-tls"]["metadata"]["name"]
        else:
            assert "tls" not in volumes


def test_k8s_copies_a_graph_file_into_the_configmap(tmp_path, capsys):
    (tmp_path / "ring.edgelist").write_text("a b\nb c\nc a\n")
    text = BASE.format(name="g") + '[topology]\nfile = "ring.edgelist"\n[nodes.a]\n[nodes.b]\n[nodes.c]\n'
    code, _, err = run(capsys, "k8s", write(tmp_path, "g", text), "--out", tmp_path / "k8s")
    assert code == 0, err
    assert (tmp_path / "k8s" / "ring.edgelist").read_text() == "a b\nb c\nc a\n"
    derived = load_federation(tmp_path / "k8s" / "federation.toml")
    assert derived.topology.file == (tmp_path / "k8s" / "ring.edgelist").resolve()
    docs = _render(tmp_path / "k8s")
    assert "ring.edgelist" in next(d for d in docs if d["kind"] == "ConfigMap")["data"]


# ---------------------------------------------------------------------------------------------- systemd
SYSTEMD_FED = PEER.replace("[nodes.alpha]\n", '[nodes.alpha]\naddress = "10.0.0.1:7001"\n').replace(
    "[nodes.bravo]\n", '[nodes.bravo]\naddress = "bravo.example.org:7002"\n').replace(
    "[nodes.charlie]\n", '[nodes.charlie]\naddress = "[fd00::3]:7003"\n').replace(
    "[nodes.delta]\n", '[nodes.delta]\naddress = "10.0.0.4:7004"\n')


def test_systemd_units_are_hardened_and_take_their_flags_from_an_environment_file(tmp_path, capsys):
    src, out = write(tmp_path, "sd", SYSTEMD_FED), tmp_path / "sd"
    code, _, err = run(capsys, "systemd", src, "--out", out, "--exec", BIN / "fl-node")
    assert code == 0, err
    assert logical(load_federation(out / "federation.toml")) == logical(load_federation(src))
    unit = (out / "flmesh-bravo.service").read_text()
    for line in ("DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes", "NoNewPrivileges=yes",
                 "PrivateTmp=yes", "StateDirectory=flmesh/bravo", "Restart=on-failure",
                 "RestartPreventExitStatus=2", "EnvironmentFile=/etc/flmesh/bravo.env",
                 "LoadCredential=node.key:/etc/flmesh/tls/bravo.key",
                 f"ExecStart={BIN / 'fl-node'} $FLMESH_ARGS --tls-ca %d/ca.pem --tls-cert %d/node.pem "
                 "--tls-key %d/node.key"):
        assert f"\n{line}\n" in unit, line
    env = (out / "flmesh-bravo.env").read_text()
    assert ("\nFLMESH_ARGS=--id bravo --federation /etc/flmesh/federation.toml --listen 0.0.0.0:7002 "
            "--out /var/lib/flmesh/bravo --resume\n") in env
    assert "--listen [::]:7003 " in (out / "flmesh-charlie.env").read_text()
    certs = out / "certs"
    identity = load_identity(certs / "bravo.pem", certs / "bravo.key", certs / "ca.pem",
                             expected_id="bravo")
    assert "bravo.example.org" in identity.dns
    assert "10.0.0.1" in load_identity(out / "certs" / "alpha.pem", out / "certs" / "alpha.key",
                                       out / "certs" / "ca.pem").ips


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed: units not verified")
def test_systemd_analyze_verifies_the_units(tmp_path, capsys):
    out = tmp_path / "sd"
    assert run(capsys, "systemd", write(tmp_path, "sd", SYSTEMD_FED), "--out", out, "--exec",
               BIN / "fl-node")[0] == 0
    units = sorted(str(p) for p in out.glob("*.service"))
    assert len(units) == 4
    done = subprocess.run([str(SYSTEMD_ANALYZE), "verify", *units], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "flmesh-" not in done.stdout + done.stderr, done.stdout + done.stderr
    # and the check can fail: a bad value is reported
    bad = out / "flmesh-bad.service"
    bad.write_text((out / "flmesh-alpha.service").read_text().replace("ProtectHome=yes", "ProtectHome=maybe"))
    done = subprocess.run([str(SYSTEMD_ANALYZE), "verify", str(bad)], capture_output=True, text=True,
                          timeout=120)
    assert "ProtectHome" in done.stdout + done.stderr or "protect home" in done.stderr


def test_systemd_aggregator_unit(tmp_path, capsys):
    text = STAR + 'address = "agg.example.org:9000"\n' + "".join(
        f'[nodes.node{i}]\naddress = "n{i}.example.org:9000"\n' for i in range(3))
    code, _, err = run(capsys, "systemd", write(tmp_path, "s", text), "--out", tmp_path / "sd", "--insecure")
    assert code == 0, err
    env = (tmp_path / "sd" / "flmesh-aggregator.env").read_text()
    assert "FLMESH_ARGS=--role aggregator --federation" in env
    assert env.rstrip().endswith("--resume --insecure")
    assert "LoadCredential" not in (tmp_path / "sd" / "flmesh-aggregator.service").read_text()


# ----------------------------------------------------------------------------------------- bad input
BAD = [
    (["compose", "{missing}", "--out", "{out}"], "federation file not found"),
    (["compose", "{peer}", "--out", "{out}", "--port", "0"], "--port 0: expected 1 to 65535"),
    (["compose", "{peer}", "--out", "{out}", "--image", "a b"], "--image 'a b'"),
    (["compose", "{peer}", "--out", "{out}", "--insecure", "--certs", "{tmp}"], "contradict"),
    (["compose", "{peer}", "--out", "{out}", "--certs", "{tmp}"], "ca.pem: no such file"),
    (["compose", "{peer}", "--out", "{out}", "--days", "0"], "days must be"),
    (["compose", "{underscore}", "--out", "{out}"], "node 'node_a': a compose service's name is its address"),
    (["compose", "{agg_named}", "--out", "{out}"], "'aggregator' is the aggregator's id"),
    (["k8s", "{peer}", "--out", "{out}", "--name", "Bad_Name"], "--name 'Bad_Name'"),
    (["k8s", "{peer}", "--out", "{out}", "--namespace=Bad"], "--namespace 'Bad'"),
    (["k8s", "{peer}", "--out", "{out}", "--memory", "lots"], "--memory 'lots'"),
    (["k8s", "{peer}", "--out", "{out}", "--port", "70000"], "--port 70000"),
    (["systemd", "{peer}", "--out", "{out}"], "[nodes.alpha] address: required for systemd units"),
    (["systemd", "{sd}", "--out", "{out}", "--exec", "fl-node"], "absolute path"),
    (["compose", "{peer}", "--out", "{file}"], "not a folder"),
    (["k8s", "{peer}"], "the following arguments are required: --out"),
    (["swarm", "{peer}", "--out", "{out}"], "invalid choice: 'swarm'"),
    (["compose", "{bad_toml}", "--out", "{out}"], "not valid TOML"),
    (["compose", "{bad_key}", "--out", "{out}"], "[training] epochs"),
    (["compose", "{tmp}", "--out", "{out}"], "cannot read federation file"),
    (["compose", "{peer}", "--out", "{out}", "--days", "soon"], "--days: invalid int value: 'soon'"),
    (["compose", "{peer}", "--out", "{out}", "--uid", "0"], "--uid 0: expected a user id from 1"),
    (["compose", "{peer}", "--out", "{out}", "--replicas", "3"], "unrecognized arguments: --replicas 3"),
    (["compose", "--out", "{out}"], "the following arguments are required: FILE"),
    ([], "the following arguments are required: COMMAND"),
]


@pytest.mark.parametrize(("argv", "expected"), BAD, ids=[e for _, e in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, expected):
    paths = {
        "missing": tmp_path / "nope.toml", "out": tmp_path / "out", "tmp": tmp_path,
        "peer": write(tmp_path, "peer"),
        "underscore": write(tmp_path, "u", BASE.format(name="u") + "[nodes.node_a]\n[nodes.b]\n"),
        "agg_named": write(tmp_path, "a", STAR.replace("nodes = 3", "") + "[nodes.aggregator]\n[nodes.b]\n"),
        "sd": write(tmp_path, "sd", SYSTEMD_FED), "file": write(tmp_path, "f", "x"),
        "bad_toml": write(tmp_path, "bt", "[federation\n"),
        "bad_key": write(tmp_path, "bk", PEER.replace("epochs = 1", "epochs = -1")),
    }
    code, stdout, err = deploy(*(a.format(**paths) for a in argv))
    assert code == 2, (stdout, err)
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("fl-deploy"), err
    assert expected in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "nothing written"


def test_an_unwritable_out_folder_is_one_line_and_exit_1(tmp_path):
    src = write(tmp_path, "peer")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, stdout, err = deploy("k8s", src, "--out", blocker / "sub")
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, (stdout, err)
    assert err.startswith(f"fl-deploy: error: --out {blocker / 'sub'}: cannot write")
    assert "Not a directory" in err
    if os.geteuid() != 0:  # root writes through a read-only mode
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, _, err = deploy("compose", src, "--out", locked / "out")
        assert code == 1 and err.count("\n") == 1 and "Permission denied" in err, err


def test_dump_toml_round_trips_every_example():
    for path in sorted((REPO / "examples").rglob("*.toml")):
        raw = tomllib.loads(path.read_text())
        assert tomllib.loads(dump_toml(raw)) == raw, path
    odd = {"a": {"b.c": {"x y": [1, 2.5, "q\"\n", True], "inline": [{"k": 1}]}, "e": 1e-5}}
    assert tomllib.loads(dump_toml(odd)) == odd


# ------------------------------------------------------------------------------------------------ probe
@pytest.fixture
def pki(tmp_path: Path) -> dict:
    return federation_pki(tmp_path / "pki", ["node0", "node1"])


def probe(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = probe_main([str(a) for a in args])
    out = capsys.readouterr()
    text = out.out + out.err
    assert text.count("\n") == 1, text
    return code, text


def test_probe_plaintext_against_a_real_health_server(capsys):
    server, health, address = serve(lambda s: None, "flmesh.v1.Peer", "127.0.0.1:0")
    try:
        assert probe(capsys, address) == (0, f'probe: {address} "": SERVING (plaintext)\n')
        assert probe(capsys, address, "--service", "flmesh.v1.Peer")[0] == 0
        code, text = probe(capsys, address, "--service", "flmesh.v1.Aggregator")
        assert code == 1 and "NOT_FOUND" in text
        from grpc_health.v1 import health_pb2

        health.set("flmesh.v1.Peer", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert probe(capsys, address, "--service", "flmesh.v1.Peer") == (
            1, f"probe: {address} flmesh.v1.Peer: NOT_SERVING (plaintext)\n")
    finally:
        server.stop(0)
    code, text = probe(capsys, address, "--timeout", "2")
    assert code == 1 and "UNAVAILABLE" in text


def test_probe_mtls_checks_the_server_is_the_expected_node(capsys, pki):
    tls, _ = load_tls(pki["node0"].ca, pki["node0"].cert, pki["node0"].key, expected_id="node0")
    server, _, address = serve(lambda s: None, "flmesh.v1.Peer", "127.0.0.1:0", tls=tls)
    own = ["--tls-ca", pki["node0"].ca, "--tls-cert", pki["node0"].cert, "--tls-key", pki["node0"].key]
    other = ["--tls-ca", pki["node1"].ca, "--tls-cert", pki["node1"].cert, "--tls-key", pki["node1"].key]
    try:
        code, text = probe(capsys, address, "--service", "flmesh.v1.Peer", *own)
        assert code == 0 and "mTLS as node0, expecting node0" in text
        assert probe(capsys, address, *other, "--peer-id", "node0")[0] == 0
        code, text = probe(capsys, address, *other, "--timeout", "3")  # expects node1: the server is node0
        assert code == 1 and "UNAVAILABLE" in text
        code, text = probe(capsys, address, "--timeout", "3")  # plaintext against mTLS
        assert code == 1
    finally:
        server.stop(0)


def test_probe_bad_flags_and_finished_file(capsys, pki, tmp_path):
    assert probe(capsys, "nohost")[0] == 2
    code, text = probe(capsys, "127.0.0.1:1", "--tls-ca", pki["node0"].ca)
    assert code == 2 and "missing --tls-cert, --tls-key" in text
    code, text = probe(capsys, "127.0.0.1:1", "--peer-id", "x")
    assert code == 2 and "--peer-id needs" in text
    code, text = probe(capsys, "127.0.0.1:1", "--tls-ca", pki["node0"].ca, "--tls-cert", pki["node1"].cert,
                       "--tls-key", pki["node0"].key)
    assert code == 2 and "node1.pem" in text
    done = tmp_path / "finished"
    done.write_text("")
    assert probe(capsys, "127.0.0.1:1", "--finished-file", done)[0] == 0
    with pytest.raises(SystemExit) as exc:
        probe_main(["127.0.0.1:1", "--timeout", "soon"])
    assert exc.value.code == 2


def test_probe_loads_neither_torch_nor_numpy():
    code = ("import sys\nfrom flmesh.cli.probe import main\n"
            "main(['127.0.0.1:1', '--timeout', '1'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("[]"), done.stdout + done.stderr
