"""Models for the federation file's ``[model]`` section: a registry of model
factories, the built-in ones registered in it, and the one way every process builds M_0.

A model factory is a callable ``factory(*, input_shape, num_classes, **args) -> torch.nn.Module``.
``input_shape`` is one sample's shape, a tuple of ints ((C, H, W) for images, (F,) for feature
vectors); ``num_classes`` is the data's number of classes, and the model must return logits of
that width, ``(batch, num_classes)`` (the softmax is in the loss); ``args`` are the
``[model.args]`` table. The factory runs with torch's global RNG seeded from the federation
seed (and restored afterwards), so every node and the aggregator draw the same initial
weights M_0 from it. ``[model] name`` names a built-in (``mlp``, ``cnn``, ``cnn2``,
``resnet18``; its sizes are the factory's arguments), ``[model] factory`` a registered name or
an import path ``package.module:callable``. Any model can start from a local state-dict file
(``[model] weights``).

Every peer refuses a model over ``[federation] max_model_mib`` (its tensors as they travel:
float32 ones at the ``[wire] dtype``) and one that holds NaN or infinity, so M_0 is checked
for both when it is built, before round 1 (:func:`federation_model`).
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from flmesh import registry
from flmesh.config import Federation, ModelConfig
from flmesh.config.checks import mib
from flmesh.learning.architectures import MLP, FedAvgCNN, SmallCNN, resnet18
from flmesh.learning.data import SEED_MODEL, derive_seed
from flmesh.learning.extras import MissingExtra
from flmesh.learning.weights import ModelError, load_weights, one_line
from flmesh.user_code import is_import_path

ModelFactory = Callable[..., nn.Module]


def _images(name: str, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(input_shape) != 3:
        raise ModelError(f"model {name!r} needs (C, H, W) images, the data has shape {input_shape}")
    return input_shape


def mlp(*, input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (64,)) -> nn.Module:
    """:class:`~flmesh.learning.architectures.MLP` with ``hidden`` layer widths."""
    return MLP(input_shape, num_classes, tuple(hidden))


def cnn(*, input_shape: tuple[int, ...], num_classes: int, channels: Sequence[int] = (16, 32)) -> nn.Module:
    """:class:`~flmesh.learning.architectures.SmallCNN` with ``channels`` per conv layer."""
    return SmallCNN(_images("cnn", input_shape), num_classes, tuple(channels))


def cnn2(*, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """:class:`~flmesh.learning.architectures.FedAvgCNN` (images of at least 4x4)."""
    if min(_images("cnn2", input_shape)[1:]) < 4:
        raise ModelError(f"model 'cnn2' needs images of at least 4x4, the data has shape {input_shape}")
    return FedAvgCNN(input_shape, num_classes)


def resnet(*, input_shape: tuple[int, ...], num_classes: int, norm: str = "batch", groups: int = 2,
           small_input: bool | None = None) -> nn.Module:
    """:func:`~flmesh.learning.architectures.resnet18` (needs the ``vision`` extra)."""
    return resnet18(_images("resnet18", input_shape), num_classes, norm=norm, groups=groups,
                    small_input=small_input)


#: Which [model] keys each built-in model takes as its factory's arguments.
_SIZES = {"mlp": ("hidden",), "cnn": ("channels",), "resnet18": ("norm", "groups", "small_input")}


def register_model(name: str, factory: ModelFactory) -> None:
    """Make ``[model] factory = "name"`` build with ``factory`` (in
    :data:`flmesh.registry.models`; an installed package can declare an entry point of
    ``flmesh.models`` instead). Not thread-safe: register at import time, before any
    federation is built. Raises ValueError for a name already taken."""
    registry.models.register(name, factory)


@dataclass(frozen=True)
class ModelRecipe:
    """What builds a federation's model: ``label`` (the registered name, the import path, or
    ``module:qualname`` of a Python object) starts the model's fingerprint; ``key`` is where
    it was given (for messages)."""

    label: str
    key: str
    factory: ModelFactory | nn.Module
    args: Mapping[str, Any] = field(default_factory=dict)

    def _shape_args(self, input_shape: tuple[int, ...], num_classes: int) -> dict[str, Any]:
        """What the factory is called with besides ``[model.args]``: ``input_shape`` and
        ``num_classes``, each when it takes it by that name (a factory without them, such as
        ``make_net(width=...)``, gets its own arguments only; the built model's output is then
        checked against the data's classes). Raises ModelError for ``[model.args]`` the
        factory does not take or lacks."""
        shapes = {"input_shape": input_shape, "num_classes": num_classes}
        try:
            params = inspect.signature(self.factory).parameters
        except (TypeError, ValueError):  # no signature to read (some C callables): the call will say
            return shapes
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return shapes
        named = [n for n, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY]
        unknown = next((a for a in self.args if a not in named), None)
        if unknown is not None:
            takes = [n for n in named if n not in shapes]
            raise ModelError(f"[model.args] {unknown}: {self.label!r} takes no argument {unknown!r} "
                             f"(it takes {', '.join(takes) or 'none'})")
        given = {k: v for k, v in shapes.items() if k in named and k not in self.args}
        missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                   and n not in (*given, *self.args)
                   and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if missing:
            raise ModelError(f"[model.args]: {self.label!r} needs {', '.join(map(repr, missing))}")
        return given

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """A fresh model (a copy, when the recipe is a module); draws from torch's global RNG."""
        if isinstance(self.factory, nn.Module):
            return copy.deepcopy(self.factory)
        shapes = self._shape_args(input_shape, num_classes)
        try:
            model = self.factory(**shapes, **self.args)
        except (ModelError, MissingExtra, KeyboardInterrupt):
            raise
        except BaseException as exc:  # the user's factory failed (or called sys.exit): one line
            raise ModelError(f"{self.key} {self.label!r} raised {one_line(exc)}") from None
        if not isinstance(model, nn.Module):
            raise ModelError(f"{self.key} {self.label!r} returned {type(model).__name__}, "
                             "not a torch.nn.Module")
        return model


def model_recipe(cfg: ModelConfig, override: ModelFactory | nn.Module | None = None) -> ModelRecipe:
    """What builds ``cfg``'s model, or ``override`` (from Python: a factory called as ``[model]
    factory`` is, with ``[model.args]``, or a module every process starts from a copy of);
    imports a factory's module (blocking). Raises ModelError."""
    given: str | ModelFactory | nn.Module | None = override if override is not None else cfg.factory
    if given is None:
        try:
            factory = registry.models.resolve(cfg.name)
        except registry.RegistryError as exc:
            raise ModelError(f"[model] name: {exc}") from None
        return ModelRecipe(cfg.name, "[model] name", factory,
                           {k: getattr(cfg, k) for k in _SIZES.get(cfg.name, ())})
    if isinstance(given, str):
        try:
            factory = registry.models.resolve(given)
        except registry.RegistryError as exc:  # a path's own message names it: no colon before it
            raise ModelError(f"[model] factory{' ' if is_import_path(given) else ': '}{exc}") from None
        return ModelRecipe(given, "[model] factory", factory, dict(cfg.args))
    if not callable(given):
        raise ModelError(f"model: expected a torch.nn.Module or a callable that returns one, "
                         f"got {type(given).__name__}")
    named = type(given) if isinstance(given, nn.Module) else given
    label = f"{getattr(named, '__module__', '?')}:{getattr(named, '__qualname__', type(named).__qualname__)}"
    return ModelRecipe(label, "model", given, dict(cfg.args))


def build_model(cfg: ModelConfig, input_shape: Sequence[int], num_classes: int,
                seed: int | None = None, recipe: ModelRecipe | None = None) -> nn.Module:
    """A fresh model from ``recipe`` (default: ``cfg``'s). With ``seed``, its initial weights
    depend only on the seed (the global RNG is left as it was), so every node can start from
    the same M_0. With ``cfg.weights``, the model then starts from that file (see
    :func:`load_weights`)."""
    recipe = recipe if recipe is not None else model_recipe(cfg)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = recipe.build(tuple(input_shape), num_classes)
    if cfg.weights is not None:
        load_weights(model, cfg.weights)
    return model


def check_output(model: nn.Module, sample: torch.Tensor, num_classes: int) -> None:
    """One forward pass of ``model`` on ``sample`` (a batch of one), in eval mode without
    gradients (no weight, statistic or RNG changes); its output must be ``(1, num_classes)``."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(sample)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's forward failed on the data (or called sys.exit): one line
        raise ModelError(f"fails on one sample of shape {list(sample.shape)}: {one_line(exc)}") from None
    finally:
        model.train(was_training)
    got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got != [1, num_classes]:
        raise ModelError(f"returns {got} for one sample, the data has {num_classes} classes "
                         f"(expected [1, {num_classes}])")


def wire_bytes(state: Mapping[str, torch.Tensor], wire_dtype: str = "native") -> int:
    """The bytes ``state``'s tensors take as they travel: float32 ones at the ``[wire] dtype``
    (``"float16"``, ``"bfloat16"``: 2 bytes), the others at their own."""
    half = wire_dtype != "native"
    return sum(t.numel() * (2 if half and t.dtype == torch.float32 else t.element_size())
               for t in state.values())


def non_finite(state: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating tensor of ``state`` that holds NaN or infinity, if any."""
    # NaN and infinities always reach a sum: a finite sum settles it in one read-only pass
    # (isfinite().all() writes a whole mask first); only an overflowing sum is looked at closely.
    return next((name for name, t in state.items() if t.is_floating_point()
                 and not (bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all()))), None)


def check_sendable(model: nn.Module, federation: Federation, which: str) -> None:
    """Refuse (ModelError, "the model ...") a ``model`` every peer would refuse: one that holds NaN
    or infinity (``which`` weights: "initial", "trained") or is over ``[federation]
    max_model_mib`` as it travels."""
    state = model.state_dict()
    bad = non_finite(state)
    if bad is not None:
        raise ModelError(f"holds NaN or infinity in its {which} weights (tensor {bad!r}); every peer "
                         "refuses such a model")
    size, limit = wire_bytes(state, federation.wire.dtype), federation.max_model_mib
    if size > limit * 2**20:
        raise ModelError(f"takes {mib(size / 2**20)} MiB as it travels, over [federation] max_model_mib = "
                         f"{limit:g} (peers refuse larger models)")


def federation_model(federation: Federation, input_shape: Sequence[int], num_classes: int,
                     sample: torch.Tensor | None = None, recipe: ModelRecipe | None = None,
                     ) -> tuple[Callable[[], nn.Module], str, nn.Module]:
    """The federation's model factory (from ``recipe``, default the file's ``[model]``), which
    every node and the aggregator build M_0 with (each call a fresh model seeded by the
    federation seed), its fingerprint label, and one model it built: M_0, for the caller's
    own use.

    That model is run on ``sample`` (one sample shaped ``(1, *input_shape)``; zeros when
    None) so a bad model fails here, before any training: ModelError, one line naming the
    file and key. The check changes no weight. Blocking (imports the factory's module)."""
    shape = tuple(input_shape)
    try:
        recipe = recipe if recipe is not None else model_recipe(federation.model)
        factory = partial(build_model, federation.model, shape, num_classes,
                          seed=derive_seed(federation.seed, SEED_MODEL), recipe=recipe)
        model = factory()
        try:
            check_output(model, sample if sample is not None else torch.zeros(1, *shape), num_classes)
            check_sendable(model, federation, "initial")
        except ModelError as exc:
            raise ModelError(f"{recipe.key} {recipe.label!r}: the model {exc}") from None
    except ModelError as exc:
        raise ModelError(f"{federation.source}: {exc}") from None
    return factory, recipe.label, model


class ModelPool:
    """Spare models of one architecture, loaded with a state on loan and kept for the next caller.

    RPC handlers evaluate and fine-tune other nodes' models; building a model
    (seeded initialisation) for every call costs more than the evaluation of a
    small one. Thread-safe; keeps at most ``keep`` idle models.
    """

    def __init__(self, factory: Callable[[], nn.Module], device: torch.device, keep: int = 4):
        self._factory, self._device, self._keep = factory, device, keep
        self._idle: list[nn.Module] = []
        self._lock = threading.Lock()

    @contextmanager
    def loaded(self, state: Mapping[str, torch.Tensor]) -> Iterator[nn.Module]:
        """A model holding ``state`` (parameters and buffers) for the ``with`` block."""
        with self._lock:
            model = self._idle.pop() if self._idle else None
        if model is None:
            model = self._factory().to(self._device)
        model.load_state_dict(state)
        try:
            yield model
        finally:
            with self._lock:
                if len(self._idle) < self._keep:
                    self._idle.append(model)
