"""Getting a model from the source and handing one on, when peers are slow or gone.

Receiving (:func:`wait_for_source`): the model of round t-1 comes from the
round's source, or, when the source is down, from the source's own source,
which falls back to its next live successor (DESIGN.md, "Rounds without a
coordinator"). The wait is progress-based: after ``round_timeout_s`` the node
asks the peers it waits for (``Status``) and keeps waiting, in steps, while
one of them is alive and still working on that round (it was itself held up
upstream); it stops at once when none answers, and at ``MAX_WAIT_FACTOR``
times the timeout in any case. So a node downstream of a dead one is late,
not missing.

Sending (:func:`deliver_onward`): to the round's destination with retries;
when it stays unreachable, to the destination's successor, and the report
says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flmesh.node.errors import PeerError
from flmesh.node.inbox import InboxKey
from flmesh.node.transport import DeliverResult
from flmesh.node.wire.codec import DecodedModel
from flmesh.topology.peers import FALLBACK_HOPS, successors

if TYPE_CHECKING:
    from flmesh.node.node import Node

#: A wait is extended in steps of this share of the round timeout while a peer makes progress...
EXTEND_SHARE = 0.5
#: ...up to this many round timeouts in all.
MAX_WAIT_FACTOR = 4.0
#: Seconds to wait for one Status answer.
STATUS_TIMEOUT_S = 3.0


def senders_for(node: Node, round: int) -> list[str]:
    """Who may hand this node its round-``round`` input, in order of preference: the source,
    then the nodes whose fallback reaches this node (the source's source)."""
    plan = node.federation.schedule().plan(round - 1)
    ordered = [s for s in node.federation.node_ids if s != node.node_id
               and node.node_id in successors(plan, s, FALLBACK_HOPS)]
    return sorted(ordered, key=lambda s: successors(plan, s, FALLBACK_HOPS).index(node.node_id))


def _working_on(node: Node, peer: str, round: int) -> bool:
    """Is ``peer`` up and still producing its round-``round`` model (not past that round, or
    still sending it: it may be retrying a dead destination before it falls back)?"""
    try:
        status = node.transport.status(peer, timeout=STATUS_TIMEOUT_S)
    except PeerError:
        return False
    if status.state in ("done", "stopped"):
        return False
    return status.round < round or (status.round == round and status.state == "sending")


def wait_for_source(node: Node, round: int, notes: list[str]) -> tuple[str | None, DecodedModel | None]:
    """Block until a model of round ``round - 1`` arrives from one of :func:`senders_for`, or
    no sender makes progress any more; (sender, model), or (None, None) with a note."""
    senders = senders_for(node, round)
    keys = [InboxKey(round - 1, s, "trained") for s in senders]
    timeout = node.round_timeout_s
    deadline = node.clock.now() + timeout
    last_chance = node.clock.now() + MAX_WAIT_FACTOR * timeout
    extended = False
    while True:
        found = node.inbox.wait_any(keys, max(0.0, deadline - node.clock.now()), node.stop_event)
        if found:
            sender = next(k.sender for k in keys if k in found)
            if sender != senders[0]:
                notes.append(f"{senders[0]} was down; got {sender}'s model instead (its fallback)")
            return sender, found[InboxKey(round - 1, sender, "trained")]
        if node.stop_event.is_set() or node.clock.now() >= last_chance:
            break
        if not any(_working_on(node, s, round - 1) for s in senders):
            break
        deadline = min(last_chance, node.clock.now() + EXTEND_SHARE * timeout)
        extended = True
    waited = f"{timeout:g}s" + (" and longer while it was still working" if extended else "")
    notes.append(f"no model from {senders[0]} within {waited}; trained the model it had")
    node.log.warning("%s: round %d: %s", node.node_id, round, notes[-1])
    return None, None


def deliver_onward(node: Node, round: int, destination: str, notes: list[str]) -> str | None:
    """Send this node's round-``round`` model to ``destination`` (retries with backoff), else
    to its successor; who got it (None: nobody, noted)."""
    node.set_state("sending", destination)
    message = node.encode(round)
    plan = node.federation.schedule().plan(round)
    for target in successors(plan, node.node_id, FALLBACK_HOPS):
        if not node.transport.knows(target):
            continue

        def send(to: str = target) -> DeliverResult:
            return node.transport.deliver(to, message, timeout=node.round_timeout_s)

        if node.calls.call(target, "delivery to", round, send) is not None:
            if target != destination:
                notes.append(f"{destination} was unreachable; delivered to {target} (its successor)")
            return target
    notes.append(f"could not deliver to {destination}")
    return None
