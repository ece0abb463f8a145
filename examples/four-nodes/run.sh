#!/usr/bin/env bash
# Start the four nodes of federation.toml as separate fl-node processes, wait
# for all of them, and exit non-zero if any failed. Results: runs/four-nodes-<id>/.
# Usage: examples/four-nodes/run.sh [federation.toml] [extra fl-node flags...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
file=${1:-$here/federation.toml}
shift || true
fl_node=${FL_NODE:-fl-node}
command -v "$fl_node" >/dev/null || fl_node="$here/../../.venv/bin/fl-node"

ids=$(python3 -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["nodes"]))' "$file")
pids=()
for id in $ids; do
  "$fl_node" --id "$id" --federation "$file" "$@" &
  pids+=($!)
done
# Ctrl-C / SIGTERM here stops every node cleanly.
trap 'kill -TERM "${pids[@]}" 2>/dev/null' INT TERM

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
