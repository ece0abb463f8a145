"""``fl-deploy``: the same federation file, deployed beyond one machine.

    fl-deploy compose FILE --out DIR [--image IMAGE] [--port P] [--uid UID]      [common flags]
    fl-deploy k8s FILE --out DIR [--image IMAGE] [--port P] [--name NAME] [--namespace NS]
                      [--storage Q] [--cpu Q] [--memory Q]                       [common flags]
    fl-deploy systemd FILE --out DIR [--exec PATH]                               [common flags]
    common flags: [--certs DIR | --insecure] [--days N] [--force]

Each writes into DIR the deployment (:mod:`~flmesh.deploy.compose`,
:mod:`~flmesh.deploy.k8s`, :mod:`~flmesh.deploy.systemd`),
``federation.toml`` (the same federation with every process's address in this
deployment: the same logical file drives fl-sim, containers and a cluster) and
``certs/`` (``ca.pem`` and each process's certificate and key). Certificates come
from ``--certs DIR`` (checked, then copied; never ``ca.key``) or are issued from
a CA made in ``DIR/ca`` (kept out of every container: its key is ``DIR/ca/ca-private/ca.key``, which
``DIR/.gitignore`` names; keep it offline).
Nothing is overwritten without ``--force``; a process's results are never touched.

Exit codes: 0 written; 2 bad input (one line on stderr naming the file, flag or
node); 1 the files could not be written.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

from flmesh.cli.common import OneLineParser
from flmesh.config import Federation, FederationError, load_federation
from flmesh.deploy.compose import ComposeError
from flmesh.deploy.files import DeployError, Plan, certificates, derived, refuse_overwrite, write
from flmesh.deploy.k8s import K8sError
from flmesh.deploy.systemd import SystemdError

DEFAULT_IMAGE = "localhost/flmesh:latest"
IMAGE_UID = 10001  # the flmesh user of deploy/Containerfile
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")  # a ConfigMap key, and a plain file name


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="fl-deploy", description="Deploy a federation file beyond one machine: "
                           "compose, Kubernetes (kustomize) or systemd.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {"compose": "a compose file: one container per node (+ the aggregator), a private network",
             "k8s": "Kubernetes: a StatefulSet per process behind a headless Service, each pod with only "
                     "its own Secret; kustomize layout",
             "systemd": "one hardened systemd unit per process and machine"}
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("file", type=Path, metavar="FILE", help="federation file (TOML)")
        p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write into")
        p.add_argument("--force", action="store_true", help="replace files written before (results are kept)")
        p.add_argument("--certs", type=Path, metavar="DIR", help="use the CA certificate and the process "
                       "certificates in DIR (ca.pem, ID.pem, ID.key) instead of issuing new ones")
        p.add_argument("--insecure", action="store_true",
                       help="plaintext gRPC, no certificates (not for real use)")
        p.add_argument("--days", type=int, default=365, help="validity of issued certificates (default 365)")
        if name in ("compose", "k8s"):
            p.add_argument("--image", default=DEFAULT_IMAGE,
                           help=f"the flmesh image (default {DEFAULT_IMAGE})")
            p.add_argument("--port", type=int, default=50051, help="the port every process serves on "
                           "(default 50051)")
    compose = sub.choices["compose"]
    compose.add_argument("--uid", type=int, help="the user id the containers run as and that owns certs/ and "
                         f"state/ (default: {IMAGE_UID}, the image's user, when run as root; else yours)")
    k8s = sub.choices["k8s"]
    k8s.add_argument("--name", help="prefix of the StatefulSets, Services, Secrets and pods (default: the "
                     "federation's)")
    k8s.add_argument("--namespace", help="namespace for every object (default: kubectl's current one)")
    k8s.add_argument("--storage", default="1Gi", help="each process's volume for checkpoints and results")
    k8s.add_argument("--cpu", default="500m", help="CPU request per process (default 500m)")
    k8s.add_argument("--memory", default="1Gi", help="memory request and limit per process (default 1Gi)")
    sub.choices["systemd"].add_argument("--exec", dest="exec_path", default="/opt/flmesh/bin/fl-node",
                                        help="absolute path of fl-node (default /opt/flmesh/bin/fl-node)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from flmesh.pki.certs import CertError, check_days

    try:
        federation = load_federation(args.file)
        raw = tomllib.loads(args.file.read_text(encoding="utf-8"))
        if args.insecure and args.certs is not None:
            raise DeployError("--certs and --insecure contradict each other: choose one")
        check_days(args.days)
        plan = {"compose": _compose, "k8s": _k8s, "systemd": _systemd}[args.command](args, federation)
        graph = federation.topology.file
        config = derived(raw, federation, plan.addresses, graph.name if graph else None, args.command,
                         plan.data)
        if graph is not None:
            if graph.name in [*plan.files, "federation.toml"] or not _CONFIG_KEY.match(graph.name):
                raise DeployError(f"{federation.source}: [topology] file {graph.name!r}: rename the graph "
                                  "file (it is copied beside the deployment's files under its own name)")
            plan.files[graph.name] = graph.read_text(encoding="utf-8")
        plan.files["federation.toml"] = config
        certs = None if args.insecure else certificates(args.certs, plan)
        refuse_overwrite(args.out, plan, certs, args.force)
        write(args.out, plan, certs, args.days, federation.name)
    except (DeployError, FederationError, CertError, ComposeError, K8sError, SystemdError) as exc:
        print(f"fl-deploy: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except OSError as exc:  # mostly: --out cannot be written
        print(f"fl-deploy: error: {_os_error(exc, args.out)}", file=sys.stderr)
        return 1
    for note in _notes(federation, args.command):
        print(f"note: {note}")
    wrote = f"wrote {len(plan.files)} files to {args.out}"
    print(wrote if certs is None else f"{wrote}, certificates to {args.out / 'certs'}")
    print(plan.next_steps.format(out=args.out))
    return 0


# ---------------------------------------------------------------------------------------- subcommands
def _check_common(args: argparse.Namespace) -> None:
    if hasattr(args, "port") and not 0 < args.port < 65536:
        raise DeployError(f"--port {args.port}: expected 1 to 65535")
    if hasattr(args, "image") and (not args.image or any(c.isspace() for c in args.image)):
        raise DeployError(f"--image {args.image!r}: expected an image reference without spaces")


def _compose(args: argparse.Namespace, federation: Federation) -> Plan:
    from flmesh.deploy.compose import addresses, compose, data_mounts

    _check_common(args)
    root = os.geteuid() == 0
    uid = args.uid if args.uid is not None else (IMAGE_UID if root else os.geteuid())
    if not 0 < uid < 2**31:
        raise DeployError(f"--uid {uid}: expected a user id from 1")
    if not root and uid != os.geteuid():
        raise DeployError(f"--uid {uid}: only root can hand the files to another user; omit --uid")
    gid = uid if root else os.getegid()
    plan = Plan(addresses(federation, args.port), owner=(uid, gid) if root else None)
    mounts = data_mounts(federation)
    for node_id, (host, _) in mounts.items():
        if not Path(host).is_file():
            raise DeployError(f"{federation.source}: [nodes.{node_id}] data {host}: no such file here "
                              f"(it is mounted into {node_id}'s container)")
    plan.data = {node_id: inside for node_id, (_, inside) in mounts.items()}
    graph = federation.topology.file
    doc = compose(federation, image=args.image, port=args.port, tls=not args.insecure, user=f"{uid}:{gid}",
                  graph_file=graph.name if graph else None, data=mounts)
    plan.files["compose.yaml"] = _yaml(doc, "fl-deploy compose: one container per process of the federation")
    plan.dirs = [f"state/{node_id}" for node_id in plan.addresses]
    plan.next_steps = ("start it: cd {out} && podman-compose up -d   (or docker compose up -d); "
                       "results land in {out}/state/<id>/")
    return plan


def _k8s(args: argparse.Namespace, federation: Federation) -> Plan:
    from flmesh.deploy.k8s import ID_ANNOTATION, addresses, default_name, manifests

    _check_common(args)
    for flag in ("storage", "cpu", "memory"):
        if not _QUANTITY.match(getattr(args, flag)):
            raise DeployError(f"--{flag} {getattr(args, flag)!r}: expected a Kubernetes quantity, "
                              "e.g. 500m or 1Gi")
    if args.namespace is not None and not _DNS_LABEL.match(args.namespace):
        raise DeployError(f"--namespace {args.namespace!r}: expected a DNS label (lower-case letters, "
                          "digits, '-')")
    name = args.name or default_name(federation)
    plan = Plan(addresses(federation, name, args.port))
    graph = federation.topology.file
    docs = manifests(federation, name=name, image=args.image, port=args.port, tls=not args.insecure,
                     storage=args.storage, cpu=args.cpu, memory=args.memory, namespace=args.namespace,
                     extra_config=(graph.name,) if graph else ())
    for file_name, doc in docs.items():
        process = doc.get("metadata", {}).get("annotations", {}).get(ID_ANNOTATION)
        title = f"fl-deploy k8s: {file_name}" + (f" ({process})" if process else "")
        plan.files[file_name] = _yaml(doc, title)
    own = "" if args.insecure else f", which mounts only its own Secret {name}-i-tls"
    plan.next_steps = ("apply it: kubectl apply -k {out}   (render it without a cluster: kubectl kustomize "
                       f"{{out}}); node i of the file runs in pod {name}-i-0 of the StatefulSet "
                       f"{name}-i{own}")
    return plan


def _systemd(args: argparse.Namespace, federation: Federation) -> Plan:
    from flmesh.deploy.systemd import addresses, files

    if any(c.isspace() for c in args.exec_path):
        raise DeployError(f"--exec {args.exec_path!r}: expected a path without spaces")
    plan = Plan(addresses(federation))
    plan.files.update(files(federation, tls=not args.insecure, exec_path=args.exec_path))
    plan.next_steps = ("install on each machine: the process's flmesh-ID.service in /etc/systemd/system, "
                       "flmesh-ID.env as /etc/flmesh/ID.env, federation.toml (and a graph file) in "
                       "/etc/flmesh, its certificate, key and ca.pem from certs/ in /etc/flmesh/tls "
                       "(see each unit's header)")
    return plan


# ------------------------------------------------------------------------------------------- pieces
class _PlainDumper(yaml.SafeDumper):
    """Writes a value shared by two places twice, not as an anchor and an alias (``&id001``)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _yaml(doc: dict[str, Any], title: str) -> str:
    text = yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False, width=110)
    return f"# {title}. Generated by fl-deploy; edit the federation file and run it again.\n{text}"


def _os_error(exc: OSError, out: Path) -> str:
    reason = exc.strerror or str(exc)
    if not exc.filename:
        return reason
    name = Path(os.fsdecode(exc.filename))
    inside = name == out or out in name.parents
    return f"--out {out}: cannot write {name}: {reason}" if inside else f"{name}: {reason}"


def _notes(federation: Federation, kind: str) -> list[str]:
    notes = []
    if federation.data.root is not None:
        notes.append(f"[data] root {federation.data.root} must exist where every process runs (mount it)")
    if federation.model.weights is not None:
        notes.append(f"[model] weights {federation.model.weights} must exist where every process runs")
    if isinstance(federation.model.factory, str) and ":" in federation.model.factory:
        notes.append(f"[model] factory {federation.model.factory} must be importable where every process "
                     "runs (install its package in the image: deploy/README.md)")
    code = (("[training] learner", federation.training.learner), ("[data] source", federation.data.source))
    notes += [f"{key} {value} must be importable where every process runs (install its package)"
              for key, value in code if isinstance(value, str)]
    if kind != "compose":  # compose mounts each node's file into its container
        where = "that node's pod (mount it there)" if kind == "k8s" else "that node's machine"
        notes += [f"[nodes.{n.id}] data {n.data} must exist in {where}" for n in federation.nodes if n.data]
    return notes


if __name__ == "__main__":
    sys.exit(main())
