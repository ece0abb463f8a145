"""Write each node's own data file for nodes.toml: data/wave0.npz .. data/wave2.npz, each
with x, y (training) and x_test, y_test, from the package's generator with a different seed
and label mix per node.

    python examples/custom/make_data.py [OUT_DIR]      (default: examples/custom/data)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from flmesh_custom_example.data import generate

#: each node's class weights (sine, square, sawtooth, chirp): every node sees every class,
#: two of them more often
MIXES = {"wave0": (4, 4, 1, 1), "wave1": (1, 4, 4, 1), "wave2": (1, 1, 4, 4)}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for index, (node, mix) in enumerate(MIXES.items()):
        x, y = generate(240, seed=100 + index, weights=mix)
        x_test, y_test = generate(60, seed=200 + index, weights=mix)
        np.savez(out / f"{node}.npz", x=x, y=y, x_test=x_test, y_test=y_test)
        print(f"{out / node}.npz: {len(y)} training and {len(y_test)} test waveforms")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "data")
