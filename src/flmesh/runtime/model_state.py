"""A node's own model and what describes it: the one copy its round loop trains.

Thread-safety: ``lock`` (re-entrant) guards ``module``; :meth:`ModelState.state_dict`,
:meth:`ModelState.load_state` and :meth:`ModelState.evaluate` take it, and so must any
other reader or writer of ``module``. RPC handlers never touch ``module``: they work on
copies from ``spare``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import torch
from torch import nn

from flmesh.config import Federation, TrainingConfig
from flmesh.format.specs import ModelSpec, fingerprint, model_spec
from flmesh.learning.arrays import ArrayData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.learner import DEFAULT_LEARNER, Learner, federation_learner
from flmesh.learning.models import ModelPool, federation_model
from flmesh.learning.optimizers import OptimizerFactory, make_optimizer
from flmesh.learning.task import Task
from flmesh.learning.trainer import evaluate
from flmesh.runtime.reports import EvalResult

Tensors = dict[str, torch.Tensor]


class ModelState:
    def __init__(self, factory: Callable[[], nn.Module], device: torch.device, name: str,
                 initial: nn.Module | None = None, learner: Learner = DEFAULT_LEARNER,
                 compute: Compute = UNGATED, built_for: str = ""):
        """``factory``: a fresh model with the initial weights M_0 (on the CPU); ``name``: the
        architecture's name, the start of its fingerprint; ``initial``: a model ``factory``
        already built, kept as the node's own (None: built here); ``learner``: what trains and
        evaluates it (stateless, shared by every caller); ``compute``: the gate its training
        and evaluations hold (:mod:`flmesh.learning.compute`); ``built_for``: the data it was
        built for, in words ("inputs [64], 3 classes"), which Hello shows a peer."""
        self.new_model = factory
        self.learner = learner
        self.compute = compute
        self.make_optimizer: OptimizerFactory = make_optimizer  # the task's (for_federation)
        self.device = device
        self.module = initial if initial is not None else factory()
        self.module.to(device)
        self.lock = threading.RLock()
        self.spare = ModelPool(factory, device)  # copies that RPC handlers work on
        self.spec: ModelSpec = model_spec(self.module.state_dict())
        self.architecture = fingerprint(name, self.spec)  # what Hello and every message compare
        self.built_for = built_for

    @property
    def introduced(self) -> str:
        """What Hello sends: the fingerprint, then (after a space) the data the model was built
        for, so a node that runs another model can say how the two differ."""
        return f"{self.architecture} ({self.built_for})" if self.built_for else self.architecture

    @classmethod
    def for_federation(cls, federation: Federation, task: Task, data: ArrayData, device: torch.device,
                       training: TrainingConfig | None = None, compute: Compute = UNGATED) -> ModelState:
        """The model ``task`` builds for samples shaped like ``data``'s, seeded by the federation
        seed: every node starts from the same M_0 (:func:`~flmesh.learning.models.federation_model`,
        which checks it on one of ``data``'s samples; raises ModelError), and ``task``'s learner
        for ``training`` (default: the file's), checked on a copy of it (raises ValueError)."""
        sample = data.x[:1] if len(data.x) else None
        factory, label, initial = federation_model(federation, data.input_shape, data.num_classes, sample,
                                                   task.recipe)
        training = training or federation.training
        learner = federation_learner(federation, training, initial, data, task.learner_for(training))
        built_for = f"inputs {list(data.input_shape)}, {data.num_classes} classes"
        state = cls(factory, device, label, initial, learner, compute, built_for)
        state.make_optimizer = task.optimizer
        return state

    def state_dict(self) -> Tensors:
        """A snapshot of the current weights (CPU copies)."""
        with self.lock:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        with self.lock:
            self.module.load_state_dict(state)

    def evaluate(self, test: ArrayData) -> EvalResult:
        """The current model on ``test``; blocks while the model is in use."""
        with self.lock:
            return evaluate(self.module, test, device=self.device, learner=self.learner, compute=self.compute)
