"""A node's place in a task stream: which task it is in, what it holds, whether it takes part.

The round engine calls :meth:`ContinualState.advance` at the start of every
round. On a task change the node's client halves see the training data about
to be lost (DP replay keeps its local buffer and releases its means), the
node swaps in its share of the new task (its test share joins the test
shares of earlier tasks, so evaluation covers every task seen), the client
halves fetch what they need (the global buffer), and the node trains from
then on on the new share plus whatever the client halves add. Not
thread-safe: the round loop calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flmesh.learning.arrays import ArrayData, NodeData
from flmesh.learning.data import node_data
from flmesh.learning.tasks import TaskSource, concat
from flmesh.topology.tasks import participates, task_of

if TYPE_CHECKING:
    from flmesh.config import Federation
    from flmesh.replay.buffer import ReplayBufferCore
    from flmesh.runtime.parts import NodeParts, Settings, Share
    from flmesh.runtime.plugins import NodePlugins
    from flmesh.transports.backend import Backend
    from flmesh.transports.seam import ReplayTransport


class ContinualState:
    def __init__(self, source: TaskSource):
        self.source = source
        self.cfg = source.cfg
        self.task = -1  # no task entered yet
        self.released = 0  # the last task change whose release happened (task changes from 1)
        self.own: ArrayData | None = None  # the current task's training share
        self.tests: list[ArrayData] = []  # this node's test shares of every task it was in

    def participates(self, settings: Settings, round: int) -> bool:
        fed = settings.federation
        return participates(self.cfg, fed.node_ids, settings.node_id, round, fed.seed)

    def advance(self, plugins: NodePlugins, share: Share, round: int) -> list[str]:
        """Enter the task ``round`` belongs to (one task at a time), swapping ``share``'s data;
        what the report should say."""
        notes: list[str] = []
        target = task_of(self.cfg, round)
        while self.task < target:
            self.release(plugins, self.task + 1)
            notes += self._enter(plugins, share, self.task + 1)
        return notes

    def release(self, plugins: NodePlugins, task: int) -> None:
        """The first half of a task change, once: the client halves see the data about to be
        lost (DP replay keeps its local buffer and releases its means). Separate so a test can
        let every node release before any fetches the buffer the releases make."""
        if task <= self.released or task != self.task + 1 or task == 0:
            return
        old = self.own if self.own is not None and len(self.own) else None
        for client in plugins.clients.values():
            client.on_task_change(old, self.task, task)
        self.released = task

    def resume(self, plugins: NodePlugins, share: Share, task: int, released: int) -> None:
        """Back in ``task`` after a restart (:mod:`flmesh.runtime.checkpoint`): the same data as
        entering it, without the task-change hooks (the plug-ins' state is restored already)."""
        if task < 0:
            return
        self.tests = [part.test for t in range(task + 1) if len((part := self.source.share(t)).test)]
        part = self.source.share(task)
        self.own, self.task, self.released = part.train, task, released
        test = concat(self.tests) if self.tests else part.test
        extra = [d for client in plugins.clients.values() for d in client.extra_training_data() if len(d)]
        share.data = NodeData(concat([part.train, *extra]) if extra else part.train, test)

    def _enter(self, plugins: NodePlugins, share: Share, task: int) -> list[str]:
        part = self.source.share(task)
        if len(part.test):
            self.tests.append(part.test)
        self.own, self.task = part.train, task
        test = concat(self.tests) if self.tests else part.test
        share.data = NodeData(part.train, test)  # client halves read the new data from here
        for client in plugins.clients.values():
            client.after_task_change(task)
        extra = [d for client in plugins.clients.values() for d in client.extra_training_data() if len(d)]
        if extra:
            share.data = NodeData(concat([part.train, *extra]), test)
        notes = [f"entered task {task}: {len(part.train)} samples of its own"
                 + (f", {sum(len(d) for d in extra)} replayed" if extra else "")]
        for client in plugins.clients.values():
            notes += client.notes
            client.notes.clear()
        return notes


def empty_share(source: TaskSource) -> NodeData:
    """Shapes without samples: what a node holds before it enters its first task."""
    share = source.share(0)
    return NodeData(ArrayData(share.train.x[:0], share.train.y[:0], share.train.num_classes),
                    ArrayData(share.test.x[:0], share.test.y[:0], share.test.num_classes,
                              task=share.test.task[:0] if share.test.task is not None else None,
                              num_tasks=share.test.num_tasks))


def node_share(federation: Federation, node_id: str, data: NodeData | None, dataset: ArrayData | None,
               source: Callable[..., Any] | None = None) -> tuple[NodeData, TaskSource | None]:
    """What node ``node_id`` starts with: in a continual federation the shapes of its share and
    its task source (cut from ``dataset``, the whole set, when given; else read at each task
    change), otherwise ``data`` or, when None, its share read from the data set (``source``:
    a Task's resolved ``[data] source``)."""
    if federation.tasks is not None:
        tasks = TaskSource.for_node(federation, node_id, dataset, source)
        return empty_share(tasks), tasks
    return (data if data is not None else node_data(federation, node_id, source)), None


def wire_replay(parts: NodeParts, backend: Backend, aggregator: str | None,
                state_dir: Path | None = None) -> ReplayBufferCore | None:
    """Point a node of a federation with ``[replay]`` at its buffer host through ``backend``:
    the aggregator of a star federation (at ``aggregator``), else the node ``[replay] host``
    names (default: the first node), which hosts the buffer itself (its privacy ledger in
    ``state_dir``) and reaches it in-process. Returns the buffer this node hosts, else None;
    a host peer is reached once :meth:`~flmesh.runtime.replay_link.ReplayLink.connect` learns
    its address."""
    from flmesh.replay.buffer import ReplayBufferCore
    from flmesh.runtime.inbox import ROUND_WINDOW
    from flmesh.runtime.replay_link import local_replay

    fed, me, counter = parts.settings.federation, parts.settings.node_id, parts.counter
    if fed.replay is None:
        return None
    if fed.aggregator is not None:
        parts.replay.target = backend.replay_transport(me, "aggregator", aggregator, counter)
        return None
    host = fed.replay.host or fed.node_ids[0]
    if host == me:
        train, activity = parts.share.data.train, parts.activity
        core = ReplayBufferCore(fed, train.input_shape, train.num_classes, state_dir=state_dir,
                                clock=parts.clock, progress=lambda: activity.last_round + 1 + ROUND_WINDOW)
        parts.replay.target = local_replay(core, me, counter)
        return core

    def remote(address: str) -> ReplayTransport:
        return backend.replay_transport(me, host, address, counter)

    parts.replay.host, parts.replay.factory = host, remote
    return None
