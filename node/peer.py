"""One federation node: its gRPC server, its data and model, and the round loop.

This is where the learning wing (data, models, trainer) meets the wire wing
(codec, channels, servicer, client). :class:`Node` is also the embeddable API:

    node = Node.from_federation(federation, "node0", listen="0.0.0.0:50051")
    node.start()
    node.connect({"node1": "10.0.0.2:50051", ...})
    node.run()          # all rounds of the federation
    node.stop()

Threading: ``start`` runs gRPC handlers on a thread pool; ``run``/``run_round``
block the calling thread and must be called from one thread at a time. The
handlers never touch the node's own model: they work on fresh copies.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from torch import nn

from flmesh.node import codec, extras
from flmesh.node.aggregator_client import AggregatorClient
from flmesh.node.channels import bind, make_server
from flmesh.node.client import PeerClient, PeerError, with_retry
from flmesh.node.client_terms import aggregate_uv, client_alpha, others_terms
from flmesh.node.codec import DEFAULT_CHUNK_BYTES, EncodedModel, ModelMeta
from flmesh.node.data import SEED_MODEL, SEED_TRAIN, NodeData, derive_seed, federation_data
from flmesh.node.device import select_device
from flmesh.node.inbox import Inbox, InboxKey
from flmesh.node.models import build_model
from flmesh.node.objectives import dkd_loss, fedcurv_penalty, fisher_diagonal, make_objective
from flmesh.node.servicer import PeerServicer, UnknownPeerError
from flmesh.node.trainer import EvalResult, Regularizer, TrainStats, evaluate, train
from flmesh.topology import Federation, RewindConfig, Schedule, TrainingConfig, rewind_target
from flmesh.v1 import peer_pb2_grpc

log = logging.getLogger("flmesh.node")

SERVICE_NAME = "flmesh.v1.Peer"


@dataclass(frozen=True)
class RoundReport:
    """What one node did in one round. Accuracies are fractions in [0, 1]."""

    node: str
    round: int
    source: str | None
    destination: str | None
    received: bool
    missing: str | None  # the source whose model never came, if any
    delivered: bool
    train_size: int  # samples in the node's training split
    train: TrainStats
    local: EvalResult
    wall_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    received_accuracy: float | None = None  # the received model on this node's test split
    rewound_to: str | None = None  # where the rewind phase ran (None: no rewind this round)


@dataclass(frozen=True)
class StarReport:
    """One node in one round of a star federation (with an aggregator).

    ``selected`` False: the aggregator did not sample this node; nothing else is set.
    ``start`` is the global model the node started from, ``local`` its model after
    training, both on this node's test split.
    """

    node: str
    round: int
    selected: bool
    submitted: bool = False
    late: bool = False
    train: TrainStats | None = None
    start: EvalResult | None = None
    local: EvalResult | None = None
    rewound_to: str | None = None
    wall_s: float = 0.0
    notes: tuple[str, ...] = ()


class Node:
    """A federation node; see the module docstring for the life cycle."""

    def __init__(self, node_id: str, *, model: nn.Module, data: NodeData, training: TrainingConfig,
                 schedule: Schedule, rounds: int, federation: str = "flmesh", seed: int = 0,
                 peers: Mapping[str, str | None] | None = None, listen: str = "127.0.0.1:0",
                 round_timeout_s: float = 120.0, max_model_bytes: int = 512 * 2**20,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, architecture: str = "",
                 device: torch.device | None = None, index: int = 0,
                 rewind: RewindConfig | None = None, node_ids: Sequence[str] = (),
                 neighbours: Sequence[str] = ()):
        self.node_id = node_id
        self.federation = federation
        self.architecture = architecture
        self.model = model
        self.data = data
        self.training = training
        self.schedule = schedule
        self.rounds = rounds
        self.seed = seed
        self.index = index
        self.listen = listen
        self.round_timeout_s = round_timeout_s
        self.max_model_bytes = max_model_bytes
        self.chunk_bytes = chunk_bytes
        self.device = device or torch.device("cpu")
        self.rewind = rewind or RewindConfig()
        self.node_ids = list(node_ids) or sorted({node_id, *(peers or {})})
        self._unreachable: set[str] = set()
        # Decentralized FedCurv: the latest (Fisher diagonal, parameters) heard from each peer.
        self.neighbours = list(neighbours)
        self._curvature: dict[str, tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
        self._params_spec = extras.trainable_spec(model)
        self.objective = make_objective(training.objective,
                                        class_proportions=data.train.label_counts())
        self._fedcurv_own: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        self.address: str | None = None
        self.inbox = Inbox()
        self._peers: dict[str, str | None] = dict(peers or {})
        self._clients: dict[str, PeerClient] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._state = "starting"
        self._round = 0
        self._last_accuracy = 0.0
        self._server = None
        self._health = health.HealthServicer()
        self._spec = codec.model_spec(model.state_dict())
        self.model.to(self.device)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_federation(cls, federation: Federation, node_id: str, *, data: NodeData | None = None,
                        listen: str | None = None, peers: Mapping[str, str | None] | None = None,
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Node:
        """Build node ``node_id`` of ``federation``: its data share, M_0 and schedule.

        Every node starts from the same initial model (seeded by the federation
        seed). ``data`` skips loading when the caller already split the data set.
        """
        cfg = federation.node(node_id)
        if data is None:
            data = federation_data(federation)[node_id]
        model = build_model(federation.model, data.train.input_shape, data.train.num_classes,
                            seed=derive_seed(federation.seed, SEED_MODEL))
        if peers is None:
            peers = {n.id: n.address for n in federation.nodes if n.id != node_id}
        return cls(node_id, model=model, data=data, training=cfg.training,
                   schedule=federation.schedule(), rounds=federation.rounds,
                   federation=federation.name, seed=federation.seed, peers=peers,
                   listen=listen or cfg.address or "127.0.0.1:0",
                   round_timeout_s=federation.round_timeout_s,
                   max_model_bytes=int(federation.max_model_mib * 2**20), chunk_bytes=chunk_bytes,
                   architecture=federation.model.name,
                   device=select_device(cfg.training.device), index=cfg.index,
                   rewind=federation.rewind, node_ids=federation.node_ids,
                   neighbours=_neighbours(federation, node_id))

    # ------------------------------------------------------------------ life cycle
    def start(self) -> str:
        """Start serving; returns the bound address (HOST:PORT). Non-blocking."""
        server = make_server()
        peer_pb2_grpc.add_PeerServicer_to_server(PeerServicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        port = bind(server, self.listen)
        server.start()
        self._server = server
        host = self.listen.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._set_state("idle")
        return self.address

    def connect(self, peers: Mapping[str, str]) -> None:
        """Set or update peers' addresses (node id -> HOST:PORT)."""
        with self._lock:
            for peer_id, address in peers.items():
                if peer_id == self.node_id:
                    continue
                old = self._clients.pop(peer_id, None)
                if old is not None:
                    old.close()
                self._peers[peer_id] = address

    def mark_done(self) -> None:
        """Say (in ``Status``) that this node needs nothing more from its peers.

        Not set by the last round itself: a caller may still evaluate on its peers
        after it (fl-node's --cross-eval), and peers keep serving until all are done."""
        self._set_state("done")

    def cancel(self) -> None:
        """Make a running round loop end soon (waits stop, no new round starts). Thread-safe."""
        self._stop.set()
        self.inbox.wake()

    def stop(self, grace: float = 1.0) -> None:
        """Stop the round loop and the server; idempotent. Blocks up to ``grace`` seconds."""
        self.cancel()
        self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
        self._set_state("stopped")

    def __enter__(self) -> Node:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers
    def _set_state(self, state: str) -> None:
        with self._lock:
            self._state = state

    def client(self, peer_id: str) -> PeerClient:
        """The (cached) client for ``peer_id``; raises UnknownPeerError for a stranger."""
        with self._lock:
            if peer_id in self._clients:
                return self._clients[peer_id]
            if peer_id not in self._peers:
                raise UnknownPeerError(f"{self.node_id}: unknown peer {peer_id!r}")
            address = self._peers[peer_id]
            if not address:
                raise UnknownPeerError(f"{self.node_id}: no address known for peer {peer_id!r}")
            client = PeerClient(peer_id, address, chunk_bytes=self.chunk_bytes,
                                timeout=self.round_timeout_s)
            self._clients[peer_id] = client
            return client

    def fresh_model(self, state: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
        """A private copy of the model (same architecture), optionally loaded with ``state``."""
        with self._lock:
            model = copy.deepcopy(self.model)
        if state is not None:
            model.load_state_dict(state)
        return model

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot of the node's current model weights (CPU copies)."""
        with self._lock:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def encode(self, round: int, kind: str = "trained") -> EncodedModel:  # noqa: A002
        """The node's current model as a wire message for ``round``."""
        meta = ModelMeta(round=round, sender=self.node_id, kind=kind,
                         num_samples=len(self.data.train),
                         label_counts=tuple(self.data.train.label_counts()),
                         architecture=self.architecture)
        return codec.encode(self.state_dict(), meta)

    # ------------------------------------------------------------------ PeerLogic (servicer side)
    @property
    def expected_spec(self) -> codec.ModelSpec:
        return self._spec

    @property
    def curvature_spec(self) -> codec.ModelSpec:
        return extras.curvature_spec(self._params_spec)

    def _check_peer(self, peer_id: str) -> None:
        """Only members of the federation may deliver, rewind or say hello (an address
        is not needed: a node's source may be a node it never sends to)."""
        if peer_id and peer_id != self.node_id and peer_id not in self.node_ids:
            raise UnknownPeerError(f"{self.node_id}: unknown peer {peer_id!r} "
                                   f"(the federation has {', '.join(self.node_ids)})")

    def hello(self, node_id: str) -> int:
        self._check_peer(node_id)
        with self._lock:
            return self._round

    def accept(self, model: codec.DecodedModel) -> bool:
        """Put a delivered model in the inbox; False for a duplicate (sender, round, kind)."""
        self._check_peer(model.meta.sender)
        if model.meta.kind == "curvature":
            return self._store_curvature(model)
        fresh = self.inbox.put(InboxKey(model.meta.round, model.meta.sender, model.meta.kind), model)
        if not fresh:
            log.info("%s: duplicate %s model from %s for round %d ignored", self.node_id,
                     model.meta.kind, model.meta.sender, model.meta.round)
        return fresh

    def _store_curvature(self, model: codec.DecodedModel) -> bool:
        """Keep a peer's newest (Fisher, parameters); False when not newer than what we have."""
        sender, round_ = model.meta.sender, model.meta.round
        with self._lock:
            if sender in self._curvature and self._curvature[sender][0] >= round_:
                return False
            self._curvature[sender] = (round_, extras.split(model.state_dict, extras.FISHER),
                                       extras.split(model.state_dict, extras.THETA))
            return True

    def _curvature_penalty(self) -> list[Regularizer]:
        """FedCurv's Eq. 3 without an aggregator: lambda * sum over the peers heard from of
        (theta - theta_j)^T diag(I_j) (theta - theta_j), summed here in float64 (Sec. 3.1's
        u, v, w). Nothing before any peer has sent its Fisher (so nothing in round 1)."""
        lam = self.training.fedcurv_lambda
        with self._lock:
            terms = [(f, t) for peer, (_, f, t) in self._curvature.items() if peer != self.node_id]
        if lam <= 0 or not terms:
            return []
        u, v, w = aggregate_uv([f for f, _ in terms], [t for _, t in terms])
        on_device = [{k: x.to(self.device) for k, x in d.items()} for d in (u, v, w)]

        def penalty(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            return fedcurv_penalty(model, on_device[0], on_device[1], lam, on_device[2])

        return [penalty]

    def _share_curvature(self, round: int) -> None:  # noqa: A002
        """Send this node's trained parameters and Fisher diagonal to every neighbour
        (best effort: a neighbour that cannot be reached is logged and skipped)."""
        self._set_state("sending")
        fisher = fisher_diagonal(self.model, self.data.train, self.training.batch_size, self.device)
        params = dict(self.model.named_parameters())
        state = {extras.THETA + k: params[k].detach().to("cpu") for k in fisher}
        state.update({extras.FISHER + k: v.to(torch.float32) for k, v in fisher.items()})
        message = codec.encode(state, ModelMeta(round=round, sender=self.node_id, kind="curvature"))
        for peer in self.neighbours:
            try:
                self.client(peer).deliver(message, timeout=min(self.round_timeout_s, 30.0))
            except (PeerError, UnknownPeerError) as exc:
                log.warning("%s: round %d: could not share curvature with %s: %s", self.node_id, round,
                            peer, exc)

    def evaluate_state(self, state: Mapping[str, torch.Tensor]) -> EvalResult:
        return evaluate(self.fresh_model(state), self.data.test, device=self.device)

    def rewind_state(self, state: Mapping[str, torch.Tensor], epochs: float, round: int,  # noqa: A002
                     sender: str) -> EncodedModel:
        """Train a copy of ``state`` for ``epochs`` on this node's data (FedRewind's rewind step)."""
        self._check_peer(sender)
        model = self.fresh_model(state)
        train(model, self.data.train, self.training, epochs=epochs,
              seed=self._train_seed(round, salt=1), device=self.device, objective=self.objective)
        meta = ModelMeta(round=round, sender=self.node_id, kind="rewind",
                         num_samples=len(self.data.train), architecture=self.architecture)
        return codec.encode(model.state_dict(), meta)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"node_id": self.node_id, "state": self._state, "round": self._round,
                    "rounds_total": self.rounds, "inbox_size": len(self.inbox),
                    "train_samples": len(self.data.train), "test_samples": len(self.data.test),
                    "last_accuracy": self._last_accuracy}

    # ------------------------------------------------------------------ the round loop
    def _train_seed(self, round: int, salt: int = 0) -> int:  # noqa: A002
        return derive_seed(self.seed, SEED_TRAIN, self.index, round, salt)

    def _receive(self, round: int, source: str) -> codec.DecodedModel | None:  # noqa: A002
        """The model ``source`` trained in ``round - 1``, waiting up to the round timeout."""
        self._set_state("waiting")
        return self.inbox.wait(InboxKey(round - 1, source, "trained"), self.round_timeout_s, self._stop)

    def _retry_window(self, peer: str) -> float:
        """How long to keep retrying ``peer``: the round timeout, or a few seconds once it
        has already failed, so a dead peer does not cost a whole timeout every round."""
        return min(self.round_timeout_s, 3.0) if peer in self._unreachable else self.round_timeout_s

    def _deliver(self, destination: str, message: EncodedModel) -> bool:
        """Send ``message`` to ``destination``, retrying with backoff; False (logged) on failure."""
        self._set_state("sending")
        client = self.client(destination)
        try:
            with_retry(lambda: client.deliver(message), self._retry_window(destination),
                       should_stop=self._stop.is_set)
            self._unreachable.discard(destination)
            return True
        except PeerError as exc:
            self._unreachable.add(destination)
            log.warning("%s: round %d: could not deliver to %s: %s", self.node_id,
                        message.header.round, destination, exc)
            return False

    def _rewind(self, target: str, round: int, epochs: float) -> codec.DecodedModel | None:  # noqa: A002
        """FedRewind's rewind step: ``target`` trains our model ``epochs`` on its data and sends
        it back. Blocks; None (logged) when the target cannot be reached."""
        self._set_state("rewinding")
        client = self.client(target)
        message = self.encode(round, kind="rewind")
        try:
            result = with_retry(
                lambda: client.rewind(message, epochs, round, self.node_id, expected=self._spec,
                                      max_bytes=self.max_model_bytes),
                self._retry_window(target), should_stop=self._stop.is_set)
            self._unreachable.discard(target)
            return result
        except PeerError as exc:
            self._unreachable.add(target)
            log.warning("%s: round %d: rewind to %s failed: %s", self.node_id, round, target, exc)
            return None

    def _local(self, epochs: float, round: int, phase: int,  # noqa: A002
               regularizers: Sequence[Regularizer] = ()) -> TrainStats:
        self._set_state("training")
        return train(self.model, self.data.train, self.training, epochs=epochs,
                     seed=self._train_seed(round, salt=phase), device=self.device,
                     objective=self.objective, regularizers=regularizers)

    def _train_round(self, round: int, target: str | None, notes: list[str],  # noqa: A002
                     regularizers: Sequence[Regularizer] = ()) -> tuple[TrainStats, str | None]:
        """E local epochs, or with a rewind ``target`` FedRewind's Eq. 2 / Eq. 4:
        (1-2*lambda)E local, lambda*E on the target through ``Rewind``, lambda*E local
        (the target trains with its own plain objective). An unreachable target's
        lambda*E epochs are trained locally and noted. Returns (stats, where it rewound)."""
        epochs = self.training.epochs
        if target is None:
            return self._local(epochs, round, 0, regularizers), None
        lam = self.rewind.lam
        phases = [self._local((1 - 2 * lam) * epochs, round, 0, regularizers)]
        back = self._rewind(target, round, lam * epochs)
        rewound_to = None
        if back is not None:
            self.model.load_state_dict(back.state_dict)
            rewound_to = target
        else:
            notes.append(f"rewind to {target} failed; trained its {lam * epochs:g} epochs locally")
            phases.append(self._local(lam * epochs, round, 1, regularizers))
        phases.append(self._local(lam * epochs, round, 2, regularizers))
        seen = sum(p.samples for p in phases)
        stats = TrainStats(sum(p.loss * p.samples for p in phases) / max(1, seen),
                           sum(p.steps for p in phases), seen)
        return stats, rewound_to

    def run_round(self, round: int) -> RoundReport:  # noqa: A002
        """Round ``round`` (from 1): receive from the source, train, deliver onward.

        Training is E local epochs, or with rewind (FedRewind Eq. 2, Alg. 1):
        (1-2*lambda)E local, lambda*E on the rewind node's data through the
        ``Rewind`` RPC, lambda*E local. There is no rewind in round 1 (no model
        has been received, so there is no previous node). When the source's
        model does not arrive within the round timeout the node trains the
        model it has; when the rewind node cannot be reached it spends those
        lambda*E epochs locally. The report says so in both cases.
        Blocks until the model has been delivered (or delivery failed).
        """
        start = time.monotonic()
        plan = self.schedule.plan(round)
        hop = plan[self.node_id]
        notes: list[str] = []
        received, missing, received_accuracy = False, None, None
        if hop.source is not None:
            incoming = self._receive(round, hop.source)
            if incoming is not None:
                self.model.load_state_dict(incoming.state_dict)
                received = True
                received_accuracy = evaluate(self.model, self.data.test, device=self.device).accuracy
            else:
                missing = hop.source
                notes.append(f"no model from {hop.source} within {self.round_timeout_s:g}s; "
                             "trained the model it had")
                log.warning("%s: round %d: %s", self.node_id, round, notes[-1])
        target = rewind_target(plan, self.node_id, self.rewind.mode, round=round, seed=self.seed,
                               nodes=self.node_ids)
        stats, rewound_to = self._train_round(round, target, notes, self._curvature_penalty())
        if self.training.fedcurv_lambda > 0 and round < self.rounds:
            self._share_curvature(round)
        local = evaluate(self.model, self.data.test, device=self.device)
        with self._lock:
            self._round = round
            self._last_accuracy = local.accuracy
        delivered = True
        if hop.destination is not None and round < self.rounds:
            delivered = self._deliver(hop.destination, self.encode(round))
            if not delivered:
                notes.append(f"could not deliver to {hop.destination}")
        self.inbox.prune(round - 1)
        self._set_state("idle")
        return RoundReport(self.node_id, round, hop.source, hop.destination, received, missing,
                           delivered, len(self.data.train), stats, local, time.monotonic() - start,
                           tuple(notes), received_accuracy, rewound_to)

    # ------------------------------------------------------------------ star rounds (aggregator)
    def _star_regularizers(self, strategy: str, fetched: dict[str, torch.Tensor],
                           start_state: dict[str, torch.Tensor], fedcurv_lambda: float) -> list[Regularizer]:
        """The strategy's extra loss terms for this round's local training.

        Flashback (Alg. 1 line 10, Eq. 3): dKD against the global model it started
        from, alpha = pi / (own counts + pi); nothing while pi is 0 (round 1).
        FedCurv (Eq. 3, Sec. 3.1): the Fisher penalty from u, v, w minus this node's
        own last contribution; nothing before any node has reported a Fisher.
        """
        regs: list[Regularizer] = []
        if strategy == "flashback":
            pi = fetched[extras.FLASHBACK_PI]
            if float(pi.sum()) > 0:
                teacher = self.fresh_model(start_state).to(self.device).eval()
                alpha = client_alpha(torch.tensor(self.data.train.label_counts()), pi).to(self.device)

                def dkd(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
                    with torch.no_grad():
                        teacher_logits = teacher(x)
                    return dkd_loss(logits, teacher_logits, alpha)

                regs.append(dkd)
        if strategy == "fedcurv":
            u = extras.split(fetched, extras.FEDCURV_U)
            if any(float(t.abs().sum()) > 0 for t in u.values()):
                v = extras.split(fetched, extras.FEDCURV_V)
                w = extras.split(fetched, extras.FEDCURV_W)
                if self._fedcurv_own is not None:
                    own_fisher, own_theta = self._fedcurv_own
                    u, v, w = others_terms(u, v, w, own_fisher, own_theta, dtype=torch.float64)
                terms = [{k: t.to(self.device) for k, t in d.items()} for d in (u, v, w)]

                def penalty(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
                    return fedcurv_penalty(model, terms[0], terms[1], fedcurv_lambda, terms[2])

                regs.append(penalty)
        return regs

    def run_star_round(self, round: int, aggregator: AggregatorClient, strategy: str,  # noqa: A002
                       *, fedcurv_lambda: float = 1.0) -> StarReport:
        """One round with an aggregator (FedRewind Alg. 2 when rewind is on).

        Fetch the global model for ``round`` (blocking until the aggregator opens
        it); when sampled, train it E epochs with the strategy's objective (with
        rewind: (1-2*lambda)E local, lambda*E on the previous node in the chain,
        lambda*E local, Eq. 4), and submit the update with the strategy's extras.
        """
        start = time.monotonic()
        expected = extras.global_spec(strategy, self._spec, self._params_spec, self.data.train.num_classes)
        self._set_state("waiting")
        got = aggregator.fetch(self.node_id, round, expected, self.max_model_bytes,
                               wait_s=self.round_timeout_s)
        fetched = got.state_dict
        selected = self.node_id in got.meta.metadata.get("selected", "").split(",")
        if got.meta.round != round or not selected:
            self._set_state("idle")
            notes = ((f"the aggregator is in round {got.meta.round}; skipped round {round}",)
                     if got.meta.round != round else ())
            return StarReport(self.node_id, round, False, wall_s=time.monotonic() - start, notes=notes)
        start_state = {k: fetched[k] for k in self._spec}
        self.model.load_state_dict(start_state)
        start_eval = evaluate(self.model, self.data.test, device=self.device)
        notes: list[str] = []
        regs = self._star_regularizers(strategy, fetched, start_state, fedcurv_lambda)
        chain = self.schedule.plan(2)  # the fixed chain whose previous node a rewind goes to
        target = rewind_target(chain, self.node_id, self.rewind.mode, round=round, seed=self.seed,
                               nodes=self.node_ids, first_round=1)
        stats, rewound_to = self._train_round(round, target, notes, regs)
        local = evaluate(self.model, self.data.test, device=self.device)
        state = self.state_dict()
        if strategy == "fedcurv":
            fisher = fisher_diagonal(self.model, self.data.train, self.training.batch_size, self.device)
            state.update({extras.FISHER + k: v.to(torch.float32) for k, v in fisher.items()})
        meta = ModelMeta(round=round, sender=self.node_id, kind="update", num_samples=len(self.data.train),
                         label_counts=tuple(self.data.train.label_counts()), architecture=self.architecture)
        self._set_state("sending")
        reply = aggregator.submit(codec.encode(state, meta))
        if reply.late:
            notes.append(f"update for round {round} arrived after the round closed")
        if strategy == "fedcurv" and reply.accepted:
            self._fedcurv_own = (fisher, {k: state[k] for k in fisher})
        with self._lock:
            self._round = round
            self._last_accuracy = local.accuracy
        self._set_state("idle")
        return StarReport(self.node_id, round, True, reply.accepted or reply.duplicate, reply.late, stats,
                          start_eval, local, rewound_to, time.monotonic() - start, tuple(notes))

    def run(self, rounds: int | None = None) -> list[RoundReport]:
        """Run rounds 1..``rounds`` (default: the federation's); stops early when stopped."""
        reports = []
        for t in range(1, (rounds or self.rounds) + 1):
            if self._stop.is_set():
                break
            reports.append(self.run_round(t))
        return reports


def _neighbours(federation: Federation, node_id: str) -> list[str]:
    """The nodes ``node_id`` has an edge to in the federation's graph, in federation order."""
    graph = federation.graph()
    succ = graph.successors(node_id) if graph.is_directed() else graph.neighbors(node_id)
    near = set(succ) - {node_id}
    return [n for n in federation.node_ids if n in near]
