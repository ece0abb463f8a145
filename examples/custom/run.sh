#!/usr/bin/env bash
# Install this package into the active Python environment, then run everything it offers:
#   1. fl-sim peer.toml   (a CWT ring of 3 peers)
#   2. fl-sim star.toml   (3 nodes and an aggregator using the package's "rfa" strategy)
#   3. make_data.py, then nodes.toml as three fl-node processes on 127.0.0.1, each on its own file,
#      over mTLS with certificates from a throwaway CA (fl-certs)
#   4. embedded.py        (the same pieces as Python objects)
# Exits non-zero when any step fails. Results: $OUT (default examples/custom/runs/).
# Usage: examples/custom/run.sh       (with the venv that has flmesh active, or its bin/ first on PATH)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/runs}
say() { echo "run.sh: $*" >&2; }

# --no-deps: flmesh and torch are already here. The venv's own setuptools builds the package
# when it can make wheels (setuptools >= 70.1, or the wheel package): nothing is downloaded.
# Otherwise pip fetches a build backend from the package index.
isolation=--no-build-isolation
python -c 'import setuptools.command.bdist_wheel' 2>/dev/null || python -c 'import wheel' 2>/dev/null ||
  { isolation=; say "this environment cannot build wheels offline: pip fetches setuptools"; }
python -m pip install --quiet --no-deps $isolation "$here"

say "1. fl-sim peer.toml"
fl-sim "$here/peer.toml" --out "$out/peer" --quiet --no-pictures
say "2. fl-sim star.toml"
fl-sim "$here/star.toml" --out "$out/star" --quiet --no-pictures

say "3. three fl-node processes, each on its own data file"
python "$here/make_data.py" "$here/data"
work=$(mktemp -d)
pids=()
cleanup() { kill -TERM "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ids=$(python -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["nodes"]))' \
  "$here/nodes.toml")
# three processes share this machine's cores: one torch thread each, not one per core each
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fl-certs federation "$here/nodes.toml" --out "$work/pki" >/dev/null  # a CA and a certificate per node
rm -rf "$work/pki/ca-private"  # a throwaway CA: its key is not needed again, and not beside the nodes'
for id in $ids; do
  # each node binds a free port and announces it in its ready file; the peers file gathers them
  fl-node --id "$id" --federation "$here/nodes.toml" --out "$out/nodes-$id" --listen 127.0.0.1:0 \
    --tls-ca "$work/pki/ca.pem" --tls-cert "$work/pki/$id.pem" --tls-key "$work/pki/$id.key" \
    --ready-file "$work/$id.addr" --peers-file "$work/peers.json" --hello-timeout 60 &
  pids+=($!)
done
ready=0
for _ in $(seq 600); do  # up to 60 s
  ready=0
  for id in $ids; do [ -s "$work/$id.addr" ] && ready=$((ready + 1)); done
  [ "$ready" -eq ${#pids[@]} ] && break
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { say "a node process ($pid) exited before it served"; exit 1; }
  done
  sleep 0.1
done
[ "$ready" -eq ${#pids[@]} ] || { say "not every node announced its address within 60 s"; exit 1; }
python - "$work" $ids <<'PY'
import json, os, sys
work, ids = sys.argv[1], sys.argv[2:]
ready = {i: open(os.path.join(work, f"{i}.addr")).read().strip() for i in ids}
with open(os.path.join(work, ".peers.json"), "w") as fh:
    json.dump(ready, fh)
os.replace(os.path.join(work, ".peers.json"), os.path.join(work, "peers.json"))
PY
failed=0
set -- $ids
for pid in "${pids[@]}"; do
  code=0
  wait "$pid" || code=$?
  if [ "$code" -ne 0 ]; then
    say "node $1 (pid $pid) exited with $code"
    failed=1
  fi
  shift
done
pids=()
[ "$failed" -eq 0 ] || exit 1

say "4. embedded.py"
python "$here/embedded.py" "$out/embedded"
say "done: results in $out"
