"""``fl-deploy k8s``: each pod can read only its own key.

One Secret per process (``ca.pem``, that process's certificate and key; never
the CA key), and each process's StatefulSet mounts that Secret and no other.
Checked on the objects as kustomize makes them: rendered by ``kubectl
kustomize`` when it is installed, and always from the kustomization's
``secretGenerator`` and the files it names (no cluster either way). The init
container's script is run here as a kubelet would run it, each mount a local
folder, and must leave the process exactly its own identity.
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID
from test_deploy import FILES, write

from flmesh.cli import fl_certs as certs_cli
from flmesh.cli import fl_deploy as deploy_cli
from flmesh.config import load_federation
from flmesh.pki.certs import load_identity

KUBECTL = shutil.which("kubectl")
#: Every kind fl-deploy k8s makes; a new kind fails the audit until it is audited too.
KINDS = {"StatefulSet", "Service", "PodDisruptionBudget", "ConfigMap", "Secret"}


def deploy(capsys: pytest.CaptureFixture[str], src: Path, out: Path, *flags: str) -> None:
    code = deploy_cli.main(["k8s", str(src), "--out", str(out), "--name", "fed", *flags])
    assert code == 0, capsys.readouterr().err


def generated(out: Path) -> list[dict[str, Any]]:
    """The kustomization's objects without kubectl: its resources, and a Secret per secretGenerator
    entry holding the files it names (kustomize's key: the file's name)."""
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    docs = [yaml.safe_load((out / r).read_text()) for r in kustomization["resources"]]
    for secret in kustomization.get("secretGenerator", []):
        data = {Path(f).name: base64.b64encode((out / f).read_bytes()).decode() for f in secret["files"]}
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret["name"]},
                     "data": data})
    return docs


def rendered(out: Path) -> list[dict[str, Any]]:
    done = subprocess.run([str(KUBECTL), "kustomize", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _process(pod: dict[str, Any]) -> str:
    args = pod["containers"][0]["args"]
    return "aggregator" if args[:2] == ["--role", "aggregator"] else args[args.index("--id") + 1]


def _secrets_referenced(pod: dict[str, Any]) -> set[str]:
    """Every Secret a pod template can read: volumes, projected volumes, env and envFrom of every
    container, image pull secrets."""
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    names |= {s["secret"]["name"] for v in pod.get("volumes", []) if "projected" in v
              for s in v["projected"]["sources"] if "secret" in s}
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
                  if "secretKeyRef" in e.get("valueFrom", {})}
        names |= {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
    return names | {s["name"] for s in pod.get("imagePullSecrets", [])}


def _identity(name: str, data: dict[str, str], ca: x509.Certificate) -> str:
    """The one process whose key a Secret holds (its certificate's common name). Fails on a CA key,
    a second key, a key without its certificate, or another CA certificate."""
    files = {k: base64.b64decode(v) for k, v in data.items()}
    keys = [serialization.load_pem_private_key(v, None) for v in files.values() if b"PRIVATE KEY" in v]
    certs = [x509.load_pem_x509_certificate(v) for v in files.values() if b"CERTIFICATE" in v]
    ca_public = ca.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    assert len(keys) == 1, f"Secret {name}: {len(keys)} private keys"
    public = keys[0].public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    assert public != ca_public, f"Secret {name}: holds the CA's private key"
    own = [c for c in certs if c.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == public]
    assert len(own) == 1, f"Secret {name}: no certificate for its key"
    assert [c for c in certs if c not in own] == [ca], f"Secret {name}: the CA certificate, and no other"
    process = own[0].subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert isinstance(process, str)
    assert set(files) == {"ca.pem", f"{process}.pem", f"{process}.key"}, f"Secret {name}: {sorted(files)}"
    return process


def audit(docs: list[dict[str, Any]], ca: x509.Certificate, processes: list[str]) -> dict[str, str]:
    """Process -> the one Secret its pod can read, which holds its own key and no other; every
    process has one. Fails (AssertionError) on anything else."""
    assert {d["kind"] for d in docs} <= KINDS, {d["kind"] for d in docs} - KINDS
    holder = {d["metadata"]["name"]: _identity(d["metadata"]["name"], d["data"], ca)
              for d in docs if d["kind"] == "Secret"}
    assert sorted(holder.values()) == sorted(processes), "one Secret per process"
    mounted: dict[str, str] = {}
    for sts in (d for d in docs if d["kind"] == "StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        process = _process(pod)
        readable = _secrets_referenced(pod)
        assert all(holder.get(s) == process for s in readable), \
            f"{sts['metadata']['name']} ({process}) can read {sorted(readable)}, holding " \
            f"{[holder.get(s) for s in sorted(readable)]}"
        assert len(readable) == 1 and process not in mounted, f"{process}: {sorted(readable)}"
        assert sts["spec"]["replicas"] == 1, "one pod per template: a template is the same for all its pods"
        mounted[process] = readable.pop()
    assert sorted(mounted) == sorted(processes), "every process runs, with its Secret"
    return mounted


def processes_of(src: Path) -> list[str]:
    federation = load_federation(src)
    return federation.node_ids + (["aggregator"] if federation.aggregator is not None else [])


@pytest.mark.parametrize("kind", FILES)
def test_each_pod_mounts_only_its_own_secret_and_no_secret_holds_the_ca_key(tmp_path, capsys, kind):
    src, out = write(tmp_path, kind), tmp_path / "k8s"
    deploy(capsys, src, out)
    ca = x509.load_pem_x509_certificate((out / "certs" / "ca.pem").read_bytes())
    assert ca.subject.rfc4514_string() == f"CN=flmesh {load_federation(src).name} CA"
    processes = processes_of(src)
    mounted = audit(generated(out), ca, processes)
    assert mounted == {p: f"fed-{i}-tls" for i, p in enumerate(processes) if p != "aggregator"} | (
        {"aggregator": "fed-aggregator-tls"} if "aggregator" in processes else {})
    ca_key = (out / "ca" / "ca-private" / "ca.key").read_bytes()
    assert all(ca_key not in (out / f).read_bytes() for s in yaml.safe_load(
        (out / "kustomization.yaml").read_text())["secretGenerator"] for f in s["files"])
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: checked on the kustomization's files, not on its rendering")
    docs = rendered(out)
    assert {p: s.rsplit("-", 1)[0] for p, s in audit(docs, ca, processes).items()} == mounted, \
        "the rendered Secrets' names are the generated ones and a hash"
    assert base64.b64encode(ca_key).decode() not in yaml.safe_dump_all(docs)


def test_the_audit_refuses_another_nodes_secret_a_shared_one_and_the_ca_key(tmp_path, capsys):
    src, out = write(tmp_path, "star"), tmp_path / "k8s"
    deploy(capsys, src, out)
    ca = x509.load_pem_x509_certificate((out / "certs" / "ca.pem").read_bytes())
    processes = processes_of(src)
    docs = generated(out)
    audit(docs, ca, processes)
    sets = [i for i, d in enumerate(docs) if d["kind"] == "StatefulSet"]
    secrets = [i for i, d in enumerate(docs) if d["kind"] == "Secret"]

    other = copy.deepcopy(docs)  # node 0's pod also mounts node 1's Secret, projected
    other[sets[0]]["spec"]["template"]["spec"]["volumes"].append(
        {"name": "more", "projected": {"sources": [{"secret": {"name": "fed-1-tls"}}]}})
    with pytest.raises(AssertionError, match="can read"):
        audit(other, ca, processes)
    env = copy.deepcopy(docs)  # ... or reads node 1's key into an environment variable
    env[sets[0]]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "K", "valueFrom": {"secretKeyRef": {"name": "fed-1-tls", "key": "node1.key"}}}]
    with pytest.raises(AssertionError, match="can read"):
        audit(env, ca, processes)
    shared = copy.deepcopy(docs)  # node 0's Secret also holds node 1's key
    shared[secrets[0]]["data"]["node1.key"] = docs[secrets[1]]["data"]["node1.key"]
    with pytest.raises(AssertionError, match="2 private keys"):
        audit(shared, ca, processes)
    leaked = copy.deepcopy(docs)  # the CA key instead of node 0's
    ca_key = (out / "ca" / "ca-private" / "ca.key").read_bytes()
    leaked[secrets[0]]["data"]["node0.key"] = base64.b64encode(ca_key).decode()
    with pytest.raises(AssertionError, match="holds the CA's private key"):
        audit(leaked, ca, processes)
    missing = [d for i, d in enumerate(docs) if i != secrets[-1]]
    with pytest.raises(AssertionError, match="one Secret per process"):
        audit(missing, ca, processes)


def test_the_init_container_leaves_the_process_exactly_its_own_identity(tmp_path, capsys):
    """The kubelet's part, by hand: the Secret volume holds the items the template asks for (mode
    0440); the init container's script runs with each mount a local folder."""
    src, out = write(tmp_path, "peer"), tmp_path / "k8s"
    deploy(capsys, src, out)
    secrets = {d["metadata"]["name"]: d["data"] for d in generated(out) if d["kind"] == "Secret"}
    for path in sorted(out.glob("*statefulset*.yaml")):
        pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
        process, pod_dir = _process(pod), tmp_path / path.stem
        volumes = {v["name"]: v for v in pod["volumes"]}
        (init,) = pod["initContainers"]
        script = init["command"][2]
        for mount in init["volumeMounts"]:
            local = pod_dir / mount["name"]
            local.mkdir(parents=True)
            script = script.replace(mount["mountPath"], str(local))
            secret = volumes[mount["name"]].get("secret")
            for item in (secret or {}).get("items", []):
                data = secrets[secret["secretName"]][item["key"]]
                (local / item["path"]).write_bytes(base64.b64decode(data))
                os.chmod(local / item["path"], secret["defaultMode"])
        done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        identity = pod_dir / "identity"
        assert sorted(p.name for p in identity.iterdir()) == ["ca.pem", "node.key", "node.pem"]
        assert stat.S_IMODE((identity / "node.key").stat().st_mode) == 0o600
        found = load_identity(identity / "node.pem", identity / "node.key", identity / "ca.pem",
                              expected_id=process)
        assert found.warnings == (), found.warnings
        main = pod["containers"][0]
        assert {m["name"] for m in main["volumeMounts"]} & {"tls"} == set(), "the node never mounts it"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: the kustomization was not rendered")
def test_rotating_one_nodes_certificate_changes_only_its_secret_and_its_pod(tmp_path, capsys):
    """deploy/CERTIFICATES.md's rotation: re-issue one process's files from OUT/ca into OUT/certs,
    apply again. Only that process's Secret gets a new (hashed) name, so only its pod restarts."""
    src, out = write(tmp_path, "peer"), tmp_path / "k8s"
    deploy(capsys, src, out)
    before = {(d["kind"], d["metadata"]["name"].rsplit("-", 1)[0] if d["kind"] == "Secret" else
               d["metadata"]["name"]): d for d in rendered(out)}
    old = (out / "certs" / "charlie.pem").read_bytes()
    code = certs_cli.main(["issue", "charlie", "--ca-dir", str(out / "ca"), "--out", str(out / "certs"),
                           "--dns", "fed-2-0.fed", "--force"])
    assert code == 0, capsys.readouterr().err
    assert (out / "certs" / "charlie.pem").read_bytes() != old
    after = {(d["kind"], d["metadata"]["name"].rsplit("-", 1)[0] if d["kind"] == "Secret" else
              d["metadata"]["name"]): d for d in rendered(out)}
    assert set(after) == set(before)
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == [("Secret", "fed-2-tls"), ("StatefulSet", "fed-2")], changed
    identity = load_identity(out / "certs" / "charlie.pem", out / "certs" / "charlie.key",
                             out / "certs" / "ca.pem", expected_id="charlie")
    assert "fed-2-0.fed" in identity.dns


def test_a_statefulset_for_a_process_the_federation_lacks_is_one_line(tmp_path):
    from flmesh.deploy.k8s import statefulset

    federation = load_federation(write(tmp_path, "peer"))
    with pytest.raises(ValueError, match=r"^'nobody': not a process of federation .*\(its processes: "):
        statefulset(federation, "nobody", name="x", image="i", port=1, tls=True, storage="1Gi", cpu="1",
                    memory="1Gi")
