#!/usr/bin/env bash
# Build the flmesh container image (default localhost/flmesh:latest) with podman, offline:
# a wheelhouse is made on this host first (pip), and the image build installs only from it.
#
#   deploy/build-image.sh              # build (idempotent; a warm rebuild takes seconds)
#   deploy/build-image.sh --env        # print the exports that point podman at the same storage
#   eval "$(deploy/build-image.sh --env)"; podman images
#
# Settings (environment):
#   IMAGE=localhost/flmesh:latest     the tag to build
#   BASE=localhost/local/flmesh-base  the base image. The default is made here from Debian's archive
#                                     (debootstrap bookworm + python3-venv, no registry needed; root);
#                                     BASE=python:3.12-slim pulls the standard one from a registry.
#   EXTRAS=                           flmesh extras to install, e.g. "vision" (torchvision)
#   TORCH_WHEELS=/opt/wheels          a folder searched for a CPU torch wheel for the base's Python
#                                     (and a CPU torchvision with EXTRAS=vision); TORCH_WHEELS= skips it
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu
#                                     where the CPU torch (and torchvision) come from when no such wheel
#                                     is found; TORCH_INDEX= takes torch from PyPI (a CUDA build: large)
#   FLMESH_PODMAN_DIR=/var/tmp/flmesh-podman
#                                     podman's storage and configuration for flmesh (see below)
#   PYTHON=.venv/bin/python           the Python (>= 3.11, with pip) that makes the wheelhouse
#
# podman runs with a private configuration under FLMESH_PODMAN_DIR: storage there, the runc runtime
# and explicit ulimits (what the development machines need: /work/shared/containers.md). Tools that
# use the image (compose, the deploy tests) take the same settings from `--env`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
W=${FLMESH_PODMAN_DIR:-/var/tmp/flmesh-podman}
IMAGE=${IMAGE:-localhost/flmesh:latest}
LOCAL_BASE=localhost/local/flmesh-base
BASE=${BASE:-$LOCAL_BASE}
EXTRAS=${EXTRAS:-}
TORCH_WHEELS=${TORCH_WHEELS-/opt/wheels}
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
PYTHON=${PYTHON:-$repo/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3

say() { echo "build-image: $*" >&2; }
die() { say "error: $*"; exit 1; }

env_lines() {
  echo "export CONTAINERS_STORAGE_CONF=$W/storage.conf"
  echo "export CONTAINERS_CONF=$W/containers.conf"
}

# Write a file only when its content changes (keeps mtimes, and so caches, stable).
put() { local f=$1 tmp; tmp=$(mktemp); cat >"$tmp"; if cmp -s "$tmp" "$f"; then rm -f "$tmp"; else mv "$tmp" "$f"; fi; }

configure_podman() {
  mkdir -p "$W/networks"
  put "$W/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$W/storage"
runroot = "$W/run"
EOF
  # No CAP_SYS_RESOURCE here, and podman caps its own NPROC: explicit ulimits. The cgroup layout is
  # hybrid v1/v2, which crun refuses: runc.
  put "$W/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=32768:32768"]
[network]
network_config_dir = "$W/networks"
[engine]
runtime = "runc"
EOF
  export CONTAINERS_STORAGE_CONF=$W/storage.conf CONTAINERS_CONF=$W/containers.conf
}

case "${1:-}" in
  --env) configure_podman; env_lines; exit 0 ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "unknown argument '$1' (try --help)" ;;
esac

command -v podman >/dev/null || die "podman is not installed (deploy/test-deploy.sh installs it from Debian's archive)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (set PYTHON=...)"
mkdir -p "$W"
configure_podman
start=$(date +%s)

# 1. the base image -------------------------------------------------------------------------------
if [ "$BASE" = "$LOCAL_BASE" ] && ! podman image exists "$LOCAL_BASE"; then
  [ "$(id -u)" = 0 ] || die "making $LOCAL_BASE needs root (debootstrap); or set BASE=python:3.12-slim"
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  say "making $LOCAL_BASE: debootstrap bookworm + python3-venv (a few minutes, once)"
  rootfs=$W/base-rootfs
  if [ ! -x "$rootfs/usr/bin/python3" ]; then
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3-venv bookworm "$rootfs" http://deb.debian.org/debian \
      >"$W/debootstrap.log" 2>&1 || die "debootstrap failed; see $W/debootstrap.log"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
  tar -C "$rootfs" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
fi

# 2. what the image needs: the base's Python, C library and architecture ------------------------------
read -r pyver glibc arch < <(podman run --rm --pull=missing --network=none --entrypoint python3 "$BASE" -c \
  'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.libc_ver()[1], platform.machine())') \
  || die "cannot run python3 in $BASE"
[ -n "$glibc" ] || die "$BASE: not a glibc system (manylinux wheels need glibc)"
cp="cp${pyver/./}"
platforms=()
for minor in $(seq "${glibc#2.}" -1 5); do platforms+=(--platform "manylinux_2_${minor}_${arch}"); done
platforms+=(--platform "manylinux2014_${arch}" --platform "manylinux2010_${arch}" --platform "manylinux1_${arch}")
target=(--only-binary=:all: --implementation cp --python-version "$pyver" --abi "$cp" "${platforms[@]}")

ctx=$W/context
deps=$ctx/wheelhouse/deps
app=$ctx/wheelhouse/app
mkdir -p "$deps" "$app"
cp "$here/Containerfile" "$ctx/Containerfile.new"
if cmp -s "$ctx/Containerfile.new" "$ctx/Containerfile"; then rm "$ctx/Containerfile.new"
else mv "$ctx/Containerfile.new" "$ctx/Containerfile"; fi

# 3. the dependencies' wheels (skipped when nothing they depend on changed) ---------------------------
reqs=$(mktemp -d)
trap 'rm -rf "$reqs"' EXIT
"$PYTHON" - "$repo/pyproject.toml" "$reqs" <<'PY'
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path(sys.argv[1]).read_text())["project"]
out = pathlib.Path(sys.argv[2])
(out / "requirements.txt").write_text("\n".join(project["dependencies"]) + "\n")
for extra, reqs in project.get("optional-dependencies", {}).items():
    if extra != "dev":
        (out / f"extra-{extra}.txt").write_text("\n".join(reqs) + "\n")
PY
extra_reqs=()
for extra in ${EXTRAS//,/ }; do
  [ -f "$reqs/extra-$extra.txt" ] || die "EXTRAS=$EXTRAS: flmesh has no extra '$extra'"
  extra_reqs+=(-r "$reqs/extra-$extra.txt")
done
torch_wheel=""
[ -z "$TORCH_WHEELS" ] ||
  torch_wheel=$(ls "$TORCH_WHEELS"/torch-*+cpu-"$cp-$cp"-*"_$arch.whl" 2>/dev/null | sort -V | tail -n 1 || true)
vision_wheel=""
case ",$EXTRAS," in *,vision,*)
  if [ -n "$torch_wheel" ]; then
    # PyPI's torchvision is built against PyPI's (CUDA) torch and does not load with a CPU torch:
    # a CPU torchvision wheel must sit beside the CPU torch wheel.
    vision_wheel=$(ls "$TORCH_WHEELS"/torchvision-*+cpu-"$cp-$cp"-*"_$arch.whl" 2>/dev/null | sort -V | tail -n 1 \
      || true)
    [ -n "$vision_wheel" ] || die "EXTRAS=vision: $TORCH_WHEELS has a CPU torch but no CPU torchvision wheel" \
      "for $cp (add the one built for $(basename "$torch_wheel"), or set TORCH_WHEELS= to take both from" \
      "TORCH_INDEX)"
  fi ;;
esac
key=$(cat "$reqs"/*.txt | sha256sum | cut -c1-16)
key="wheelhouse-1 $key $BASE $pyver $glibc $arch extras=$EXTRAS torch=${torch_wheel:-index:$TORCH_INDEX}"
[ -z "$vision_wheel" ] || key="$key vision=$vision_wheel"
if [ "$(cat "$ctx/deps.key" 2>/dev/null)" != "$key" ]; then
  say "making the wheelhouse for Python $pyver ($arch, glibc $glibc) in $deps"
  rm -f "$ctx/deps.key"
  rm -rf "$deps" && mkdir -p "$deps"
  pins=$reqs/pins.txt
  : >"$pins"
  direct=()
  if [ -n "$torch_wheel" ]; then
    say "torch: $torch_wheel"
    version=$(basename "$torch_wheel" | cut -d- -f2)
    echo "torch==$version" >>"$pins"
    direct+=("$torch_wheel")
    if [ -n "$vision_wheel" ]; then
      say "torchvision: $vision_wheel"
      echo "torchvision==$(basename "$vision_wheel" | cut -d- -f2)" >>"$pins"
      direct+=("$vision_wheel")
    fi
  elif [ -n "$TORCH_INDEX" ]; then
    cpu=(torch)
    case ",$EXTRAS," in *,vision,*) cpu+=(torchvision) ;; esac
    say "torch: the CPU build of ${cpu[*]} from $TORCH_INDEX"
    "$PYTHON" -m pip download --quiet --no-deps --dest "$deps" --index-url "$TORCH_INDEX" "${target[@]}" \
      "${cpu[@]}" || die "cannot download ${cpu[*]} from $TORCH_INDEX (TORCH_INDEX= takes torch from PyPI)"
    for w in "$deps"/*.whl; do
      n=$(basename "$w"); echo "$(cut -d- -f1 <<<"$n")==$(cut -d- -f2 <<<"$n")" >>"$pins"
    done
  else
    say "torch: from PyPI (TORCH_INDEX is empty): a CUDA build on Linux x86_64, several GiB"
  fi
  cp "$reqs/requirements.txt" "$reqs"/extra-*.txt "$deps/"
  "$PYTHON" -m pip download --quiet --dest "$deps" "${target[@]}" -c "$pins" \
    -r "$reqs/requirements.txt" "${extra_reqs[@]}" "${direct[@]}" 2> >(grep -v "is ignored: it is neither" >&2) \
    || die "pip could not make the wheelhouse (see above)"
  echo "$key" >"$ctx/deps.key"
else
  say "wheelhouse up to date ($deps)"
fi

# 4. the flmesh wheel, from a copy of the sources (nothing is written into the checkout) -------------
src=$reqs/src
mkdir -p "$src" "$reqs/out"
cp "$repo/pyproject.toml" "$repo/README.md" "$src/"
cp "$repo"/LICENSE* "$src/" 2>/dev/null || true
(cd "$repo" && find src protos -name __pycache__ -prune -o -type f \
  \( -name '*.py' -o -name '*.pyi' -o -name '*.proto' -o -name 'py.typed' \) -print0 \
  | tar --null -T - -cf -) | tar -C "$src" -xf -
isolation=(--no-build-isolation)
"$PYTHON" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 69)' 2>/dev/null \
  || isolation=()
# A fixed SOURCE_DATE_EPOCH makes the wheel byte-identical for identical sources: the image's
# layers then stay cached.
SOURCE_DATE_EPOCH=315532800 "$PYTHON" -m pip wheel --quiet --no-deps "${isolation[@]}" --wheel-dir "$reqs/out" "$src" \
  >/dev/null || die "cannot build the flmesh wheel"
wheel=$(ls "$reqs"/out/flmesh-*.whl)
if ! cmp -s "$wheel" "$app/$(basename "$wheel")"; then
  rm -f "$app"/*.whl
  cp "$wheel" "$app/"
fi

# 5. the image -------------------------------------------------------------------------------------
say "building $IMAGE from $BASE (extras: ${EXTRAS:-none})"
previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
if ! podman build --format docker --network=none --build-arg "BASE=$BASE" --build-arg "EXTRAS=$EXTRAS" \
    -t "$IMAGE" -f "$ctx/Containerfile" "$ctx" >"$W/build.log" 2>&1; then
  tail -n 30 "$W/build.log" >&2
  die "podman build failed; the whole log is $W/build.log"
fi
# The image this build replaced (now untagged) goes, unless a container still uses it; the build
# cache stays.
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE ($((size / 1024 / 1024)) MiB) in $(($(date +%s) - start)) s"
