"""What a node answers when a peer calls it: the Peer service's logic, with no transport in it.

:class:`NodeHandlers` implements :class:`~flmesh.node.transport.PeerHandlers`
for a :class:`~flmesh.node.node.Node`. The gRPC servicer and the in-memory
transport both call it with the caller's authenticated identity (None on
plaintext). Every refusal is a :class:`~flmesh.node.errors.Refused` whose
message starts with this node's id, and leaves the node's state unchanged.

Thread-safety: called concurrently from RPC threads. Handlers never touch the
node's own model: they train and evaluate fresh copies, and the inbox is
thread-safe.
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from flmesh.node.errors import Refused
from flmesh.node.inbox import InboxKey
from flmesh.node.learning.trainer import (
    evaluate,
    load_optimizer_state,
    make_optimizer,
    optimizer_spec,
    optimizer_state,
    steps_for,
    train,
)
from flmesh.node.local_training import rewind_training
from flmesh.node.reports import EvalResult
from flmesh.node.transport import Chunks, DeliverResult, HelloInfo, PeerStatus
from flmesh.node.wire import codec
from flmesh.node.wire.codec import CodecError, DecodedModel, EncodedModel, ModelMeta, ModelSpec
from flmesh.topology import TrainingConfig

Tensors = dict[str, torch.Tensor]
MAX_REWIND_EPOCHS = 100  # a rewind asks for a fraction of the sender's round; this bounds a hostile one

if TYPE_CHECKING:
    from flmesh.node.node import Node


def package_version() -> str:
    """flmesh's installed version (from the package metadata, not a constant)."""
    try:
        return importlib.metadata.version("flmesh")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree without an install
        return "0+unknown"


VERSION = package_version()


class NodeHandlers:
    def __init__(self, node: Node):
        self.node = node
        self.node_id = node.node_id

    # ------------------------------------------------------------------ checks
    def _member(self, peer_id: str, what: str) -> None:
        """Only members of the federation may deliver, rewind, evaluate or say hello."""
        if not peer_id:
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: {what} names no sender")
        if peer_id != self.node_id and peer_id not in self.node.member_ids:
            raise Refused("PERMISSION_DENIED", f"{self.node_id}: unknown peer {peer_id!r} "
                          f"(the federation has {', '.join(self.node.member_ids)})")

    def _same(self, caller: str | None, claimed: str, what: str) -> None:
        """The sender a message names must be the peer that sent it (when transport knows who)."""
        if caller is not None and caller != claimed:
            raise Refused("PERMISSION_DENIED", f"{self.node_id}: {what} claims to come from {claimed!r} "
                          f"but was sent by {caller!r}")

    def spec_for(self, meta: ModelMeta) -> ModelSpec:
        """What a message of ``meta``'s kind must contain: the model, or a plug-in's update."""
        if meta.kind == "extras":
            name = str(meta.metadata.get("algorithm", ""))
            if name not in self.node.update_specs:
                raise CodecError("invalid", f"extras for algorithm {name!r}, which this node does not "
                                 f"run between peers (it runs {', '.join(self.node.update_specs) or 'none'})")
            return self.node.update_specs[name]
        if meta.kind == "rewind":  # the model, and the sender's optimizer state when it sends one
            return {**self.node.spec, **optimizer_spec(self._rewind_config(meta), self.node.model)}
        return self.node.spec

    def _rewind_config(self, meta: ModelMeta) -> TrainingConfig:
        try:
            return rewind_training(self.node.training, meta.metadata)
        except ValueError as exc:
            raise CodecError("invalid", f"Rewind: {exc}") from None

    def evaluate_state(self, state: Mapping[str, torch.Tensor], max_task: int | None = None) -> EvalResult:
        """Any model state on this node's test split (a pooled copy is evaluated); in a continual
        federation only the test samples of tasks ``<= max_task``. Thread-safe."""
        test = self.node.data.test.up_to_task(max_task)
        with self.node.spare.loaded(state) as model:
            return evaluate(model, test, device=self.node.device)

    def rewind_state(self, state: Mapping[str, torch.Tensor], epochs: float, steps: int, round: int,
                     cfg: TrainingConfig | None = None) -> tuple[Tensors, int]:
        """Train a copy of the model in ``state`` ``steps`` steps (or ``epochs``) on this node's data
        (FedRewind's rewind step), continuing the optimizer state ``state`` carries with the
        sender's settings ``cfg``; returns the model and optimizer state, and the steps trained.
        Thread-safe; the node's own model is not touched."""
        cfg = cfg or self.node.training
        model_part = {k: v for k, v in state.items() if k in self.node.spec}
        optim_part = {k: v for k, v in state.items() if k not in self.node.spec}
        with self.node.spare.loaded(model_part) as model:
            optimizer = make_optimizer(model, cfg)
            load_optimizer_state(optimizer, model, optim_part)
            stats = train(model, self.node.data.train, cfg, epochs=epochs, steps=steps or None,
                          seed=self.node.train_seed(round, salt=1), device=self.node.device,
                          objective=self.node.objective, optimizer=optimizer)
            out = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            out.update(optimizer_state(optimizer, model) if optim_part else {})
            return out, stats.steps

    def _decode(self, chunks: Chunks) -> DecodedModel:
        """Read a stream against the spec its header's kind calls for (the model, or a
        plug-in's update spec); CodecError becomes a refusal naming this node."""
        try:
            header, stream = codec.peek_header(chunks)
            spec = self.spec_for(codec.meta_of(header))
            return codec.decode(stream, spec, self.node.max_model_bytes)
        except codec.CodecError as exc:
            raise Refused(exc.code, f"{self.node_id}: {exc}") from None

    # ------------------------------------------------------------------ the Peer service
    def hello(self, caller: str | None, node_id: str, federation: str, architecture: str) -> HelloInfo:
        self._member(node_id, "Hello")
        self._same(caller, node_id, "Hello")
        if federation and federation != self.node.federation.name:
            raise Refused("FAILED_PRECONDITION", f"{self.node_id} is in federation "
                          f"{self.node.federation.name!r}, not {federation!r}")
        mine = self.node.architecture
        if architecture and architecture != mine:
            raise Refused("FAILED_PRECONDITION", f"{self.node_id} runs model {mine}, the caller {node_id!r} "
                          f"runs {architecture}: every node of a federation needs the same [model]")
        return HelloInfo(self.node_id, self.node.federation.name, mine, VERSION, self.node.last_round)

    def deliver(self, caller: str | None, chunks: Chunks) -> DeliverResult:
        model = self._decode(chunks)
        meta = model.meta
        self._member(meta.sender, "the model")
        self._same(caller, meta.sender, "the model")
        if meta.kind not in ("trained", "extras"):
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Deliver takes trained models and plug-in "
                          f"extras, not {meta.kind!r}")
        kind = meta.kind if meta.kind == "trained" else f"extras/{meta.metadata.get('algorithm', '')}"
        fresh = self.node.inbox.put(InboxKey(meta.round, meta.sender, kind), model)
        self.node.counter.add_received(meta.kind, model.wire_bytes)
        if not fresh:
            self.node.log.info("%s: duplicate %s model from %s for round %d ignored", self.node_id, kind,
                               meta.sender, meta.round)
        return DeliverResult(accepted=fresh, duplicate=not fresh, bytes_received=model.total_bytes)

    def evaluate(self, caller: str | None, chunks: Chunks) -> EvalResult:
        model = self._decode(chunks)
        max_task = model.meta.metadata.get("max_task")
        return self.evaluate_state(model.state_dict, max_task if isinstance(max_task, int) else None)

    def rewind(self, caller: str | None, epochs: float, steps: int, round: int, sender: str,
               chunks: Chunks) -> EncodedModel:
        self._member(sender, "Rewind")
        self._same(caller, sender, "Rewind")
        self._check_rewind_work(epochs, steps)
        model = self._decode(chunks)
        if model.meta.kind != "rewind":
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Rewind takes a model of kind 'rewind', "
                          f"not {model.meta.kind!r}")
        cfg = rewind_training(self.node.training, model.meta.metadata)
        state, done = self.rewind_state(model.state_dict, epochs, steps, round, cfg)
        meta = ModelMeta(round=round, sender=self.node_id, kind="rewind",
                         num_samples=len(self.node.data.train), architecture=self.node.architecture,
                         metadata={"steps": done})
        return codec.encode(state, meta)

    def _check_rewind_work(self, epochs: float, steps: int) -> None:
        """Refuse a rewind with no work, or more than ``MAX_REWIND_EPOCHS`` of this node's epochs
        (a peer must not make this node train without end)."""
        if not math.isfinite(epochs) or epochs < 0 or steps < 0 or not (steps > 0 or epochs > 0):
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Rewind needs steps > 0 or epochs > 0, "
                          f"got steps {steps}, epochs {epochs}")
        epoch_steps = steps_for(1.0, len(self.node.data.train), self.node.training.batch_size)
        if epochs > MAX_REWIND_EPOCHS or steps > MAX_REWIND_EPOCHS * epoch_steps:
            raise Refused("INVALID_ARGUMENT", f"{self.node_id}: Rewind asks for more than "
                          f"{MAX_REWIND_EPOCHS} epochs ({MAX_REWIND_EPOCHS * epoch_steps} steps) here")

    def status(self, caller: str | None) -> PeerStatus:
        return self.node.status()
