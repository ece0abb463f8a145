"""The lock-step fl-sim's workers keep among themselves (coordinator/sim_mesh.py), here with the
workers' ends in one process: the same pipes, read by the same threads."""

from __future__ import annotations

import os
import threading

from flmesh.coordinator.sim_mesh import Mesh, MeshPipes

from conftest import wait_until


def _meet_on_threads(mesh: Mesh, name: str, round: int, nodes: int,
                     results: list[bool]) -> list[threading.Thread]:
    threads = [threading.Thread(target=lambda: results.append(mesh.meet(name, round)), daemon=True)
               for _ in range(nodes)]
    for t in threads:
        t.start()
    return threads


def test_a_wait_opens_once_every_node_of_every_worker_has_arrived():
    pipes = MeshPipes(3)
    # the three workers' ends in one process (fl-sim closes its copies once workers hold theirs;
    # here they are the workers' own, so they stay open)
    meshes = [Mesh(pipes.ends(i), nodes) for i, nodes in enumerate((2, 1, 3))]
    opened: list[bool] = []
    waiting = _meet_on_threads(meshes[0], "trained", 1, 2, opened)
    waiting += _meet_on_threads(meshes[2], "trained", 1, 3, opened)
    wait_until(lambda: ("trained", 1) in meshes[1]._waits
               and len(meshes[1]._waits[("trained", 1)].remote) == 2)
    assert not opened, "worker 1's node has not arrived"
    assert all(t.is_alive() for t in waiting)
    waiting += _meet_on_threads(meshes[1], "trained", 1, 1, opened)
    for t in waiting:
        t.join(10)
    assert opened == [True] * 6
    # the other wait and the next round are counted apart from this one
    later: list[bool] = []
    waiting = [*_meet_on_threads(meshes[0], "round_over", 1, 2, later),
               *_meet_on_threads(meshes[1], "trained", 2, 1, later)]
    wait_until(lambda: all(("round_over", 1) in m._waits for m in meshes))
    assert not later and all(t.is_alive() for t in waiting)
    for m in meshes:
        m.stop()
    for t in waiting:
        t.join(10)
    assert later == [False] * 3
    assert meshes[2].meet("trained", 3) is False, "after a stop every wait opens at once"


def test_one_worker_needs_no_pipes():
    pipes = MeshPipes(1)
    assert pipes.pipes == [] and pipes.ends(0) == {"index": 0, "read": None, "write": []}
    mesh = Mesh(pipes.ends(0), 2)
    opened: list[bool] = []
    for t in _meet_on_threads(mesh, "trained", 1, 2, opened):
        t.join(10)
    assert opened == [True, True]


def test_each_worker_keeps_only_its_own_ends():
    pipes = MeshPipes(3)
    try:
        everything = {fd for pipe in pipes.pipes for fd in pipe}
        for i in range(3):
            kept, others = set(pipes.kept(i)), set(pipes.others(i))
            assert kept | others == everything and not kept & others
            assert pipes.pipes[i][0] in kept and pipes.pipes[i][1] in others
    finally:
        pipes.close()


def test_a_sibling_that_is_gone_does_not_stop_the_others_from_arriving():
    pipes = MeshPipes(2)
    alive = Mesh(pipes.ends(0), 1)
    (read0, write0), (read1, write1) = pipes.pipes
    os.close(read1)  # worker 1 died: nobody reads its pipe any more
    os.close(write0)  # and its write end to worker 0 went with it
    opened: list[bool] = []
    waiting = _meet_on_threads(alive, "trained", 1, 1, opened)  # writing to the dead pipe must not raise
    wait_until(lambda: ("trained", 1) in alive._waits)
    alive.stop()  # what fl-sim does when it sees a worker die
    for t in waiting:
        t.join(10)
    assert opened == [False]
    os.close(write1)
