"""Getting a model from the source and handing one on, when peers are slow or gone.

Receiving (:meth:`PeerExchange.wait_for_source`): the model of round t-1 comes from the
round's source, or, when the source is down, from the source's own source,
which falls back to its next live successor (there is no coordinator to
reroute it). The wait is progress-based: after ``round_timeout_s`` the node
asks the peers it waits for (``Status``) and keeps waiting, in steps, while
one of them is alive and still working on that round (it was itself held up
upstream); it stops at once when none answers, and at ``MAX_WAIT_FACTOR``
times the timeout in any case. So a node downstream of a dead one is late,
not missing.

Sending (:meth:`PeerExchange.deliver_onward`): to the round's destination with retries;
when it stays unreachable, to the destination's successor, and the report
says so. A destination that refuses the model as too far ahead of its own
rounds (its window is full) is alive and behind: the sender waits while it
catches up (:meth:`PeerExchange.await_catch_up`, progress-based like the receiving side)
instead of handing the model to its successor. Without that wait, a node that
is steadily slower than the rest of a CWT ring (one of N nodes can fall up to
N-1 rounds behind its source) had its source's models go to its successor
round after round, and waited a round timeout each time for a model that had
gone elsewhere, so a run slowed to a round timeout per round.

Both name the peer whose model was missing, for the report, and only a peer
that was: a source whose model never came or whose fallback's came instead, a
destination this node's model did not reach. A peer that finished the round
(its ``Status`` says so, or a later model it sent) while this node could not
take or send the model in time is not named: this node was the one away
(stopped, restarting, late).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from flmesh.format.codec import DecodedModel, EncodedModel
from flmesh.runtime.inbox import ROUND_WINDOW, Inbox, InboxKey
from flmesh.runtime.parts import encode_own
from flmesh.topology.peers import FALLBACK_HOPS, senders_to, successors
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import DeliverResult, PeerStatus

if TYPE_CHECKING:
    from flmesh.clock import Clock
    from flmesh.runtime.activity import Activity
    from flmesh.runtime.model_state import ModelState
    from flmesh.runtime.parts import Settings, Share
    from flmesh.runtime.peer_calls import PeerCalls
    from flmesh.transports.seam import PeerTransport

#: A wait is extended in steps of this share of the round timeout while a peer makes progress...
EXTEND_SHARE = 0.5
#: ...up to this many round timeouts in all.
MAX_WAIT_FACTOR = 4.0
#: Seconds to wait for one Status answer.
STATUS_TIMEOUT_S = 3.0
#: ...and for the one that decides whether a source that sent nothing is named missing: a busy
#: peer may answer late, and naming a healthy peer is worse than a few seconds more.
LAST_STATUS_TIMEOUT_S = 10.0
#: Longest pause between two Status calls while a destination catches up (seconds).
CATCH_UP_POLL_S = 0.5


class PeerExchange:
    """A node's side of the model walk: waiting for the model its round trains, handing its own
    on. Holds the node's settings, its model and data share (to encode what it sends), the peer
    transport and retried calls, the inbox, the clock and stop signal, its activity and log.
    Blocking; called from the round loop only."""

    def __init__(self, settings: Settings, model: ModelState, share: Share, transport: PeerTransport,
                 calls: PeerCalls, inbox: Inbox, clock: Clock, stop: threading.Event, activity: Activity,
                 log: logging.Logger):
        self.settings, self.model, self.share = settings, model, share
        self.transport, self.calls, self.inbox = transport, calls, inbox
        self.clock, self.stop, self.activity, self.log = clock, stop, activity, log

    def senders_for(self, round: int) -> list[str]:
        """Who may hand this node its round-``round`` input, in order of preference: the source,
        then the nodes whose fallback reaches this node (the source's source)."""
        return senders_to(self.settings.federation, self.settings.node_id, round - 1, FALLBACK_HOPS)


    def _status(self, peer: str, timeout: float = STATUS_TIMEOUT_S) -> PeerStatus | None:
        """``peer``'s Status, or None when it does not answer within ``timeout`` seconds or this
        node is stopping (it asks nobody then)."""
        if self.stop.is_set():
            return None
        try:
            return self.transport.status(peer, timeout=timeout)
        except PeerError:
            return None


    def _working_on(self, peer: str, round: int) -> bool:
        """Is ``peer`` up and still producing its round-``round`` model (not past that round, or
        still sending it: it may be retrying a dead destination before it falls back)?"""
        status = self._status(peer)
        if status is None or status.state in ("done", "stopped"):
            return False
        return status.round < round or (status.round == round and status.state == "sending")


    def finished(self, peer: str, round: int) -> bool:
        """Does ``peer`` answer ``Status`` as done with round ``round``, its model handed on (past
        that round, or in it and no longer sending)? Blocks up to LAST_STATUS_TIMEOUT_S."""
        status = self._status(peer, LAST_STATUS_TIMEOUT_S)
        return status is not None and (status.round > round or (status.round == round
                                                                and status.state != "sending"))


    def wait_for_source(self, round: int,
                        notes: list[str]) -> tuple[str | None, DecodedModel | None, str | None]:
        """Block until a model of round ``round - 1`` arrives from one of :func:`senders_for`, or
        no sender makes progress any more; (sender, model, the source when its model was missing:
        a fallback sent instead, or nothing came and the source did not finish that round), with
        a note when not from the source."""
        senders = self.senders_for(round)
        keys = [InboxKey(round - 1, s, "trained") for s in senders]
        timeout = self.settings.round_timeout_s
        deadline = self.clock.now() + timeout
        last_chance = self.clock.now() + MAX_WAIT_FACTOR * timeout
        extended = last_look = False
        while True:
            found = self.inbox.wait_any(keys, max(0.0, deadline - self.clock.now()),
                                             self.stop)
            if found:
                sender = next(k.sender for k in keys if k in found)
                if sender == senders[0]:
                    return sender, found[InboxKey(round - 1, sender, "trained")], None
                notes.append(f"{senders[0]} was down; got {sender}'s model instead (its fallback)")
                return sender, found[InboxKey(round - 1, sender, "trained")], senders[0]
            if last_look or self.stop.is_set() or self.clock.now() >= last_chance:
                break
            if not any(self._working_on(s, round - 1) for s in senders):
                # A sender that finished while we asked may have delivered since the wait ended: its
                # Status then says it is past the round, and the model is already here.
                last_look, deadline = True, self.clock.now()
                continue
            deadline = min(last_chance, self.clock.now() + EXTEND_SHARE * timeout)
            extended = True
        waited = f"{timeout:g}s" + (" and longer while it was still working" if extended else "")
        source = senders[0]
        # a source that finished the round (it sent this node a later model, or says so) sent its
        # model while this node could not take it; it may have left since, its run over
        later = any(k.sender == source and k.kind == "trained" and k.round >= round
                    for k in self.inbox.keys())
        away = not self.stop.is_set() and (later or self.finished(source, round - 1))
        why = (f" ({source} finished round {round - 1} while this node could not take its model)"
               if away else "")
        notes.append(f"no model from {source} within {waited}{why}; trained the model it had")
        self.log.warning("round %d: %s", round, notes[-1],
                              extra={"node": self.settings.node_id, "round": round})
        return None, None, None if away else source


    def await_catch_up(self, peer: str, round: int) -> bool | None:
        """After ``peer`` refused this node's round-``round`` model with RESOURCE_EXHAUSTED: wait,
        asking its ``Status``, until its window takes the model (it finished round ``round -
        ROUND_WINDOW`` or later). True: it does now. None: it was not behind (the refusal meant
        something else, e.g. busy, for the caller's retries). False: it is behind and made no
        progress for a round timeout, stopped, or stopped answering; or this node is stopping.
        Blocks on the node's clock."""
        deadline = self.clock.now() + self.settings.round_timeout_s
        seen: int | None = None
        pause = 0.05
        while not self.stop.is_set():
            try:
                status = self.transport.status(peer, timeout=STATUS_TIMEOUT_S)
            except PeerError:
                return False
            if round <= status.round + ROUND_WINDOW:
                return True if seen is not None else None
            if status.state in ("done", "stopped"):
                return False
            if status.round != seen:  # it finished another round: give it a round timeout more
                seen, deadline = status.round, self.clock.now() + self.settings.round_timeout_s
            if self.clock.now() >= deadline:
                return False
            self.clock.sleep(pause, self.stop)
            pause = min(2 * pause, CATCH_UP_POLL_S)
        return False


    def _deliver_once_admitted(self, to: str, message: EncodedModel, round: int) -> DeliverResult:
        """One delivery of ``message`` to ``to``, sent again each time ``to`` catches up after
        refusing it as too far ahead; other failures raise as they come (for the retries)."""
        while True:
            try:
                return self.transport.deliver(to, message, timeout=self.settings.round_timeout_s)
            except PeerError as exc:
                caught_up = self.await_catch_up(to, round) if exc.code == "RESOURCE_EXHAUSTED" else None
                if caught_up is None:
                    raise  # not behind: busy, too large or unreachable, which the retries handle
                if not caught_up:
                    raise PeerError(exc.peer, exc.address, "FAILED_PRECONDITION",
                                    f"{to} stayed more than {ROUND_WINDOW} rounds behind round {round} "
                                    "without progress for a round timeout") from None


    def deliver_onward(self, round: int, destination: str, notes: list[str],
                       message: EncodedModel | None = None,
                       targets: list[str] | None = None) -> tuple[str | None, str | None]:
        """Send this node's round-``round`` model (``message``: already encoded) to ``destination``
        (retries with backoff; waits while a destination that is rounds behind catches up), else to
        its successor; (who got it, the destination when it was missing). A destination that
        finished round ``round + 1`` without the model went on while this node was late: nobody
        gets it, nobody is missing (noted). ``targets``: whom to try, when a
        :class:`~flmesh.runtime.peer_round.WalkPlan` decided it on simulated time (the destination,
        its successor, or nobody: every candidate was offline); default: the destination, then its
        successors."""
        self.activity.set_state("sending", destination)
        message = message if message is not None else encode_own(self.settings, self.model, self.share, round)
        planned = targets is not None
        if targets is None:
            targets = successors(self.settings.federation.schedule().plan(round), self.settings.node_id,
                                 FALLBACK_HOPS)
        for target in targets:
            if not self.transport.knows(target):
                continue

            def send(to: str = target) -> DeliverResult:
                return self._deliver_once_admitted(to, message, round)

            if self.calls.call(target, "delivery to", round, send) is not None:
                if target != destination:
                    why = "offline" if planned else "unreachable"
                    notes.append(f"{destination} was {why}; delivered to {target} (its successor)")
                    return target, destination
                return target, None
            moved_on = self._status(destination) if target == destination else None
            if moved_on is not None and moved_on.round > round:  # it finished the round that needed it
                notes.append(f"{destination} finished round {round + 1} before this node's model came; "
                             "not sent on")
                return None, None
        notes.append(f"could not deliver to {destination}" +
                     (" (it and its successor were offline)" if planned and not targets else ""))
        return None, destination

    def take_planned(self, round: int, sender: str | None,
                     notes: list[str]) -> tuple[str | None, DecodedModel | None, str | None]:
        """:meth:`wait_for_source` when a :class:`~flmesh.runtime.peer_round.WalkPlan` decided on
        simulated time whose model comes (``sender``; None: none came in time): wait for that
        model, which its sender hands on to this node, up to MAX_WAIT_FACTOR round timeouts."""
        source = self.senders_for(round)[0]
        if sender is not None:
            key = InboxKey(round - 1, sender, "trained")
            found = self.inbox.wait(key, MAX_WAIT_FACTOR * self.settings.round_timeout_s, self.stop)
            if found is not None:
                if sender == source:
                    return sender, found, None
                notes.append(f"{source} was offline; got {sender}'s model instead (its fallback)")
                return sender, found, source
            if not self.stop.is_set():  # the plan said it was handed on here: something broke
                self.log.warning("round %d: the model planned to come from %s did not", round, sender,
                                 extra={"node": self.settings.node_id, "round": round})
        notes.append(f"no model from {source} in time (simulated); trained the model it had")
        return None, None, source


__all__ = ["PeerExchange"]
