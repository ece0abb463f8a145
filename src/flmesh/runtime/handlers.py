"""What a node answers when a peer calls it: the Peer service's logic, with no transport in it.

:class:`NodeHandlers` implements :class:`~flmesh.transports.seam.PeerHandlers`
over the parts of a node it answers from (:mod:`flmesh.runtime.parts`). The gRPC servicer and the in-memory
transport both call it with the caller's authenticated identity (None on
plaintext). Every refusal is a :class:`~flmesh.transports.errors.Refused` whose
message starts with this node's id, and leaves the node's state unchanged.

Thread-safety: called concurrently from RPC threads. Handlers never touch the
node's own model: they train and evaluate fresh copies, and the inbox is
thread-safe. Deliveries are stored and accepted one at a time, and each caller
has one evaluation running at a time (:data:`EVALS_PER_CALLER`).
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from flmesh.config import TrainingConfig, some_ids
from flmesh.format import codec
from flmesh.format.codec import CodecError, DecodedModel, EncodedModel, ModelMeta, ModelSpec
from flmesh.learning.optimizers import load_optimizer_state, optimizer_spec, optimizer_state
from flmesh.learning.trainer import TrainingStopped, evaluate, train
from flmesh.runtime.inbox import ROUND_WINDOW, Inbox, InboxKey
from flmesh.runtime.local_training import NO_DATA_YET, peer_training
from flmesh.runtime.parts import status_of
from flmesh.runtime.reports import EvalResult
from flmesh.topology.peers import may_deliver
from flmesh.transports.errors import Refused
from flmesh.transports.limits import EVALS_PER_CALLER, CallerSlots
from flmesh.transports.seam import Chunks, DeliverResult, HelloInfo, PeerStatus
from flmesh.v1 import model_pb2 as pb

Tensors = dict[str, torch.Tensor]

if TYPE_CHECKING:
    from flmesh.observe.metrics import Metrics
    from flmesh.runtime.activity import Activity
    from flmesh.runtime.model_state import ModelState
    from flmesh.runtime.parts import Settings, Share
    from flmesh.runtime.plugins import NodePlugins
    from flmesh.transports.seam import ByteCounter


try:  # flmesh's installed version, from the package metadata (Hello says it)
    VERSION = importlib.metadata.version("flmesh")
except importlib.metadata.PackageNotFoundError:  # running from a source tree without an install
    VERSION = "0+unknown"


class NodeHandlers:
    def __init__(self, settings: Settings, model: ModelState, share: Share, plugins: NodePlugins,
                 activity: Activity, inbox: Inbox, counter: ByteCounter, stop: threading.Event,
                 log: logging.Logger, metrics: Metrics | None = None, checkpoint_dir: Path | None = None):
        """``checkpoint_dir``: where each accepted delivery is stored before it is acknowledged
        (None: nowhere)."""
        self.settings, self.model, self.share, self.plugins = settings, model, share, plugins
        self.activity, self.inbox, self.counter, self.stop = activity, inbox, counter, stop
        self.log, self.metrics, self.checkpoint_dir = log, metrics, checkpoint_dir
        self.node_id = settings.node_id
        self._evaluations = CallerSlots(EVALS_PER_CALLER)
        self._keeping = threading.Lock()  # one delivery at a time from "is it new" to "it is in"
        #: member -> why this node refused its Hello (another federation or model): this node cannot
        #: run with it either, which its own wait for peers says (bounded by the members)
        self.refused_hello: dict[str, str] = {}

    # ------------------------------------------------------------------ checks
    def _member(self, peer_id: str, what: str) -> None:
        """Only members of the federation may deliver, train, evaluate or say hello."""
        if not peer_id:
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: {what} names no sender")
        if peer_id != self.node_id and peer_id not in self.settings.members:
            raise Refused("PERMISSION_DENIED", f"{self.node_id}: unknown peer {peer_id!r} "
                          f"(the federation has {some_ids(sorted(self.settings.members))})")

    def _same(self, caller: str | None, claimed: str, what: str) -> None:
        """The sender a message names must be the peer that sent it (when transport knows who)."""
        if caller is not None and caller != claimed:
            raise Refused("PERMISSION_DENIED", f"{self.node_id}: {what} claims to come from {claimed!r} "
                          f"but was sent by {caller!r}")

    def spec_for(self, meta: ModelMeta) -> ModelSpec:
        """What a message of ``meta``'s kind must contain: the model, or a plug-in's update."""
        if meta.kind == "extras":
            name = str(meta.metadata.get("algorithm", ""))
            specs = self.plugins.update_specs
            if name not in specs:
                raise CodecError("invalid", f"extras for algorithm {name!r}, which this node does not "
                                 f"run between peers (it runs {', '.join(specs) or 'none'})")
            return specs[name]
        if meta.kind == "to_train":  # the model, and the sender's optimizer state when it sends one
            return {**self.model.spec, **optimizer_spec(self._peer_config(meta), self.model.module)}
        if meta.kind == "trained" and self.plugins.peer_spec is not None:  # a neighbour's, to combine
            return self.plugins.peer_spec
        return self.model.spec

    def _peer_config(self, meta: ModelMeta) -> TrainingConfig:
        try:
            return peer_training(self.settings.training, meta.metadata)
        except ValueError as exc:
            raise CodecError("invalid", f"Train: {exc}") from None

    def evaluate_state(self, state: Mapping[str, torch.Tensor], max_task: int | None = None) -> EvalResult:
        """Any model state on this node's test split (a pooled copy is evaluated); in a continual
        federation only the test samples of tasks ``<= max_task``. Thread-safe."""
        test = self.share.data.test.up_to_task(max_task)
        with self.model.spare.loaded(state) as model:
            return evaluate(model, test, device=self.model.device, learner=self.model.learner,
                            compute=self.model.compute)

    def train_state(self, state: Mapping[str, torch.Tensor], steps: int, round: int,
                    cfg: TrainingConfig | None = None,
                    stop: Callable[[], bool] | None = None) -> tuple[Tensors, int]:
        """Train a copy of the model in ``state`` ``steps`` steps on this node's data (a peer's
        ``train`` call), continuing the optimizer state ``state`` carries with the sender's
        settings ``cfg``; returns the model and optimizer state, and the steps trained.
        ``stop()`` True ends it early (TrainingStopped). Thread-safe; the node's own model is
        not touched."""
        cfg = cfg or self.settings.training
        model_part = {k: v for k, v in state.items() if k in self.model.spec}
        optim_part = {k: v for k, v in state.items() if k not in self.model.spec}
        with self.model.spare.loaded(model_part) as model:
            optimizer = self.model.make_optimizer(model, cfg)
            load_optimizer_state(optimizer, model, optim_part)
            stats = train(model, self.share.data.train, cfg, steps=steps,
                          seed=self.settings.train_seed(round, salt=1), device=self.model.device,
                          objective=self.plugins.objective, optimizer=optimizer, stop=stop,
                          learner=self.model.learner, compute=self.model.compute)
            out = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            out.update(optimizer_state(optimizer, model) if optim_part else {})
            return out, stats.steps

    def _decode(self, chunks: Chunks) -> DecodedModel:
        """Read a stream against the spec its header's kind calls for (the model, or a
        plug-in's update spec); CodecError becomes a refusal naming this node."""
        header, stream = self._peek(chunks)
        return self._read(header, stream)

    def _peek(self, chunks: Chunks) -> tuple[pb.ModelHeader, Chunks]:
        """The stream's header, with a kind this node knows (checked before any payload
        byte is read), and the whole stream."""
        try:
            header, stream = codec.peek_header(chunks)
            codec.kind_of(header)
            return header, stream
        except codec.CodecError as exc:
            raise Refused(exc.code, f"{self.node_id}: {exc}") from None

    def _read(self, header: pb.ModelHeader, stream: Chunks) -> DecodedModel:
        try:
            spec = self.spec_for(codec.meta_of(header))
            return codec.decode(stream, spec, self.settings.max_model_bytes, wire=self.settings.wire)
        except codec.CodecError as exc:
            raise Refused(exc.code, f"{self.node_id}: {exc}") from None

    # ------------------------------------------------------------------ the Peer service
    def hello(self, caller: str | None, node_id: str, federation: str, architecture: str) -> HelloInfo:
        self._member(node_id, "Hello")
        self._same(caller, node_id, "Hello")
        why = None
        if federation and federation != self.settings.federation.name:
            why = f"{self.node_id} is in federation {self.settings.federation.name!r}, not {federation!r}"
        mine = self.model.architecture
        theirs = architecture.partition(" ")[0]  # the fingerprint; then the data it was built for
        if why is None and theirs and theirs != mine:
            why = (f"{self.node_id} runs model {self.model.introduced}, the caller {node_id!r} runs "
                   f"{architecture}: every node of a federation needs the same [model] and data of one "
                   "shape")
        if why is not None:
            self.refused_hello[node_id] = why
            raise Refused("FAILED_PRECONDITION", why)
        return HelloInfo(self.node_id, self.settings.federation.name, mine, VERSION,
                         self.activity.last_round)

    def deliver(self, caller: str | None, chunks: Chunks) -> DeliverResult:
        header, stream = self._peek(chunks)
        meta = codec.meta_of(header)
        self._member(meta.sender, "the model")
        self._same(caller, meta.sender, "the model")
        if meta.kind == "trained":
            if not may_deliver(self.settings.federation, meta.sender, self.node_id, meta.round):
                raise Refused("PERMISSION_DENIED", f"{self.node_id}: {meta.sender} does not send to "
                              f"{self.node_id} in round {meta.round} (not on the schedule)")
            kind = "trained"
        elif meta.kind == "extras":
            if meta.sender not in self.settings.neighbours:
                raise Refused("PERMISSION_DENIED", f"{self.node_id}: {meta.sender} is not a graph neighbour")
            kind = f"extras/{meta.metadata.get('algorithm', '')}"
        else:
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Deliver takes trained models and plug-in "
                          f"extras, not {meta.kind!r}")
        key = InboxKey(meta.round, meta.sender, kind)
        if not self.inbox.held(key):  # a model it already took is a duplicate, however old
            self._in_window(meta.round, "the model")
        if len(meta.label_counts) > self.share.data.train.num_classes:
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: the model's label_counts lists "
                          f"{len(meta.label_counts)} classes, the federation's data has "
                          f"{self.share.data.train.num_classes}")
        started = time.monotonic()
        with self.inbox.receiving(key):  # the round loop waits on for a model on its way
            model = self._read(header, stream)
            with self._keeping:  # two copies of one key at once (one identity, two processes): one is kept
                fresh = self._keep(key, model)
        self.counter.add_received(meta.kind, model.wire_bytes)
        if self.metrics is not None:
            self.metrics.bytes.labels(self.node_id, meta.sender, "received").inc(model.wire_bytes)
        self.log.debug("round %d: %s model from %s in: %d bytes in %.2fs", meta.round, kind, meta.sender,
                       model.wire_bytes, time.monotonic() - started,
                       extra={"node": self.node_id, "round": meta.round, "peer": meta.sender})
        if not fresh:
            self.log.info("duplicate %s model from %s for round %d ignored", kind, meta.sender,
                                    meta.round, extra={"node": self.node_id, "round": meta.round,
                                                       "peer": meta.sender})
        return DeliverResult(accepted=fresh, duplicate=not fresh, bytes_received=model.total_bytes)

    def _keep(self, key: InboxKey, model: DecodedModel) -> bool:
        """Put a delivery in the inbox, stored first when the node keeps state: a delivery
        acknowledged is one a resume still has, and the copy stored is the one accepted.
        False for a duplicate. Called under ``_keeping``."""
        if self.checkpoint_dir is not None and not self.inbox.held(key):
            from flmesh.format.state_file import StateWriteError
            from flmesh.runtime.checkpoint import keep_delivery

            try:
                keep_delivery(self.checkpoint_dir, key, model)
            except StateWriteError as exc:
                self.log.error("%s", exc, extra={"node": self.node_id})
                raise Refused("INTERNAL", f"{self.node_id}: cannot store the model: {exc}") from None
        return self.inbox.put(key, model)

    def evaluate(self, caller: str | None, chunks: Chunks) -> EvalResult:
        header, stream = self._peek(chunks)
        asker = caller if caller is not None else header.sender
        if asker not in self.settings.evaluators:
            raise Refused("PERMISSION_DENIED", f"{self.node_id}: {asker!r} may not evaluate on this node's "
                          "test split (members of the federation may)")
        if not self._evaluations.take(asker):  # before the payload is read: a stalled stream holds it
            raise Refused("RESOURCE_EXHAUSTED", f"{self.node_id}: {asker} has an Evaluate in flight here "
                          f"(limit {EVALS_PER_CALLER} per caller); retry once it is answered")
        try:
            model = self._read(header, stream)
            max_task = model.meta.metadata.get("max_task")
            return self.evaluate_state(model.state_dict, max_task if isinstance(max_task, int) else None)
        finally:
            self._evaluations.give(asker)

    def train(self, caller: str | None, steps: int, round: int, sender: str, chunks: Chunks, *,
              cancelled: Callable[[], bool] | None = None) -> EncodedModel:
        self._member(sender, "Train")
        self._same(caller, sender, "Train")
        allowed = self._allowance(sender, round)
        if allowed <= 0:
            raise Refused("PERMISSION_DENIED", f"{self.node_id}: {sender} does not train on {self.node_id}'s "
                          f"data in round {round} (no plug-in's plan sends it here)")
        if abs(round - (self.activity.last_round + 1)) > ROUND_WINDOW:
            raise Refused("FAILED_PRECONDITION", f"{self.node_id}: a Train call for round {round} is outside "
                          f"this node's window (it is in round {self.activity.last_round + 1})")
        if steps <= 0:
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Train needs steps > 0, got {steps}")
        if steps > allowed and not len(self.share.data.train):
            raise Refused("FAILED_PRECONDITION", f"{self.node_id}: {NO_DATA_YET}")  # not joined yet
        if steps > allowed:
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Train asks for {steps} steps, more than "
                          f"this federation's plug-ins allow {sender} here ({allowed})")
        model = self._decode(chunks)
        if model.meta.kind != "to_train":
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Train takes a model of kind 'to_train', "
                          f"not {model.meta.kind!r}")
        cfg = peer_training(self.settings.training, model.meta.metadata)
        stop = self.stop

        def gone() -> bool:
            return stop.is_set() or (cancelled is not None and cancelled())

        try:
            state, done = self.train_state(model.state_dict, steps, round, cfg, stop=gone)
        except TrainingStopped as exc:
            raise Refused("CANCELLED", f"{self.node_id}: training for {sender} stopped: {exc}") from None
        meta = ModelMeta(round=round, sender=self.node_id, kind="to_train",
                         num_samples=len(self.share.data.train), architecture=self.model.architecture,
                         metadata={"steps": done})
        return codec.encode(state, meta, self.settings.wire)

    def _allowance(self, sender: str, round: int) -> int:
        """The most steps ``sender`` may have this node train in ``round``: what the federation's
        plug-ins allow (:meth:`~flmesh.algorithms.base.Algorithm.remote_allowance`), 0 for none.
        A peer must not make this node train without end."""
        fed = self.settings.federation
        largest = self.share.data.largest_share or len(self.share.data.train) * len(fed.nodes)
        allowed = [p.remote_allowance(fed, sender, self.node_id, round, largest)
                   for p in self.plugins.enabled]
        return max(allowed, default=0)

    def _in_window(self, round: int, what: str) -> None:
        """Models are taken for rounds from the last one this node finished (its next round
        trains on it; with neighbour averaging, from the one after it) to ROUND_WINDOW ahead:
        an older one can never be used; one further ahead is refused as RESOURCE_EXHAUSTED (the
        window is full), and a sender that is ahead waits and sends it again
        (:meth:`~flmesh.runtime.peer_exchange.PeerExchange.deliver_onward`)."""
        last = self.activity.last_round
        # a walk trains in round t + 1 on a model of round t; neighbour averaging combines a
        # neighbour's round-t model in round t itself, the last round's included, and a
        # barrier-free round one up to max_staleness rounds old
        averages = self.plugins.peer_server is not None
        peers = self.settings.federation.peers
        oldest = last + averages - (peers.max_staleness if averages and peers and peers.barrier_free else 0)
        if round < oldest:
            raise Refused("FAILED_PRECONDITION", f"{self.node_id}: {what} is for round {round}, which is "
                          f"over (this node finished round {last})")
        if round > last + ROUND_WINDOW:  # the sender is ahead: it waits until this node catches up
            raise Refused("RESOURCE_EXHAUSTED", f"{self.node_id}: {what} is for round {round}, too far "
                          f"ahead (this node finished round {last}); send it again once it has caught up")
        if round >= self.settings.rounds + averages:
            raise Refused("FAILED_PRECONDITION", f"{self.node_id}: {what} is for round {round}, but nothing "
                          f"is sent after the last round ({self.settings.rounds})")

    def status(self, caller: str | None) -> PeerStatus:
        if caller is not None and caller not in self.settings.evaluators:
            raise Refused("PERMISSION_DENIED", f"{self.node_id}: {caller!r} is not in this federation")
        return status_of(self.settings, self.activity, self.inbox, self.share)
