"""DP replay: local and differentially private global replay buffers for continual federations.

Zizzo et al., *Federated Continual Learning with Differentially Private Data
Sharing*, Sec. 3.2 and 4. On every task change each client that holds data of
the task it is about to lose

1. keeps ``local_means`` means per class of that data, each over a separate
   shard (its **local buffer**, :func:`~flmesh.learning.replay.shard_means`);
2. unless ``[replay] mode = "local"`` (the baseline), releases one mean per
   class under the Laplace mechanism at the federation's epsilon
   (:func:`~flmesh.learning.replay.dp_class_means`) to the ReplayBuffer
   host, which re-averages what it receives into ``global_means`` means per
   class (:mod:`flmesh.replay.buffer`). A client whose budget would be
   exceeded withholds its release and says so.

Then, with ``mode = "client"``, every client fetches the **global buffer**
and trains on its current data plus both buffers; with ``mode =
"aggregator"`` the clients train on current data plus their local buffer and
the aggregator fine-tunes the averaged model on the global buffer every round
(:class:`ReplayRefiner`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from flmesh.algorithms.base import Algorithm, ClientContext, ClientHalf, Refiner, ServerContext, Tensors
from flmesh.config import Federation, TrainingConfig
from flmesh.format.codec import ModelMeta, encode
from flmesh.learning.arrays import ArrayData
from flmesh.learning.data import derive_seed
from flmesh.learning.replay import dp_class_means, shard_means
from flmesh.learning.trainer import train
from flmesh.replay.buffer import buffer_spec
from flmesh.topology.tasks import task_classes, task_of
from flmesh.transports.errors import PeerError

log = logging.getLogger("flmesh.node")

SEED_LOCAL_BUFFER = 25
SEED_SERVER_REPLAY = 26


def buffer_data(x: torch.Tensor, filled: torch.Tensor, num_classes: int) -> ArrayData:
    """The real means of a global buffer (x (C, N, *input), filled (C,)) as a labelled set."""
    rows = [(x[c, i], c) for c in range(num_classes) for i in range(int(filled[c]))]
    if not rows:
        return ArrayData(x[:0, 0].clone(), torch.zeros(0, dtype=torch.long), num_classes)
    return ArrayData(torch.stack([r for r, _ in rows]), torch.tensor([c for _, c in rows]), num_classes)


class DpReplayClient(ClientHalf):
    def __init__(self, ctx: ClientContext):
        super().__init__()
        assert ctx.federation.replay is not None and ctx.federation.tasks is not None
        self.ctx, self.cfg, self.stream = ctx, ctx.federation.replay, ctx.federation.tasks
        self.local: list[ArrayData] = []
        self.global_buffer: ArrayData | None = None
        self.spent = 0.0

    def on_task_change(self, old: ArrayData | None, old_task: int, new_task: int) -> None:
        if old is None or len(old) == 0:
            return
        ctx, cfg = self.ctx, self.cfg
        index = ctx.federation.node_ids.index(ctx.node_id)
        self.local.append(shard_means(old, cfg.local_means,
                                      derive_seed(ctx.federation.seed, SEED_LOCAL_BUFFER, index, old_task)))
        if cfg.mode == "local":
            return
        withheld = cfg.budget > 0 and self.spent + cfg.epsilon > cfg.budget * (1 + 1e-12)
        if withheld:
            self.notes.append(f"privacy budget: {ctx.node_id} has spent epsilon {self.spent:g} of "
                              f"{cfg.budget:g}; its release of task {old_task} is withheld")
            log.warning("%s", self.notes[-1])
            means = torch.zeros((old.num_classes, *old.input_shape))
            counts = torch.zeros(old.num_classes, dtype=torch.long)
        else:
            classes = task_classes(self.stream, old_task, old.num_classes)
            means, counts = dp_class_means(old, classes, cfg.clip[0], cfg.clip[1], cfg.epsilon, cfg.min_count)
        meta = ModelMeta(sender=ctx.node_id, kind="contribution",
                         metadata={"task": old_task, "epsilon": float(cfg.epsilon), "withheld": withheld})
        assert ctx.replay is not None, "a node of a federation with [replay] needs a replay transport"
        try:
            reply = ctx.replay.contribute(encode({"means": means, "counts": counts}, meta),
                                          timeout=ctx.federation.round_timeout_s)
            self.spent = reply.spent
        except PeerError as exc:
            self.notes.append(f"could not release the means of task {old_task}: {exc}")
            log.warning("%s", self.notes[-1], extra={"node": ctx.node_id})

    def after_task_change(self, new_task: int) -> None:
        if self.cfg.mode != "client" or new_task == 0:
            return
        ctx = self.ctx
        assert ctx.replay is not None
        shape = ctx.train().input_shape
        num_classes = ctx.train().num_classes
        spec = buffer_spec(num_classes, self.cfg.global_means, shape)
        try:
            got = ctx.replay.fetch(ctx.node_id, new_task, expected=spec,
                                   wait_s=ctx.federation.round_timeout_s)
        except PeerError as exc:
            self.notes.append(f"could not fetch the global buffer of task {new_task}: {exc}")
            log.warning("%s", self.notes[-1], extra={"node": ctx.node_id})
            return
        self.global_buffer = buffer_data(got.state_dict["x"], got.state_dict["filled"], num_classes)

    def extra_training_data(self) -> list[ArrayData]:
        return [*self.local, *([self.global_buffer] if self.global_buffer is not None else [])]

    def privacy_spent(self) -> float | None:
        return self.spent if self.cfg.mode != "local" else None

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        tensors: Tensors = {}
        for i, buf in enumerate(self.local):
            tensors[f"local/{i}/x"], tensors[f"local/{i}/y"] = buf.x, buf.y
        if self.global_buffer is not None:
            tensors["global/x"], tensors["global/y"] = self.global_buffer.x, self.global_buffer.y
        return tensors, {"local": len(self.local), "spent": self.spent}

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        classes = self.ctx.train().num_classes
        self.local = [ArrayData(tensors[f"local/{i}/x"], tensors[f"local/{i}/y"], classes)
                      for i in range(int(values["local"]))]
        self.global_buffer = (ArrayData(tensors["global/x"], tensors["global/y"], classes)
                              if "global/x" in tensors else None)
        self.spent = float(values["spent"])


class ReplayRefiner(Refiner):
    """Aggregator training: after averaging, train the global model on the global buffer."""

    def __init__(self, ctx: ServerContext):
        assert ctx.federation.replay is not None and ctx.federation.tasks is not None
        assert ctx.replay_host is not None, "aggregator training needs the replay buffer on the aggregator"
        self.ctx, self.cfg, self.stream, self.host = (ctx, ctx.federation.replay, ctx.federation.tasks,
                                                     ctx.replay_host)

    def refine(self, round: int, state: Tensors) -> Tensors:
        task = task_of(self.stream, round)
        self.host.wait_for(task, self.ctx.federation.round_timeout_s)
        x, filled = self.host.buffer(task)
        data = buffer_data(x, filled, self.ctx.num_classes)
        if len(data) == 0 or self.cfg.server_epochs <= 0:
            return state
        fed = self.ctx.federation
        model = self.ctx.model_factory()
        model.load_state_dict(state)
        train(model, data, fed.training, epochs=self.cfg.server_epochs,
              seed=derive_seed(fed.seed, SEED_SERVER_REPLAY, round), device=self.ctx.device,
              compute=self.ctx.compute)
        return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}


class DpReplay(Algorithm):
    name = "dp_replay"
    kind = "data"

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.replay is not None

    def client(self, ctx: ClientContext) -> ClientHalf:
        return DpReplayClient(ctx)

    def refiner(self, ctx: ServerContext) -> Refiner | None:
        replay = ctx.federation.replay
        return ReplayRefiner(ctx) if replay is not None and replay.mode == "aggregator" else None
