"""Plain cross-entropy: the default local objective (``[training] objective = "ce"``).

The softmax cross-entropy of McMahan et al. (2017) local training; every
other objective plug-in (e.g. WSM) replaces it.
"""

from __future__ import annotations

from flmesh.algorithms.base import Algorithm
from flmesh.config import Federation, TrainingConfig


class CrossEntropy(Algorithm):
    name = "ce"
    kind = "objective"

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return training.objective == self.name
