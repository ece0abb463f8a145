"""The user code a federation runs, resolved once: a :class:`Task`.

The federation file names code by registered name or import path (``[model] factory``,
``[training] learner`` and ``optimizer``, ``[data] source``); Python passes objects instead
(``Simulation(fed, model=..., learner=...)``). A Task resolves both, once, when a simulation,
a node or an aggregator is built: every import happens then and every mistake is one line
then, and the parsed :class:`~flmesh.config.Federation` stays pure data. One Task serves every
node and the aggregator of a process.

Immutable; thread-safe (learners are stateless, as :class:`~flmesh.learning.learner.Learner`
asks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flmesh.config import Federation, TrainingConfig
from flmesh.learning.learner import Learner, LearnerError, load_learner
from flmesh.learning.models import ModelError, ModelFactory, ModelRecipe, model_recipe
from flmesh.learning.optimizers import OptimizerFactory, optimizer_factory
from flmesh.user_code import UserCodeError, load_callable


@dataclass(frozen=True)
class Task:
    """``recipe`` builds the model; ``learners`` maps each ``[training] learner`` the file names
    (None: the default) to its learner, unless ``learner`` (a Python object) trains every node;
    ``optimizers`` maps each ``[training] optimizer`` to what builds it; ``source`` is the
    ``[data] source`` callable, or one that returns the data given in Python (None: a
    registered data set); ``data`` says what that data was (None: the file's)."""

    recipe: ModelRecipe
    learners: Mapping[str | None, Learner]
    optimizers: Mapping[str, OptimizerFactory]
    source: Callable[..., Any] | None = None
    learner: Learner | None = None
    data: str | None = None

    @classmethod
    def of(cls, federation: Federation, *, model: ModelFactory | nn.Module | None = None,
           learner: Learner | None = None, data: Any = None) -> Task:
        """``federation``'s code, with ``model`` (a factory called as ``[model] factory`` is, or a
        module every process starts from a copy of), ``learner`` and ``data`` in place of the
        file's. ``data`` is what a ``[data] source`` may return: ``(x, y)`` arrays or tensors,
        ``((x, y), (x_test, y_test))``, a mapping with ``x`` and ``y``, an
        :class:`~flmesh.learning.arrays.ArrayData` or a torch ``Dataset``; ``[data]``'s
        partition splits it across the nodes. Blocking: imports what the file names. Raises
        ModelError, LearnerError or UserCodeError (one line naming the file and key)."""
        where = federation.source
        try:
            recipe = model_recipe(federation.model, model)
        except ModelError as exc:
            raise ModelError(f"{where}: {exc}") from None
        trainings = [federation.training, *(n.training for n in federation.nodes)]
        learners: dict[str | None, Learner] = {}
        try:
            if learner is not None:
                learner = load_learner(learner)
            else:
                learners = {t.learner: load_learner(t.learner) for t in trainings}
        except (LearnerError, UserCodeError) as exc:
            raise LearnerError(f"{where}: [training] learner: {exc}") from None
        try:
            optimizers = {t.optimizer: optimizer_factory(t.optimizer) for t in trainings}
        except UserCodeError as exc:
            raise UserCodeError(f"{where}: {exc}") from None
        source = None
        if data is not None:  # stands in for [data] source, and is called as one
            given = f"{type(data).__name__} from Python"
            return cls(recipe, learners, optimizers, lambda **_: data, learner, given)
        if federation.data.source is not None:
            try:
                source = load_callable(federation.data.source)
            except UserCodeError as exc:
                raise UserCodeError(f"{where}: [data] source: {exc}") from None
        return cls(recipe, learners, optimizers, source, learner)

    @property
    def label(self) -> str:
        """What builds the model, for titles and results (a registered name, an import path, or
        a Python object's ``module:qualname``)."""
        return self.recipe.label

    def learner_for(self, training: TrainingConfig) -> Learner:
        """What trains and evaluates a node with ``training``."""
        if self.learner is not None:
            return self.learner
        found = self.learners.get(training.learner)
        return found if found is not None else load_learner(training.learner)

    def optimizer(self, model: nn.Module, training: TrainingConfig) -> torch.optim.Optimizer:
        """``training``'s optimizer over ``model``'s parameters. Raises UserCodeError (one line)."""
        make = self.optimizers.get(training.optimizer) or optimizer_factory(training.optimizer)
        return make(model, training)


__all__ = ["Task"]
