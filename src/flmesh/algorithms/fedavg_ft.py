"""FedAvg + fine-tuning: the control for Flashback's server-side distillation.

FedAvg (McMahan et al.) of the round's updates, then the average trains with
plain cross-entropy on the aggregator's labelled public split for
``server_epochs`` epochs with the federation's training settings: the same
data, steps, optimizer and batch order as Flashback's server distillation
(Flashback Algorithm 1 lines 16-23), without the teachers' dKD terms and
without the clients' dKD (line 10). So Flashback minus this row is what the
distillation adds over the public data alone. Not a method of any paper here.
"""

from __future__ import annotations

from collections.abc import Sequence

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.algorithms.fedavg import fedavg
from flmesh.algorithms.flashback import SEED_DISTILL
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param
from flmesh.learning.data import derive_seed
from flmesh.learning.objectives import cross_entropy
from flmesh.learning.trainer import train


class FedAvgFineTuneServer(ServerHalf):
    """FedAvg, then ``server_epochs`` of cross-entropy on the public split (none: FedAvg)."""

    def __init__(self, ctx: ServerContext):
        self.ctx, self.server_epochs = ctx, ctx.settings.server_epochs

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        averaged = fedavg([u.state for u in updates], [u.num_samples for u in updates])
        public = self.ctx.public
        if public is None or not len(public) or self.server_epochs <= 0:
            return averaged
        fed = self.ctx.federation
        model = self.ctx.model_factory()
        model.load_state_dict(averaged)
        # the seed stream of Flashback's distillation: the same batch order on the same split
        train(model, public, fed.training, epochs=self.server_epochs, objective=cross_entropy,
              seed=derive_seed(fed.seed, SEED_DISTILL, round), device=self.ctx.device,
              compute=self.ctx.compute)
        return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}


class FedAvgFineTune(Algorithm):
    name = "fedavg_ft"
    kind = "strategy"
    params = (Param("server_epochs", float, 1.0, "epochs over the public split after averaging (0: none)",
                    lo=0, hi=1000, old="server_epochs"),)

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is not None and federation.aggregator.strategy == self.name

    def server(self, ctx: ServerContext) -> ServerHalf:
        return FedAvgFineTuneServer(ctx)
