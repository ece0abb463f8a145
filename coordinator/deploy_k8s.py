"""Kubernetes manifests for a federation, kustomize layout (``fl-deploy k8s``).

Pure functions from a :class:`~flmesh.topology.Federation` to manifests (dicts
for YAML); :mod:`flmesh.coordinator.deploy_cli` writes them with the derived
federation file and the certificates. Kubernetes is the engine beyond one
machine: it places, restarts and names the processes.

- The nodes are one StatefulSet ``NAME`` behind a headless Service ``NAME``
  (``publishNotReadyAddresses``, so peers resolve while they start): pod ``i``
  is ``NAME-i.NAME``, and node ``i`` of the federation file (file order) runs
  there. The derived federation file gives every node that DNS name as its
  address, so the same logical file drives fl-sim, containers and the cluster.
- An init container maps the pod's ordinal to its node id (``node-ids`` in the
  ConfigMap) and copies that node's certificate and key, and only those, from
  the Secret into a memory volume the node reads.
- Each pod keeps ``--out`` (checkpoints, rounds.jsonl, summary.json) on its own
  PersistentVolumeClaim and always runs with ``--resume``, so a rescheduled or
  restarted pod continues from its last round. A node that finished idles
  (Kubernetes would restart an exited pod, forever) until the StatefulSet is deleted.
- Probes ask the gRPC health service. With mTLS (the default) they are exec
  probes running :mod:`flmesh.coordinator.probe` with the pod's own
  certificate, because the kubelet's native gRPC probe cannot present a client
  certificate; with ``--insecure`` readiness is the native ``grpc:`` probe.
- The aggregator, when the file has one, is its own StatefulSet and headless
  Service ``NAME-aggregator`` (one replica, its own volume and certificate).
"""

from __future__ import annotations

import re
from typing import Any

from flmesh.coordinator.deploy_compose import process_ids
from flmesh.topology import Federation

CONFIG_DIR = "/etc/flmesh/config"
IDENTITY_DIR = "/etc/flmesh/identity"
SECRETS_DIR = "/etc/flmesh/secrets"
STATE_DIR = "/var/lib/flmesh"
FINISHED = f"{STATE_DIR}/.finished"
#: A Kubernetes object name that stays valid with "-aggregator" and a pod ordinal appended.
NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
UID = 10001

# Run the process; once it exits 0, remember the federation it finished and idle (a StatefulSet
# restarts any container that exits). SIGTERM reaches the process, which checkpoints and stops.
_RUN = """\
if ! cmp -s {config}/federation.toml {finished}; then
  {launch} "$@" &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
  wait "$pid"; status=$?
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; status=$?; done
  trap - TERM INT
  [ "$status" -eq 0 ] || exit "$status"
  cp {config}/federation.toml {finished}
fi
echo "flmesh: {who} has finished; results in {state} (delete the StatefulSet to end the pod)"
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait "$!"; done
"""

# Who this pod is (the node of its ordinal, or the aggregator); its certificate and key only, copied
# from the Secret into a memory volume (mode 0600, owned by the process's user).
_IDENTITY = """\
set -eu
{choose}{copy}printf '%s\\n' "$node_id" > {identity}/id
echo "flmesh: $POD_NAME runs $node_id"
"""
_BY_ORDINAL = """\
ordinal=${{POD_NAME##*-}}
node_id=$(sed -n "$((ordinal + 1))p" {config}/node-ids)
if [ -z "$node_id" ]; then
  echo "flmesh: $POD_NAME: {config}/node-ids has no node for ordinal $ordinal" >&2; exit 1
fi
"""
_COPY = """\
cp {secrets}/ca.pem {identity}/ca.pem
cp "{secrets}/$node_id.pem" {identity}/node.pem
cp "{secrets}/$node_id.key" {identity}/node.key
chmod 0600 {identity}/node.key
"""


class K8sError(ValueError):
    """The federation or a flag does not fit Kubernetes; one line."""


def default_name(federation: Federation) -> str:
    """A Kubernetes name from the federation's name: lower case, '-' for anything else."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", federation.name.lower()).strip("-")[:40].strip("-")
    return cleaned or "flmesh"


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise K8sError(f"--name {name!r}: expected 1-40 lower-case letters, digits or '-' (not at either "
                       "end): it names the StatefulSet, its Service and its pods")
    return name


def addresses(federation: Federation, name: str, port: int) -> dict[str, str]:
    """Each process's address in the cluster: pod ``i`` of the StatefulSet for node ``i``, pod 0 of
    ``NAME-aggregator`` for the aggregator (names relative to the namespace)."""
    check_name(name)
    out = {node_id: f"{name}-{i}.{name}:{port}" for i, node_id in enumerate(federation.node_ids)}
    if federation.aggregator is not None:
        process_ids(federation)  # refuses a node named like the aggregator
        out["aggregator"] = f"{name}-aggregator-0.{name}-aggregator:{port}"
    return out


def _labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "flmesh", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def _probe(port: int, service: str, tls: bool, finished: bool, period: int, failures: int) -> dict[str, Any]:
    command = ["/opt/flmesh/bin/python", "-m", "flmesh.coordinator.probe", f"127.0.0.1:{port}",
               "--service", service]
    if tls:
        command += ["--tls-ca", f"{IDENTITY_DIR}/ca.pem", "--tls-cert", f"{IDENTITY_DIR}/node.pem",
                    "--tls-key", f"{IDENTITY_DIR}/node.key"]
    if finished:
        command += ["--finished-file", FINISHED]
    return {"exec": {"command": command}, "periodSeconds": period, "timeoutSeconds": 10,
            "failureThreshold": failures}


def _probes(port: int, service: str, tls: bool) -> dict[str, Any]:
    readiness = (_probe(port, service, tls, False, 10, 3) if tls else
                 {"grpc": {"port": port, "service": service}, "periodSeconds": 10, "timeoutSeconds": 5,
                  "failureThreshold": 3})
    return {"startupProbe": _probe(port, service, tls, True, 5, 60),  # up to 5 min to load data and serve
            "livenessProbe": _probe(port, service, tls, True, 20, 3), "readinessProbe": readiness}


def _security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


def statefulset(federation: Federation, *, name: str, image: str, port: int, tls: bool, storage: str,
                cpu: str, memory: str, aggregator: bool = False) -> dict[str, Any]:
    """The StatefulSet of the nodes (``aggregator``: of the aggregator)."""
    sts = f"{name}-aggregator" if aggregator else name
    component = "aggregator" if aggregator else "node"
    service = "flmesh.v1.Aggregator" if aggregator else "flmesh.v1.Peer"
    flags = ["--federation", f"{CONFIG_DIR}/federation.toml", "--listen", f"0.0.0.0:{port}",
             "--out", STATE_DIR, "--resume"]
    flags += (["--tls-ca", f"{IDENTITY_DIR}/ca.pem", "--tls-cert", f"{IDENTITY_DIR}/node.pem", "--tls-key",
               f"{IDENTITY_DIR}/node.key"] if tls else ["--insecure"])
    launch = "fl-node --role aggregator" if aggregator else f'fl-node --id "$(cat {IDENTITY_DIR}/id)"'
    script = _RUN.format(config=CONFIG_DIR, finished=FINISHED, launch=launch, state=STATE_DIR,
                         who=f"$(cat {IDENTITY_DIR}/id)")
    choose = "node_id=aggregator\n" if aggregator else _BY_ORDINAL.format(config=CONFIG_DIR)
    copy = _COPY.format(secrets=SECRETS_DIR, identity=IDENTITY_DIR) if tls else ""
    init_mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                   {"name": "identity", "mountPath": IDENTITY_DIR}]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{name}-config"}},
        {"name": "identity", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "tmp", "emptyDir": {}}]
    if tls:
        secret = f"{name}-aggregator-tls" if aggregator else f"{name}-node-tls"
        volumes.append({"name": "tls", "secret": {"secretName": secret, "defaultMode": 0o440}})
        init_mounts.append({"name": "tls", "mountPath": SECRETS_DIR, "readOnly": True})
    init = {"name": "identity", "image": image,
            "command": ["/bin/sh", "-c", _IDENTITY.format(choose=choose, copy=copy, identity=IDENTITY_DIR)],
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "volumeMounts": init_mounts, "securityContext": _security(),
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}}
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "identity", "mountPath": IDENTITY_DIR, "readOnly": True},
              {"name": "state", "mountPath": STATE_DIR}, {"name": "tmp", "mountPath": "/tmp"}]
    container = {
        "name": component, "image": image, "command": ["/bin/sh", "-c", script, "fl-node"], "args": flags,
        "ports": [{"name": "grpc", "containerPort": port, "protocol": "TCP"}],
        **_probes(port, service, tls),
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": mounts, "securityContext": _security(),
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False, "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": 30,
        "initContainers": [init],
        "containers": [container], "volumes": volumes,
    }
    labels = _labels(name, component)
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": sts, "labels": labels},
        "spec": {
            "serviceName": sts, "replicas": 1 if aggregator else len(federation.nodes),
            "podManagementPolicy": "Parallel",  # every node at once: they wait for each other anyway
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "volumeClaimTemplates": [{
                "metadata": {"name": "state", "labels": labels},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}},
            }],
        },
    }


def headless_service(name: str, port: int, aggregator: bool = False) -> dict[str, Any]:
    """The headless Service that gives every pod of a StatefulSet its stable DNS name."""
    svc = f"{name}-aggregator" if aggregator else name
    labels = _labels(name, "aggregator" if aggregator else "node")
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc, "labels": labels},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels,
                     "ports": [{"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"}]}}


def disruption_budget(name: str) -> dict[str, Any]:
    """At most one node away at a time for voluntary disruptions (drains): a round waits on its peers."""
    labels = _labels(name, "node")
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "labels": labels},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}}


def manifests(federation: Federation, *, name: str, image: str, port: int, tls: bool = True,
              storage: str = "1Gi", cpu: str = "500m", memory: str = "1Gi", namespace: str | None = None,
              extra_config: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Every file of the kustomize layout: file name -> object.

    The kustomization generates the ConfigMap ``NAME-config`` from ``federation.toml``,
    ``node-ids`` (and ``extra_config`` files, e.g. a graph file) and, with ``tls``, the Secrets
    ``NAME-node-tls`` (ca.pem and every node's pem and key) and ``NAME-aggregator-tls`` from the
    files in ``certs/``; the caller writes those files."""
    check_name(name)
    addresses(federation, name, port)
    files: dict[str, dict[str, Any]] = {
        "service.yaml": headless_service(name, port),
        "statefulset.yaml": statefulset(federation, name=name, image=image, port=port, tls=tls,
                                        storage=storage, cpu=cpu, memory=memory),
        "pdb.yaml": disruption_budget(name),
    }
    secrets: list[dict[str, Any]] = []
    if tls:
        node_files = ["certs/ca.pem", *(f"certs/{n}.{ext}" for n in federation.node_ids
                                        for ext in ("pem", "key"))]
        secrets.append({"name": f"{name}-node-tls", "files": node_files})
    if federation.aggregator is not None:
        files["aggregator-service.yaml"] = headless_service(name, port, aggregator=True)
        files["aggregator-statefulset.yaml"] = statefulset(federation, name=name, image=image, port=port,
                                                           tls=tls, storage=storage, cpu=cpu, memory=memory,
                                                           aggregator=True)
        if tls:
            secrets.append({"name": f"{name}-aggregator-tls",
                            "files": ["certs/ca.pem", "certs/aggregator.pem", "certs/aggregator.key"]})
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        **({"namespace": namespace} if namespace else {}),
        "resources": list(files),
        "configMapGenerator": [{"name": f"{name}-config",
                                "files": ["federation.toml", "node-ids", *extra_config]}],
    }
    if secrets:
        kustomization["secretGenerator"] = [{**s, "type": "Opaque"} for s in secrets]
    return {"kustomization.yaml": kustomization, **files}


def node_ids_file(federation: Federation) -> str:
    """``node-ids``: node i of the federation, for pod ordinal i, one per line."""
    return "".join(f"{node_id}\n" for node_id in federation.node_ids)
