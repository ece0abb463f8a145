"""make bench's transport benchmark runs its four ways and writes their figures as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

WAYS = ("mtls", "tls", "plain", "tcp")


@pytest.mark.slow
def test_quick_run_measures_four_ways_and_writes_their_figures(tmp_path):
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "transport.py"), "--quick", "--repeats",
                           "3", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["command"][-4:] == ["--repeats", "3", "--json", str(out)]
    assert record["repeats"] == 3 and record["model"]["name"] == "synthetic"
    assert record["model"]["bytes"] == 4 * 2**20 and record["chunk_bytes"] == 2**20
    assert {"cpu", "cpus", "python", "grpcio", "openssl", "torch"} <= set(record["host"])
    assert len(record["loadavg_before"]) == len(record["loadavg_after"]) == 3
    assert record["raw_tls"]["version"].startswith("TLS")
    assert set(record["ways"]) == set(WAYS)
    for name in WAYS:
        way = record["ways"][name]
        assert len(way["mib_s"]) == 3 and all(v > 0 for v in way["mib_s"])
        assert way["min"] <= way["median"] <= way["max"]
        assert f"\n{name:6s} {way['median']:8.1f} " in proc.stdout
    for label, (a, b) in {"mtls/tls": ("mtls", "tls"), "plain/tcp": ("plain", "tcp")}.items():
        ratio = record["ratios"][label]
        speeds = record["ways"]
        per_round = [x / y for x, y in zip(speeds[a]["mib_s"], speeds[b]["mib_s"], strict=True)]
        assert ratio["per_round"] == pytest.approx(per_round, rel=0.01)
        assert ratio["min"] <= ratio["of_medians"] * 1.01 and ratio["of_medians"] <= ratio["max"] * 1.01
        assert f"ratio {label}: {ratio['of_medians']:.2f} " in proc.stdout


def test_a_bad_argument_is_one_line_and_a_failure():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "transport.py"), "--repeats", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--repeats and --chunk-kib must be positive" in proc.stderr
