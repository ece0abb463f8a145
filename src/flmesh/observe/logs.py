"""What operators and researchers watch: log lines (human or JSON) and TensorBoard scalars.

- :func:`setup_logging`: ``--log-format text`` (human lines, the default) or
  ``json`` (one object per line: ``time``, ``level``, ``node``, ``round``,
  ``peer``, ``event``; ``round`` and ``peer`` when the line is about one), at
  ``--log-level``. Log calls give the round and peer as ``extra``.
- :class:`Board`: ``--tensorboard DIR`` writes each round's metrics through
  ``torch.utils.tensorboard`` (the ``flmesh[tensorboard]`` extra), each run in
  its own subfolder of DIR, so TensorBoard shows runs sent to one DIR side by side.

A log call about one node gives it as ``extra={"node": ID}`` instead of writing it into the
message: fl-node's prefix names its node already, and fl-sim's :class:`NodeNamed` adds it.

Thread-safe as the logging module and SummaryWriter are.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, node, round, peer, event."""

    def __init__(self, node: str):
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "node": getattr(record, "node", self.node),
            "round": getattr(record, "round", None), "peer": getattr(record, "peer", None),
            "event": record.getMessage(), "logger": record.name,
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(entry)


class NodeNamed(logging.Formatter):
    """``node: message`` for a record that names its node (``extra={"node": ID}``), the message
    alone for one that does not: the text format of a log many nodes share (fl-sim's). A
    record's message never names its own node, so fl-node's prefix is the only one there."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        node = getattr(record, "node", None)
        return f"{node}: {text}" if node else text


def setup_logging(node: str, level: str, fmt: str, prefix: str) -> None:
    """Log to stderr as ``fmt`` ("text": ``HH:MM:SS prefix: message``; "json": see module doc)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}: %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def run_folder(root: Path, run: str, fresh: bool) -> Path:
    """``root/run``; when ``fresh`` and that folder already holds files, the first free
    ``root/run-2``, ``root/run-3``, ... (a new run never appends its steps to another run's; a
    resumed one, not ``fresh``, goes on in its own)."""
    folder = Path(root) / run
    n = 1
    while fresh and folder.is_dir() and any(folder.iterdir()):
        n += 1
        folder = Path(root) / f"{run}-{n}"
    return folder


class Board:
    """Per-round scalars of one run in its own TensorBoard log folder (``folder``). ``close``
    when done."""

    def __init__(self, root: Path, run: str, *, fresh: bool = True):
        """Write into :func:`run_folder` (``root``: the ``--tensorboard`` folder; ``run``: the
        run's name, its results folder's). Raises OSError (one line naming ``--tensorboard``)
        when the folder cannot be made, and MissingExtra without the tensorboard package."""
        from flmesh.learning.extras import require

        tensorboard = require("torch.utils.tensorboard", "tensorboard", "--tensorboard")
        self.folder = run_folder(root, run, fresh)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"--tensorboard {root}: cannot make {self.folder}: {exc.strerror or exc}") from None
        self.writer: Any = tensorboard.SummaryWriter(log_dir=str(self.folder))

    def scalars(self, round: int, values: dict[str, float | None]) -> None:
        """``values`` (name -> number, None skipped) at step ``round``."""
        for name, value in values.items():
            if value is not None:
                self.writer.add_scalar(name, value, round)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def row_scalars(row: Any) -> dict[str, float | None]:
    """What a results row (:class:`~flmesh.reports.results.RoundRow`) puts on the board."""
    values: dict[str, float | None] = {
        "federation/FA": row.fa, "federation/FF": row.ff, "federation/PFA": row.pfa,
        "global/accuracy": row.accuracy, "global/forgetting_F_t": row.global_forgetting,
        "clients/forgetting_F_k": row.client_forgetting, "round/seconds": row.wall_s,
    }
    for node, entry in row.nodes.items():
        values[f"nodes/{node}/accuracy"] = entry.accuracy
        values[f"nodes/{node}/train_loss"] = entry.train_loss
        for name, value in (entry.metrics or {}).items():
            values[f"nodes/{node}/{name}"] = value
    return values
