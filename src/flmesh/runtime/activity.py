"""What a node is doing now, and the last round it finished: the status its peers read.

The round loop writes it (:meth:`Activity.set_state`, :meth:`Activity.finish_round`);
RPC handlers, progress lines and ``Status`` read it. Thread-safe: one lock guards it all.
"""

from __future__ import annotations

import threading


class Activity:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "starting"
        self._peer: str | None = None  # whom the current state involves (set_state)
        self._round = 0
        self._last_accuracy = 0.0

    def set_state(self, state: str, peer: str | None = None) -> None:
        """What the node is doing now, and with whom (``peer``; None: nobody in particular)."""
        with self._lock:
            self._state = state
            self._peer = peer

    def current(self) -> tuple[str, str | None]:
        """(state, peer) as :meth:`set_state` last set them."""
        with self._lock:
            return self._state, self._peer

    def finish_round(self, round: int, accuracy: float) -> None:
        """Round ``round`` is over; its model scored ``accuracy`` (0..1) on the node's test split."""
        with self._lock:
            self._round = round
            self._last_accuracy = accuracy

    @property
    def last_round(self) -> int:
        """The last round finished (0: none yet)."""
        with self._lock:
            return self._round

    def snapshot(self) -> tuple[str, int, float]:
        """(state, last round finished, its accuracy), read together."""
        with self._lock:
            return self._state, self._round, self._last_accuracy
