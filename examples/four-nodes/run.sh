#!/usr/bin/env bash
# Start the nodes of federation.toml as separate fl-node processes on 127.0.0.1,
# wait for all of them, and exit non-zero if any failed. Results: runs/four-nodes-<id>/.
#
# Each node binds a free port (--listen 127.0.0.1:0) and announces it in a ready
# file; once all have, this script writes their addresses into one peers file,
# which the nodes read while they wait for each other. (On separate machines, use
# the addresses in federation.toml, or --listen / --peer, instead.)
# Every call is mTLS: fl-certs makes a throwaway CA and one certificate per node
# for the run (deleted with it). Pass --insecure to run in plaintext instead.
# Usage: examples/four-nodes/run.sh [federation.toml] [extra fl-node flags...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
file=${1:-$here/federation.toml}
shift || true
fl_node=${FL_NODE:-fl-node}
command -v "$fl_node" >/dev/null || fl_node="$here/../../.venv/bin/fl-node"
fl_certs=$(dirname "$(command -v "$fl_node" || echo "$fl_node")")/fl-certs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

insecure=0
for flag in "$@"; do [ "$flag" = "--insecure" ] && insecure=1; done
if [ "$insecure" -eq 0 ]; then
  "$fl_certs" federation "$file" --out "$work/pki" >/dev/null || exit 1
  rm -rf "$work/pki/ca-private"  # a throwaway CA: its key is not needed again, and not beside the nodes'
fi

ids=$(python3 -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["nodes"]))' "$file")
# The nodes share this machine's cores: torch's default (a thread per core in every process)
# would have them spin-wait against each other between operators.
count=$(echo $ids | wc -w)
threads=$(( $(nproc) / count )); [ "$threads" -ge 1 ] || threads=1
pids=()
for id in $ids; do
  tls=()
  [ "$insecure" -eq 0 ] && tls=(--tls-ca "$work/pki/ca.pem" --tls-cert "$work/pki/$id.pem" --tls-key "$work/pki/$id.key")
  "$fl_node" --id "$id" --federation "$file" --listen 127.0.0.1:0 --threads "$threads" "${tls[@]}" \
    --ready-file "$work/$id.addr" --peers-file "$work/peers.json" "$@" &
  pids+=($!)
done
# Ctrl-C / SIGTERM here stops every node cleanly.
trap 'kill -TERM "${pids[@]}" 2>/dev/null; rm -rf "$work"' INT TERM

# Collect the announced addresses; a node that exits first ends the wait at once.
ready=0
for _ in $(seq 1200); do  # up to 120 s
  ready=0
  for id in $ids; do [ -s "$work/$id.addr" ] && ready=$((ready + 1)); done
  [ "$ready" -eq ${#pids[@]} ] && break
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "run.sh: a node (pid $pid) exited before it listened" >&2; break 2; }
  done
  sleep 0.1  # a poll interval
done
if [ "$ready" -eq ${#pids[@]} ]; then
  python3 - "$work" $ids <<'PY'
import json, os, sys
work, ids = sys.argv[1], sys.argv[2:]
ready = {i: open(os.path.join(work, f"{i}.addr")).read().strip() for i in ids}
with open(os.path.join(work, ".peers.json"), "w") as fh:
    json.dump(ready, fh)
os.replace(os.path.join(work, ".peers.json"), os.path.join(work, "peers.json"))
PY
else
  echo "run.sh: $ready of ${#pids[@]} nodes announced an address; stopping the others" >&2
  kill -TERM "${pids[@]}" 2>/dev/null  # they would wait for a peer that will not come
fi

failed=0
set -- $ids
for pid in "${pids[@]}"; do
  wait "$pid"
  code=$?
  if [ "$code" -ne 0 ]; then
    echo "run.sh: node $1 (pid $pid) exited with $code" >&2
    failed=1
  fi
  shift
done
exit $failed
