"""A real multi-container federation: ``fl-deploy compose`` under podman-compose, and the pod
scripts of ``fl-deploy k8s`` run the way a kubelet would (``make test-deploy``).

Needs root, podman, podman-compose and the image (``deploy/test-deploy.sh`` installs the
tools and builds ``localhost/flmesh:latest`` first); skipped, saying why, when any is
missing (``FLMESH_DEPLOY_REQUIRED=1``, which test-deploy.sh sets, makes that a failure).
podman runs with the private configuration of ``deploy/build-image.sh`` (runc, explicit
ulimits, storage under ``FLMESH_PODMAN_DIR``). Every container and network a test makes is
named with ``FLMESH_DEPLOY_PREFIX`` and removed at its end. Four nodes, CWT with rewind,
mTLS on, the digits MLP with 16 hidden units; and examples/custom's image and nodes.toml, each
node's own data file mounted into its container only.

Waits poll what can be observed (container states, files on the volumes, probes) with
deadlines; no assertion bounds wall-clock time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flmesh.pki.certs import load_identity
from flmesh.reports.run_files import read_rows
from flmesh.runtime.checkpoint import CHECKPOINT

from conftest import REPO, wait_until

pytestmark = pytest.mark.deploy

IMAGE = os.environ.get("FLMESH_IMAGE", "localhost/flmesh:latest")
FL_DEPLOY = str(Path(sys.executable).with_name("fl-deploy"))
IDS = ["alpha", "bravo", "charlie", "delta"]
ROUNDS = 40
PREFIX = os.environ.get("FLMESH_DEPLOY_PREFIX", "fldt")
REQUIRED = os.environ.get("FLMESH_DEPLOY_REQUIRED") == "1"


def _podman_env() -> dict[str, str]:
    env = dict(os.environ)
    conf = Path(os.environ.get("FLMESH_PODMAN_DIR", "/var/tmp/flmesh-podman"))
    if "CONTAINERS_CONF" not in env and (conf / "containers.conf").exists():
        env["CONTAINERS_CONF"] = str(conf / "containers.conf")
        env["CONTAINERS_STORAGE_CONF"] = str(conf / "storage.conf")
    return env


ENV = _podman_env()


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, env=ENV, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}")
    return done


def _unusable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (rootful podman, as deploy/test-deploy.sh runs it)"
    for tool in ("podman", "podman-compose"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (deploy/test-deploy.sh installs it)"
    info = podman("info", check=False, timeout=60)
    if info.returncode != 0:
        return f"podman is unusable here: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        return f"no image {IMAGE}: run deploy/build-image.sh (deploy/test-deploy.sh does)"
    return None


@pytest.fixture(scope="module", autouse=True)
def _podman_usable() -> None:
    reason = _unusable()
    if reason and REQUIRED:
        pytest.fail(f"FLMESH_DEPLOY_REQUIRED=1 but {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)


FEDERATION = f"""
[federation]
name = "deploy-test"
seed = 3
rounds = {ROUNDS}
round_timeout_s = 60

[topology]
graph = "ring"
schedule = "cwt"

[rewind]
mode = "previous"
lambda = 0.1

[training]
epochs = 1
batch_size = 16
lr = 0.05

[data]
dataset = "digits"
alpha = 0.5

[model]
name = "mlp"
hidden = [16]
""" + "".join(f"\n[nodes.{i}]\n" for i in IDS)


class Compose:
    """One fl-deploy compose deployment under podman-compose, torn down (containers, network) at exit:
    FEDERATION on ``image``, or the federation file ``fed`` with the nodes ``ids``."""

    def __init__(self, root: Path, fed: Path | None = None, ids: list[str] = IDS, image: str = IMAGE):
        self.project = f"{PREFIX}c{uuid.uuid4().hex[:8]}"
        self.dir = root / self.project
        self.ids = ids
        if fed is None:
            fed = root / "federation.toml"
            fed.write_text(FEDERATION)
        done = subprocess.run([FL_DEPLOY, "compose", str(fed), "--out", str(self.dir), "--image", image],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    def compose(self, *args: str, timeout: float = 300) -> None:
        done = subprocess.run(["podman-compose", *args], cwd=self.dir, capture_output=True, text=True,
                              env=ENV, timeout=timeout)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def container(self, node_id: str) -> str:
        return f"{self.project}_{node_id}_1"

    def state(self, node_id: str) -> dict:
        inspected = json.loads(podman("inspect", self.container(node_id)).stdout)[0]
        return inspected["State"] | {"RestartCount": inspected.get("RestartCount", 0)}

    def logs(self, node_id: str, tail: int = 3000) -> str:
        done = podman("logs", self.container(node_id), check=False)
        return (done.stdout + done.stderr)[-tail:]

    def wait_all_exited(self, timeout: float) -> None:
        def exited() -> bool:
            return all(self.state(i)["Status"] == "exited" for i in self.ids)
        try:
            wait_until(exited, timeout=timeout, interval=1)
        except AssertionError:
            raise AssertionError("not every container finished: " + "\n".join(
                f"{i}: {self.state(i)['Status']}\n{self.logs(i)}" for i in self.ids)) from None

    def results(self, node_id: str) -> tuple[list[dict], dict]:
        out = self.dir / "state" / node_id
        return read_rows(out / "rounds.jsonl"), json.loads((out / "summary.json").read_text())

    def down(self) -> None:
        subprocess.run(["podman-compose", "down", "-t", "5"], cwd=self.dir, capture_output=True, env=ENV,
                       timeout=300)
        for node_id in self.ids:
            podman("rm", "-f", "-t", "0", self.container(node_id), check=False)
        podman("network", "rm", "-f", f"{self.project}_flmesh", check=False)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Compose]:
    deployed = Compose(tmp_path)
    try:
        yield deployed
    finally:
        deployed.down()


def _healthy(deployment: Compose, node_id: str) -> bool:
    return podman("healthcheck", "run", deployment.container(node_id), check=False).returncode == 0


def test_a_compose_federation_runs_to_the_end_with_results_on_its_volumes(deployment: Compose):
    deployment.compose("up", "-d")
    # the compose file's health check (the probe, over mTLS with the node's own certificate) says healthy
    wait_until(lambda: _healthy(deployment, "alpha"), timeout=180, interval=0.5)
    deployment.wait_all_exited(timeout=600)
    for node_id in IDS:
        state = deployment.state(node_id)
        assert state["ExitCode"] == 0, deployment.logs(node_id)
        rows, summary = deployment.results(node_id)
        assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
        assert summary["node"] == node_id and summary["rounds"] == summary["rounds_planned"] == ROUNDS
        assert not summary["interrupted"] and summary["resumed_after"] == []
        assert summary["final"]["accuracy"] > 0.3, summary["final"]
        # every round rewound to the source (FedRewind), over mTLS between containers named by their ids
        assert all(r["nodes"][node_id]["rewound_to"] for r in rows[1:]), rows[1]["nodes"]


def test_a_crashed_container_restarts_and_resumes_from_its_checkpoint(deployment: Compose):
    """SIGKILL alpha's process from the host mid-run (what the OOM killer or a crash does): podman's
    ``restart: on-failure`` starts the container again and ``--resume`` continues from the
    checkpoint on its volume. (``podman kill`` would count as a stop by the user, after which
    podman applies no restart policy.)

    The kill comes at the worst moment for the results: as soon as a round's checkpoint is on
    the volume and newer than rounds.jsonl. The resumed process starts after that checkpoint, so
    the round's row must already be there: every round has its row in the end."""
    deployment.compose("up", "-d")
    state = deployment.dir / "state" / "alpha"
    rounds_file, checkpoint = state / "rounds.jsonl", state / CHECKPOINT
    wait_until(lambda: rounds_file.exists() and len(read_rows(rounds_file)) >= 3, timeout=300, interval=0.05)
    pid = deployment.state("alpha")["Pid"]  # asked before: the kill must follow the observation at once

    def checkpoint_ahead() -> bool:
        try:
            return checkpoint.stat().st_mtime_ns > rounds_file.stat().st_mtime_ns
        except FileNotFoundError:
            return False

    try:
        wait_until(checkpoint_ahead, timeout=300, interval=0.001)
    except AssertionError:
        raise AssertionError(f"alpha's {CHECKPOINT} was never newer than its rounds.jsonl while it ran "
                             f"({len(read_rows(rounds_file))} rows)") from None
    os.kill(pid, 9)
    killed_after = len(read_rows(rounds_file))
    assert killed_after < ROUNDS, "the run ended before the kill: raise ROUNDS"
    wait_until(lambda: deployment.state("alpha")["RestartCount"] >= 1, timeout=60, interval=0.2)
    deployment.wait_all_exited(timeout=600)
    rows, summary = deployment.results("alpha")
    resumed = summary["resumed_after"]
    missing = sorted(set(range(1, ROUNDS + 1)) - {r["round"] for r in rows})
    assert not missing, (f"killed with {killed_after} rows on the volume, alpha resumed after round "
                         f"{resumed} and has no row for rounds {missing}: its checkpoint got ahead of its "
                         "results")
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1)), "alpha's rounds.jsonl continues"
    assert resumed and 1 <= resumed[0] <= killed_after, summary
    assert f"resuming after round {resumed[0]}" in deployment.logs("alpha", tail=10**7)
    for node_id in IDS:
        assert deployment.state(node_id)["ExitCode"] == 0, deployment.logs(node_id)
        rows, summary = deployment.results(node_id)
        assert summary["rounds"] == summary["rounds_planned"] == ROUNDS, (node_id, summary)
        assert not summary["interrupted"], summary


# ------------------------------------------------------------ a user's package, each node's own file
CUSTOM_IDS = ["wave0", "wave1", "wave2"]
CUSTOM_IMAGE = f"localhost/{PREFIX}-custom:latest"


def _wheel(package: Path, out: Path) -> None:
    """The package's wheel in ``out``, built with this environment's setuptools when it can make
    wheels (offline), else with one pip fetches."""
    offline = subprocess.run([sys.executable, "-c", "import setuptools.command.bdist_wheel"],
                             capture_output=True).returncode == 0
    flags = ["--no-build-isolation"] if offline else []
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *flags, "--wheel-dir", str(out)]
    done = subprocess.run([*command, str(package)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def custom_example(tmp_path: Path) -> Iterator[Path]:
    """A copy of examples/custom with its data files written and its image built (removed after)."""
    copy = tmp_path / "custom"
    shutil.copytree(REPO / "examples" / "custom", copy,
                    ignore=shutil.ignore_patterns("runs", "data", "dist", "build", "*.egg-info"))
    _wheel(copy, copy / "dist")
    podman("build", "--format", "docker", "--network=none", "--build-arg", f"FLMESH_IMAGE={IMAGE}",
           "-t", CUSTOM_IMAGE, "-f", str(copy / "Containerfile"), str(copy), timeout=600)
    done = subprocess.run([sys.executable, str(copy / "make_data.py"), str(copy / "data")],
                          capture_output=True, text=True, env={**ENV, "PYTHONPATH": str(copy)}, timeout=120)
    assert done.returncode == 0, done.stderr
    try:
        yield copy
    finally:
        podman("rmi", "-f", CUSTOM_IMAGE, check=False)


def test_each_node_trains_on_its_own_file_in_its_own_container(tmp_path: Path, custom_example: Path):
    """examples/custom's Containerfile on the flmesh image (the user's package installed), and its
    nodes.toml (three nodes, each on its own .npz file) deployed by fl-deploy compose: each file is
    mounted into its node's container only."""
    example = custom_example
    deployment = Compose(tmp_path, example / "nodes.toml", CUSTOM_IDS, CUSTOM_IMAGE)
    try:
        services = yaml.safe_load((deployment.dir / "compose.yaml").read_text())["services"]
        for node_id, service in services.items():
            data = [v for v in service["volumes"] if "/etc/flmesh/data/" in v]
            assert data == [f"{example / 'data' / node_id}.npz:/etc/flmesh/data/{node_id}.npz:ro"], data
        deployment.compose("up", "-d")
        for node_id in CUSTOM_IDS:  # what the running container has: its own file, no other node's
            mounts = json.loads(podman("inspect", deployment.container(node_id)).stdout)[0]["Mounts"]
            data = {m["Destination"]: m["Source"] for m in mounts if "/etc/flmesh/data" in m["Destination"]}
            own = f"{node_id}.npz"
            assert data == {f"/etc/flmesh/data/{own}": str(example / "data" / own)}, mounts
        deployment.wait_all_exited(timeout=900)
        for node_id in CUSTOM_IDS:
            assert deployment.state(node_id)["ExitCode"] == 0, deployment.logs(node_id)
            rows, summary = deployment.results(node_id)
            assert [r["round"] for r in rows] == [1, 2, 3, 4] and not summary["interrupted"]
            data = summary["config"]["data"]
            assert data["own"] and data["origin"] == f"/etc/flmesh/data/{node_id}.npz", data
            assert (data["train_samples"], data["test_samples"]) == (240, 60)
            # the package's model and learner ran in the container: its metric is in every row
            assert all(0 <= r["nodes"][node_id]["metrics"]["macro_f1"] <= 1 for r in rows), rows[-1]
    finally:
        deployment.down()


# ------------------------------------------------------------------- the Kubernetes pods, kubelet-style
class Pods:
    """The node pods of ``fl-deploy k8s`` run as a kubelet would, with podman: for node ``i`` the one
    pod ``NAME-i-0`` of its StatefulSet ``NAME-i``, the init container, then the node container,
    with the template's command, args, user and volumes (the ConfigMap as a folder, and the pod's own
    Secret as a folder holding the items its volume asks for), on a network where ``NAME-i-0.NAME``
    resolves."""

    def __init__(self, root: Path, tls: bool = True):
        self.name = f"{PREFIX}k{uuid.uuid4().hex[:8]}"
        self.root = root
        fed = root / "federation.toml"
        fed.write_text(FEDERATION)
        out = root / "k8s"
        flags = ["--name", self.name, "--image", IMAGE] + ([] if tls else ["--insecure"])
        done = subprocess.run([FL_DEPLOY, "k8s", str(fed), "--out", str(out), *flags],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        self.pods = [yaml.safe_load((out / f"statefulset-{i}.yaml").read_text())["spec"]["template"]["spec"]
                     for i in range(len(IDS))]
        context = self.pods[0]["securityContext"]
        self.user = f"{context['runAsUser']}:{context['runAsGroup']}"
        config = root / "config"  # the ConfigMap, as the kubelet projects it
        config.mkdir()
        shutil.copy(out / "federation.toml", config / "federation.toml")
        self.volumes: dict[str, Path] = {"config": config}
        for ordinal, pod in enumerate(self.pods):  # each pod's own Secret: readable by the pod's fsGroup
            for volume in pod["volumes"]:
                if "secret" not in volume:
                    continue
                secret = root / f"pod{ordinal}" / volume["name"]
                secret.mkdir(parents=True)
                for item in volume["secret"]["items"]:
                    shutil.copy(out / "certs" / item["key"], secret / item["path"])
                    os.chown(secret / item["path"], 0, 10001)
                    os.chmod(secret / item["path"], volume["secret"]["defaultMode"])
        self.network = f"{self.name}-net"
        podman("network", "create", self.network)
        self.containers: list[str] = []

    def pod(self, ordinal: int) -> str:
        return f"{self.name}-{ordinal}-0"

    def _volume_args(self, container: dict, ordinal: int) -> list[str]:
        args = []
        for m in container["volumeMounts"]:
            source = self.volumes.get(m["name"])
            if source is None:  # the Secret, emptyDir and the volume claim: one folder per pod
                source = self.root / f"pod{ordinal}" / m["name"]
                if not source.exists():
                    source.mkdir(parents=True)
                    os.chown(source, 10001, 10001)
            args += ["-v", f"{source}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}"]
        return args

    def start(self, ordinal: int) -> None:
        pod, spec = self.pod(ordinal), self.pods[ordinal]
        for init in spec.get("initContainers", []):
            podman("run", "--rm", "--user", self.user, "--network", "none",
                   *self._volume_args(init, ordinal), "--entrypoint", init["command"][0], IMAGE,
                   *init["command"][1:])
        main = spec["containers"][0]
        self.containers.append(pod)
        podman("run", "-d", "--name", pod, "--user", self.user, "--network", self.network,
               "--network-alias", f"{pod}.{self.name}", "--hostname", pod,
               *self._volume_args(main, ordinal), "--entrypoint", main["command"][0], IMAGE,
               *main["command"][1:], *main["args"])

    def probe(self, ordinal: int, kind: str) -> int:
        command = self.pods[ordinal]["containers"][0][kind]["exec"]["command"]
        return podman("exec", self.pod(ordinal), *command, check=False).returncode

    def state_dir(self, ordinal: int) -> Path:
        return self.root / f"pod{ordinal}" / "state"

    def logs(self) -> str:
        parts = []
        for c in self.containers:
            done = podman("logs", c, check=False)
            parts.append(f"--- {c}\n" + (done.stdout + done.stderr)[-2000:])
        return "\n".join(parts)

    def remove(self) -> None:
        for c in self.containers:
            podman("rm", "-f", "-t", "5", c, check=False)
        podman("network", "rm", "-f", self.network, check=False)


def test_the_statefulset_pods_run_the_federation_and_idle_when_finished(tmp_path: Path):
    pods = Pods(tmp_path)
    try:
        pods.start(0)
        # while it waits for its peers, node 0 serves: every probe passes, over mTLS
        wait_until(lambda: pods.probe(0, "readinessProbe") == 0, timeout=180, interval=0.5)
        assert pods.probe(0, "livenessProbe") == 0
        for ordinal in range(1, len(IDS)):
            pods.start(ordinal)
        # every pod got only its own key, from its own Secret, and serves over mTLS as its node
        for ordinal, node_id in enumerate(IDS):
            for volume in ("tls", "identity"):
                folder = tmp_path / f"pod{ordinal}" / volume
                assert sorted(p.name for p in folder.iterdir()) == ["ca.pem", "node.key", "node.pem"]
            identity = tmp_path / f"pod{ordinal}" / "identity"
            assert load_identity(identity / "node.pem", identity / "node.key", identity / "ca.pem",
                                 expected_id=node_id).node_id == node_id
        finished = [pods.state_dir(i) / ".finished" for i in range(len(IDS))]
        try:
            wait_until(lambda: all(f.exists() for f in finished), timeout=600, interval=1)
        except AssertionError:
            raise AssertionError(pods.logs()) from None
        for ordinal, node_id in enumerate(IDS):
            summary = json.loads((pods.state_dir(ordinal) / "summary.json").read_text())
            assert summary["node"] == node_id and summary["rounds"] == ROUNDS, summary
            assert summary["missing_peers"] == [], summary
            state = json.loads(podman("inspect", pods.pod(ordinal)).stdout)[0]["State"]
            assert state["Status"] == "running", "a finished node idles instead of exiting"
            # liveness and startup pass on a finished node; readiness does not (it serves no more)
            assert pods.probe(ordinal, "livenessProbe") == 0
            assert pods.probe(ordinal, "startupProbe") == 0
            assert pods.probe(ordinal, "readinessProbe") == 1
        # SIGTERM (a pod deletion) ends an idle pod: it exits 0 on the signal, not 137 after the
        # grace period's SIGKILL
        podman("stop", "-t", "60", pods.pod(0))
        state = json.loads(podman("inspect", pods.pod(0)).stdout)[0]["State"]
        assert state["Status"] == "exited" and state["ExitCode"] == 0, state
    finally:
        pods.remove()
