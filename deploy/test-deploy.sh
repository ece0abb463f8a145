#!/usr/bin/env bash
# make test-deploy: the image and a real multi-container federation, with rootful podman.
#
#   1. installs what is missing from Debian's archive (podman, podman-compose, runc, netavark,
#      aardvark-dns, iptables, debootstrap), as ../shared/tools/container-smoke.sh does;
#   2. builds localhost/flmesh:latest offline from a wheelhouse made here (deploy/build-image.sh);
#   3. runs tests/test_deploy_podman.py (pytest -m deploy): 4 nodes, CWT with rewind, mTLS, under
#      podman-compose with results on the mounted volumes; one container killed mid-run that
#      resumes from its checkpoint; the Kubernetes pods' scripts run the way a kubelet would.
#
# Needs root (rootful podman; debootstrap for the local base image). Exits non-zero on any failure
# and removes every container and network the tests made, also when interrupted.
# Settings: FLMESH_PODMAN_DIR, IMAGE, BASE (see deploy/build-image.sh); PYTEST_ARGS (extra flags).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo"
say() { echo "test-deploy: $*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (rootful podman; debootstrap makes the base image)"
start=$(date +%s)

# 1. tools ---------------------------------------------------------------------------------------------
need=()
for tool in podman:podman podman-compose:podman-compose runc:runc conmon:conmon \
            netavark:/usr/lib/podman/netavark aardvark-dns:/usr/lib/podman/aardvark-dns \
            iptables:iptables debootstrap:debootstrap; do
  pkg=${tool%%:*} cmd=${tool#*:}
  if [[ $cmd == /* ]]; then [ -x "$cmd" ] || need+=("$pkg")
  else command -v "$cmd" >/dev/null || need+=("$pkg"); fi
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]} (apt)"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. the project's environment (a clean clone has none) ---------------------------------------------
if ! .venv/bin/python -c 'import flmesh.cli.fl_deploy, pytest' 2>/dev/null; then
  say "making .venv"
  make .venv/.installed >/dev/null
fi

# 3. the image -------------------------------------------------------------------------------------------
bash deploy/build-image.sh
eval "$(bash deploy/build-image.sh --env)"
export FLMESH_IMAGE=${IMAGE:-localhost/flmesh:latest}

# 4. the tests; whatever they leave behind (an interrupted run) is removed at exit -----------------------
# Every container and network of a test is named with this prefix.
export FLMESH_DEPLOY_PREFIX="fldt$$"
cleanup() {
  local names
  names=$(podman ps -a --format '{{.Names}}' 2>/dev/null | grep "^$FLMESH_DEPLOY_PREFIX" || true)
  [ -z "$names" ] || podman rm -f -t 0 $names >/dev/null 2>&1 || true
  names=$(podman network ls --format '{{.Name}}' 2>/dev/null | grep "^$FLMESH_DEPLOY_PREFIX" || true)
  [ -z "$names" ] || podman network rm -f $names >/dev/null 2>&1 || true
}
trap cleanup EXIT

say "running the container tests (image $FLMESH_IMAGE)"
status=0
# FLMESH_DEPLOY_REQUIRED: a test that cannot run here fails instead of skipping. pytest runs in the
# background so that an interrupt (INT, TERM) is handled at once: pytest is stopped, then cleanup.
# shellcheck disable=SC2086
FLMESH_DEPLOY_REQUIRED=1 .venv/bin/python -m pytest -q -p no:cacheprovider -m deploy ${PYTEST_ARGS:-} \
  tests/test_deploy_podman.py &
tests=$!
trap 'say "interrupted"; kill -TERM "$tests" 2>/dev/null; wait "$tests" 2>/dev/null; exit 130' INT TERM
wait "$tests" || status=$?
trap - INT TERM
say "$([ "$status" -eq 0 ] && echo passed || echo "FAILED (exit $status)") in $(($(date +%s) - start)) s"
exit "$status"
