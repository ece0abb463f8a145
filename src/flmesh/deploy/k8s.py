"""Kubernetes manifests for a federation, kustomize layout (``fl-deploy k8s``).

Pure functions from a :class:`~flmesh.config.Federation` to manifests (dicts
for YAML); :mod:`flmesh.cli.fl_deploy` writes them with the derived
federation file and the certificates. Kubernetes is the engine beyond one
machine: it places, restarts and names the processes.

- Node ``i`` of the federation file (file order) is a StatefulSet ``NAME-i`` of
  one replica, whose pod ``NAME-i-0`` is ``NAME-i-0.NAME`` behind the headless
  Service ``NAME`` (``publishNotReadyAddresses``, so peers resolve while they
  start). The derived federation file gives every node that DNS name as its
  address, so the same logical file drives fl-sim, containers and the cluster.
- One StatefulSet per process, because a pod template is the same for every
  pod of a StatefulSet: that is what lets each pod mount only its own Secret
  ``NAME-i-tls`` (``ca.pem`` and that process's certificate and key; never the
  CA key). An init container copies the three files into a memory volume, the
  key with mode 0600 and owned by the process's user; the node container never
  mounts the Secret.
- Each pod keeps ``--out`` (checkpoints, rounds.jsonl, summary.json) on its own
  PersistentVolumeClaim and always runs with ``--resume``, so a rescheduled or
  restarted pod continues from its last round. A node that finished idles
  (Kubernetes would restart an exited pod, forever) until its StatefulSet is deleted.
- Probes ask the gRPC health service. With mTLS (the default) they are exec
  probes running :mod:`flmesh.cli.probe` with the pod's own
  certificate, because the kubelet's native gRPC probe cannot present a client
  certificate; with ``--insecure`` readiness is the native ``grpc:`` probe.
- The aggregator, when the file has one, is the StatefulSet and headless
  Service ``NAME-aggregator`` (one replica, its own volume and Secret).
"""

from __future__ import annotations

import re
from typing import Any

from flmesh.config import Federation
from flmesh.deploy.compose import process_ids

CONFIG_DIR = "/etc/flmesh/config"
IDENTITY_DIR = "/etc/flmesh/identity"
SECRETS_DIR = "/etc/flmesh/secrets"
STATE_DIR = "/var/lib/flmesh"
FINISHED = f"{STATE_DIR}/.finished"
#: A Kubernetes object name that stays valid with "-aggregator" or a node index, and "-0", appended.
NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
#: The label that tells one node's pod from the others (its value: the node's index in the file).
NODE_LABEL = "flmesh/node-index"
#: The annotation naming the process a StatefulSet and its pod run.
ID_ANNOTATION = "flmesh/node-id"
UID = 10001

# Run the process; once it exits 0, remember the federation it finished and idle (a StatefulSet
# restarts any container that exits). SIGTERM reaches the process, which checkpoints and stops.
_RUN = """\
if ! cmp -s {config}/federation.toml {finished}; then
  fl-node "$@" &
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

# The pod's own certificate and key, from its own Secret into a memory volume (mode 0600, owned by the
# process's user: a Secret volume is root's, readable by the pod's group).
_COPY = """\
set -eu
for f in ca.pem node.pem node.key; do cp "{secrets}/$f" "{identity}/$f"; done
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
                       "end): it names the StatefulSets, their Services and their pods")
    return name


def workloads(federation: Federation, name: str) -> dict[str, str]:
    """Each process's StatefulSet: ``NAME-i`` for node ``i`` (file order), ``NAME-aggregator``."""
    check_name(name)
    out = {node_id: f"{name}-{i}" for i, node_id in enumerate(federation.node_ids)}
    if federation.aggregator is not None:
        process_ids(federation)  # refuses a node named like the aggregator
        out["aggregator"] = f"{name}-aggregator"
    return out


def secret_name(workload: str) -> str:
    """The Secret of a process's StatefulSet ``workload``: its certificate and key, and ca.pem."""
    return f"{workload}-tls"


def addresses(federation: Federation, name: str, port: int) -> dict[str, str]:
    """Each process's address in the cluster: the one pod of its StatefulSet, named by the headless
    Service ``NAME`` (the nodes) or ``NAME-aggregator``; names relative to the namespace."""
    sts = workloads(federation, name)
    out = {node_id: f"{sts[node_id]}-0.{name}:{port}" for node_id in federation.node_ids}
    if federation.aggregator is not None:
        out["aggregator"] = f"{name}-aggregator-0.{name}-aggregator:{port}"
    return out


def _labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "flmesh", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def _probe(port: int, service: str, tls: bool, finished: bool, period: int, failures: int) -> dict[str, Any]:
    command = ["/opt/flmesh/bin/python", "-m", "flmesh.cli.probe", f"127.0.0.1:{port}",
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


def statefulset(federation: Federation, process: str, *, name: str, image: str, port: int, tls: bool,
                storage: str, cpu: str, memory: str) -> dict[str, Any]:
    """The StatefulSet of one process (a node id, or ``aggregator`` when the file has one): one
    replica, which mounts only that process's Secret."""
    aggregator = process == "aggregator" and federation.aggregator is not None
    names = workloads(federation, name)
    if process not in names:
        raise ValueError(f"{process!r}: not a process of federation {federation.name!r} "
                         f"(its processes: {', '.join(names)})")
    sts = names[process]
    component = "aggregator" if aggregator else "node"
    service = "flmesh.v1.Aggregator" if aggregator else "flmesh.v1.Peer"
    flags = ["--role", "aggregator"] if aggregator else ["--id", process]
    flags += ["--federation", f"{CONFIG_DIR}/federation.toml", "--listen", f"0.0.0.0:{port}",
              "--out", STATE_DIR, "--resume"]
    flags += (["--tls-ca", f"{IDENTITY_DIR}/ca.pem", "--tls-cert", f"{IDENTITY_DIR}/node.pem", "--tls-key",
               f"{IDENTITY_DIR}/node.key"] if tls else ["--insecure"])
    script = _RUN.format(config=CONFIG_DIR, finished=FINISHED, state=STATE_DIR, who=process)
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": f"{name}-config"}},
                                     {"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "state", "mountPath": STATE_DIR}, {"name": "tmp", "mountPath": "/tmp"}]
    init: list[dict[str, Any]] = []
    if tls:
        items = [{"key": "ca.pem", "path": "ca.pem"}, {"key": f"{process}.pem", "path": "node.pem"},
                 {"key": f"{process}.key", "path": "node.key"}]
        volumes += [{"name": "identity", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    {"name": "tls", "secret": {"secretName": secret_name(sts), "items": items,
                                               "defaultMode": 0o440}}]
        mounts.insert(1, {"name": "identity", "mountPath": IDENTITY_DIR, "readOnly": True})
        init.append({
            "name": "identity", "image": image,
            "command": ["/bin/sh", "-c", _COPY.format(secrets=SECRETS_DIR, identity=IDENTITY_DIR)],
            "volumeMounts": [{"name": "tls", "mountPath": SECRETS_DIR, "readOnly": True},
                             {"name": "identity", "mountPath": IDENTITY_DIR}],
            "securityContext": _security(),
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}})
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
        **({"initContainers": init} if init else {}),
        "containers": [container], "volumes": volumes,
    }
    labels = _labels(name, component)
    if not aggregator:  # the Service selects every node; each StatefulSet, its own pod
        labels[NODE_LABEL] = str(federation.node_ids.index(process))
    meta = {"labels": labels, "annotations": {ID_ANNOTATION: process}}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": sts, **meta},
        "spec": {
            "serviceName": sts if aggregator else name, "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": meta, "spec": pod},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "volumeClaimTemplates": [{
                "metadata": {"name": "state", "labels": labels},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}},
            }],
        },
    }


def headless_service(name: str, port: int, aggregator: bool = False) -> dict[str, Any]:
    """The headless Service that gives every pod of the nodes' StatefulSets (or the aggregator's) its
    stable DNS name."""
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

    ``statefulset-i.yaml`` is node ``i``'s StatefulSet. The kustomization generates the
    ConfigMap ``NAME-config`` from ``federation.toml`` (and ``extra_config`` files, e.g. a graph
    file) and, with ``tls``, one Secret per process, ``NAME-i-tls`` (``NAME-aggregator-tls``),
    from ``certs/ca.pem`` and that process's ``certs/ID.pem`` and ``certs/ID.key`` only; the
    caller writes those files."""
    sts = workloads(federation, name)
    kw: dict[str, Any] = {"name": name, "image": image, "port": port, "tls": tls, "storage": storage,
                          "cpu": cpu, "memory": memory}
    files: dict[str, dict[str, Any]] = {"service.yaml": headless_service(name, port),
                                        "pdb.yaml": disruption_budget(name)}
    files.update({f"statefulset-{i}.yaml": statefulset(federation, node_id, **kw)
                  for i, node_id in enumerate(federation.node_ids)})
    if federation.aggregator is not None:
        files["aggregator-service.yaml"] = headless_service(name, port, aggregator=True)
        files["aggregator-statefulset.yaml"] = statefulset(federation, "aggregator", **kw)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        **({"namespace": namespace} if namespace else {}),
        "resources": list(files),
        "configMapGenerator": [{"name": f"{name}-config", "files": ["federation.toml", *extra_config]}],
    }
    if tls:
        kustomization["secretGenerator"] = [
            {"name": secret_name(workload), "type": "Opaque",
             "files": ["certs/ca.pem", f"certs/{process}.pem", f"certs/{process}.key"]}
            for process, workload in sts.items()]
    return {"kustomization.yaml": kustomization, **files}
