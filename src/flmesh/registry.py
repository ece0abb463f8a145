"""One registry for every named extension point: a name stands for a factory.

=====================  =====================  =================================================
registry               entry-point group      a name stands for
=====================  =====================  =================================================
:data:`algorithms`     ``flmesh.algorithms``  an :class:`flmesh.Algorithm` subclass (or instance)
:data:`models`         ``flmesh.models``      ``factory(**args)``, with ``input_shape``
                                              and ``num_classes`` when it takes them,
                                              which returns a ``torch.nn.Module``
:data:`datasets`       ``flmesh.datasets``    ``load(cfg: DataConfig) -> ArrayData``
:data:`schedules`      ``flmesh.schedules``   ``factory(graph, *, seed) -> Schedule``
:data:`transports`     ``flmesh.transports``  ``factory(settings: TransportSettings) -> Backend``
:data:`learners`       ``flmesh.learners``    ``factory() -> Learner``
=====================  =====================  =================================================

A name resolves, in this order, to a run-time registration (:meth:`Registry.register`), one of
flmesh's own (flmesh's algorithms are entry points in its ``pyproject.toml``; the other kinds'
built-ins are listed here by import path), an installed package's entry point in the kind's
group, or, when the name has the form ``package.module:attribute``, that import path. A name
nothing answers to is a :class:`RegistryError` of one line that lists the known names.

Resolving imports the code a name stands for (blocking: its module's top-level code runs) and
keeps it; :meth:`Registry.names` imports nothing, so the federation file's checks list names
without loading torch. Import paths are code: they come only from the files and flags the
operator writes, never from the wire. Registering is not thread-safe: register before
federations are built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from flmesh.user_code import UserCodeError, is_import_path, load_object

T = TypeVar("T")


class RegistryError(ValueError):
    """A name or import path that leads to nothing usable of its kind (one line)."""


class AlgorithmError(RegistryError):
    """A name or import path that leads to no usable algorithm plug-in (one line)."""


def _as_is(obj: Any, where: str) -> Any:
    return obj


class Registry(Generic[T]):
    """The names of one kind of extension (see the module's table).

    ``kind`` names the kind in messages ("schedule"); ``group`` is the entry-point group of
    installed packages; ``builtins`` maps flmesh's own names to import paths, loaded on first
    use; ``adapt(obj, where)`` turns what a name leads to into the registered value, raising
    ``error`` (one line) when it is not one of the kind (default: taken as it is)."""

    def __init__(self, kind: str, group: str, builtins: Mapping[str, str] | None = None, *,
                 adapt: Callable[[Any, str], T] = _as_is, error: type[RegistryError] = RegistryError):
        self.kind, self.group = kind, group
        self.error = error
        self._builtins = dict(builtins or {})
        self._adapt = adapt
        self._registered: dict[str, T] = {}  # register()
        self._loaded: dict[str, T] = {}  # built-ins, entry points and import paths resolved so far

    # ------------------------------------------------------------------ names
    def installed(self) -> dict[str, EntryPoint]:
        """The entry points of :attr:`group` that installed packages declare, by name."""
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def builtin_names(self) -> list[str]:
        """flmesh's own names, sorted. Imports nothing."""
        own = {name for name, ep in self.installed().items() if ep.value.startswith("flmesh.")}
        return sorted(set(self._builtins) | own)

    def names(self) -> list[str]:
        """Every name known now, sorted: registrations, built-ins and installed entry points.
        Imports nothing."""
        return sorted(set(self._registered) | set(self._builtins) | set(self.installed()))

    def held(self, name: str) -> bool:
        """Whether ``name`` stands for something registered or resolved already (what it stands
        for is had without an import)."""
        return name in self._registered or name in self._loaded

    def unknown(self, name: object) -> str:
        """The one line that says ``name`` is no name of this kind, listing the known ones."""
        known = ", ".join(self.names()) or "none: is flmesh installed (pip install -e .)?"
        return (f"unknown {self.kind} {name!r} (registered: {known}; "
                "or give an import path package.module:name)")

    # ------------------------------------------------------------------ registering
    def register(self, name: str, value: Any) -> None:
        """Make ``name`` stand for ``value``. A name that already stands for something else
        raises :class:`RegistryError` (registering the same value again is a no-op). Not
        thread-safe: register before federations are built."""
        if not isinstance(name, str) or not name.isidentifier():
            raise self.error(f"a {self.kind} name is a Python identifier, got {name!r}")
        adapted = self._adapt(value, f"{self.kind} {name!r}")
        held = self._held(name)
        if held is not None and not self._same(held, adapted):
            raise self.error(f"{self.kind} {name!r} is already registered by {_label(held)}")
        self._registered[name] = adapted

    def unregister(self, name: str) -> None:
        """Forget a registration of ``name`` (an installed entry point is found again on the next
        :meth:`resolve`). Not thread-safe."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)

    def _held(self, name: str) -> T | None:
        """What ``name`` stands for now, loading a built-in to compare with; None: nothing."""
        if name in self._registered:
            return self._registered[name]
        if name in self._builtins:
            return self.resolve(name)
        return self._loaded.get(name)

    def _same(self, held: T, new: T) -> bool:
        return held is new

    # ------------------------------------------------------------------ resolving
    def resolve(self, name: str) -> T:
        """What ``name`` stands for (in the module's order); imports it on first use. Raises
        :class:`RegistryError` (one line; an unknown name lists the known ones)."""
        if name in self._registered:
            return self._registered[name]
        if name in self._loaded:
            return self._loaded[name]
        if name in self._builtins:
            value = self._load(self._builtins[name], f"{self.kind} {name!r}")
        elif (entry := self.installed().get(name)) is not None:
            value = self._load(entry.value, f"{self.kind} {name!r} (entry point of {self.group})",
                               entry=name)
        elif isinstance(name, str) and is_import_path(name):
            value = self._load(name, repr(name), path=name)
        else:
            raise self.error(self.unknown(name))
        self._loaded[name] = value
        return value

    def _load(self, target: str, where: str, *, entry: str | None = None, path: str | None = None) -> T:
        """Import ``target`` and adapt it; ``entry``: the entry point's name, ``path``: the
        import path the caller named (what an algorithm registry checks its plug-in against)."""
        try:
            obj = load_object(target)
        except UserCodeError as exc:
            raise self.error(str(exc) if path is not None else f"{where}: {exc}") from None
        return self._adapt(obj, where)


def _label(value: Any) -> str:
    named = value if hasattr(value, "__qualname__") else type(value)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', '?')}"


def _callable(obj: Any, where: str) -> Any:
    if not callable(obj):
        raise RegistryError(f"{where} is a {type(obj).__name__}, not something to call")
    return obj


# ---------------------------------------------------------------------- algorithms
#: The kinds of algorithm plug-in: named by ``[aggregator] strategy`` or ``[peers] strategy``, by
#: ``[training] objective``, or switched on by a section of their own (``[replay]`` for a data
#: plug-in, ``[rewind]`` for a training plug-in that has peers train part of a round).
ALGORITHM_KINDS = ("strategy", "peers", "objective", "data", "training")


def _is_algorithm_class(cls: type) -> bool:
    # By name: the registry must not import the plug-in base (and torch with it).
    return any(c.__module__ == "flmesh.algorithms.base" and c.__qualname__ == "Algorithm"
               for c in cls.__mro__)


def _is_param(p: Any) -> bool:
    return type(p).__module__ == "flmesh.config.params" and type(p).__qualname__ == "Param"


def as_algorithm(obj: Any, where: str) -> Any:
    """``obj`` as an algorithm plug-in: an instance of an :class:`flmesh.Algorithm` subclass with
    a name, a kind and :class:`~flmesh.config.params.Param` declarations (a class is built with
    no arguments). Raises :class:`AlgorithmError`."""
    cls = obj if isinstance(obj, type) else type(obj)
    name, kind = getattr(cls, "name", None), getattr(cls, "kind", None)
    if (not _is_algorithm_class(cls) or not isinstance(name, str) or not name
            or kind not in ALGORITHM_KINDS):
        raise AlgorithmError(f"{where} is not an algorithm plug-in (a subclass of "
                             f"flmesh.algorithms.base.Algorithm with a name and a kind of "
                             f"{', '.join(ALGORITHM_KINDS)})")
    for p in getattr(cls, "params", ()):
        if not _is_param(p):
            raise AlgorithmError(f"{where}: params must be Param declarations, got {type(p).__name__}")
    try:  # only now: a class is built only when it is a plug-in
        return obj() if isinstance(obj, type) else obj
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the plug-in's constructor raised (or called sys.exit)
        raise AlgorithmError(f"{where}: building the plug-in failed: {type(exc).__name__}: {exc}") from None


class AlgorithmRegistry(Registry[Any]):
    """Algorithm plug-ins: a plug-in's own ``name`` is the name it is known by, so an entry
    point must lead to the plug-in of its name, and a plug-in named by its import path may not
    carry a name another plug-in holds."""

    def _same(self, held: Any, new: Any) -> bool:
        return type(held) is type(new)

    def _load(self, target: str, where: str, *, entry: str | None = None, path: str | None = None) -> Any:
        plugin = super()._load(target, where, entry=entry, path=path)
        if entry is not None and plugin.name != entry:
            raise self.error(f"entry point {entry!r} of {self.group} leads to the plug-in named "
                             f"{plugin.name!r}")
        if path is not None and (plugin.name in self._registered or plugin.name in self.installed()):
            raise self.error(f"{path!r} is named {plugin.name!r}, which names another plug-in")
        return plugin

    def register_plugin(self, cls: Any) -> Any:
        """Register ``cls`` (a plug-in class or instance) under its own name; returns ``cls``."""
        plugin = as_algorithm(cls, repr(cls))
        held = self._registered.get(plugin.name) or self._loaded.get(plugin.name)
        if held is None and plugin.name in self.installed():
            try:  # an installed plug-in of that name, not loaded yet: it holds the name
                held = self.resolve(plugin.name)
            except RegistryError:
                held = None  # a broken package holds nothing
        if held is not None and type(held) is not type(plugin):
            raise self.error(f"algorithm name {plugin.name!r} is already registered by "
                             f"{type(held).__module__}.{type(held).__qualname__}")
        self._registered[plugin.name] = plugin
        return cls

    def unknown(self, name: object) -> str:
        known = ", ".join(self.names()) or "none: is flmesh installed (pip install -e .)?"
        return (f"unknown algorithm {name!r} (registered: {known}; "
                "or give an import path package.module:Class)")


#: Algorithm plug-ins (``[aggregator] strategy``, ``[training] objective``, ``[algorithm.NAME]``).
algorithms = AlgorithmRegistry("algorithm", "flmesh.algorithms", adapt=as_algorithm, error=AlgorithmError)

#: Model factories: ``[model] name`` (flmesh's own) and ``[model] factory``.
models: Registry[Callable[..., Any]] = Registry("model", "flmesh.models", {
    "mlp": "flmesh.learning.models:mlp", "cnn": "flmesh.learning.models:cnn",
    "cnn2": "flmesh.learning.models:cnn2", "resnet18": "flmesh.learning.models:resnet",
}, adapt=_callable)

#: Data sets (``[data] dataset``; "a+b" joins registered sets into one label space).
datasets: Registry[Callable[..., Any]] = Registry("dataset", "flmesh.datasets", {
    "digits": "flmesh.learning.data:digits",
    **{name: f"flmesh.learning.vision:LOADERS.{name}"
       for name in ("mnist", "fashion_mnist", "cifar10", "cifar100", "emnist_byclass", "emnist_bymerge",
                    "emnist_balanced", "emnist_letters", "emnist_digits", "emnist_mnist")},
}, adapt=_callable)

#: Exchange schedules (``[topology] schedule``; the Standalone baseline's is "standalone").
schedules: Registry[Callable[..., Any]] = Registry("schedule", "flmesh.schedules", {
    "cwt": "flmesh.topology.schedules:CyclicSchedule",
    "rwt": "flmesh.topology.schedules:RandomSchedule",
    "standalone": "flmesh.topology.schedules:StandaloneSchedule",
    "gossip": "flmesh.topology.gossip:GossipSchedule",
    "epidemic": "flmesh.topology.gossip:EpidemicSchedule",
    "exponential": "flmesh.topology.gossip:ExponentialSchedule",
}, adapt=_callable)

#: Transport backends (``fl-sim --transport``, ``Simulation(transport=...)``).
transports: Registry[Callable[..., Any]] = Registry("transport", "flmesh.transports", {
    "memory": "flmesh.transports.memory.backend:MemoryBackend",
    "grpc": "flmesh.transports.grpc.backend:GrpcBackend",
}, adapt=_callable)

#: Learners (``[training] learner``): each name stands for a callable that returns a learner.
learners: Registry[Callable[[], Any]] = Registry("learner", "flmesh.learners", {
    "default": "flmesh.learning.learner:default_learner",
}, adapt=_callable)

#: Every registry, by the name of its entry-point group's last part ("schedules").
REGISTRIES: dict[str, Registry[Any]] = {
    r.group.rpartition(".")[2]: r for r in (algorithms, models, datasets, schedules, transports, learners)}


def register_algorithm(cls: Any) -> Any:
    """Register the plug-in ``cls`` (an :class:`flmesh.Algorithm` subclass, or an instance)
    under its ``name``; returns ``cls``, so it serves as a class decorator. A name taken by
    another plug-in raises :class:`AlgorithmError`. Not thread-safe: register before
    federations are validated."""
    return algorithms.register_plugin(cls)


def register_schedule(name: str, factory: Callable[..., Any]) -> None:
    """Make ``[topology] schedule = "name"`` build with ``factory(graph, seed=...)`` (a class
    following :class:`flmesh.Schedule`; an installed package can declare an entry point of
    ``flmesh.schedules`` instead). Not thread-safe: register at import time, before any
    federation is built. Raises ValueError for a name already taken."""
    schedules.register(name, factory)


__all__ = ["ALGORITHM_KINDS", "REGISTRIES", "AlgorithmError", "AlgorithmRegistry", "Registry",
           "RegistryError", "algorithms", "as_algorithm", "datasets", "learners", "models",
           "register_algorithm", "register_schedule", "schedules", "transports"]
