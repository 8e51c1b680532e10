#!/usr/bin/env bash
# Builds the flexmig image without a Docker daemon or registry, as an OCI image layout tar:
#   1. wheels: the flexmig wheel and every dependency, `pip wheel` under deployments/constraints.txt
#      (PyPI, every version pinned; the build backend too, through PIP_CONSTRAINT);
#   2. root filesystem: Debian bookworm's essential set + deployments/image/packages.txt, made by
#      mmdebstrap (apt checks every package against the Debian archive keyring), then install.sh runs
#      inside it (venv /opt/flexmig from the wheels only, user 65532, bytecode);
#   3. image: umoci packs it as one layer with the config below (non-root user, entrypoint `flexmig`).
# The Dockerfile runs the same packages.txt and install.sh on debian:bookworm-slim for Docker users.
#
# Usage: build.sh [-o FILE]   writes the tar to FILE (default build/flexmig-image.tar in the repository)
#        build.sh --cache-only  only builds/finds the cached tar
#        build.sh --print-key   prints the cache key (the inputs' hash) and exits
# The last line printed is the tar's path. The image is named IMAGE (default: the chart's default,
# ghcr.io/flexmig/flexmig:<version of pyproject.toml>) in the index's `io.containerd.image.name` and
# `org.opencontainers.image.ref.name` annotations: `ctr -n k8s.io images import`, `docker load`,
# `podman load` and `skopeo copy oci-archive:FILE docker://...` take it as it is.
#
# Environment: IMAGE (name), REVISION (git revision for the label and FLEXMIG_REVISION; default none),
# SOURCE_DATE_EPOCH (file times and `created`; default below), DEBIAN_MIRROR (default
# http://deb.debian.org/debian; e.g. a snapshot.debian.org URL to rebuild the recorded package set),
# PYTHON (a CPython 3.11, the version of bookworm's python3, for `pip wheel`; default python3),
# FLEXMIG_IMAGE_CACHE (default ~/.cache/flexmig/image).
#
# Cached under $FLEXMIG_IMAGE_CACHE/<key>/ where key hashes everything that goes into the image: this
# script, install.sh, packages.txt, constraints.txt, pyproject.toml, README.md, the package sources
# (api driver controller kubeletplugin flexmig) and the settings above. A second build with the same
# inputs is instant; the tar is built in a temporary directory renamed into place when complete.
# Downloaded wheels are kept in $FLEXMIG_IMAGE_CACHE/wheels and Debian packages in
# $FLEXMIG_IMAGE_CACHE/debs, so a rebuild after a source change needs the network only for what is new.
#
# Runs as root (mmdebstrap's root mode: the files get their real owners, which the layer keeps);
# missing tools (mmdebstrap, umoci) are installed with apt-get.
set -euo pipefail

# The whole script is one function: bash reads it completely before running it, so editing this
# file during a build cannot change the running build.
main() {

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/build/flexmig-image.tar"
print_key=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    --cache-only) out=""; shift ;;
    --print-key) print_key=1; shift ;;
    *) echo "build.sh: unknown argument '$1'; usage: build.sh [-o FILE | --cache-only | --print-key]" >&2; exit 2 ;;
  esac
done

log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

SUITE=bookworm
# 2026-01-01T00:00:00Z: a fixed default so that a build of unchanged inputs is the same image.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1767225600}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PYTHON="${PYTHON:-python3}"
REVISION="${REVISION:-}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml")"
[[ -n "$version" ]] || { log "no version in $repo/pyproject.toml"; exit 1; }
# The chart's default image (values.yaml image.repository, tag = appVersion = this version), so a
# chart installed with defaults finds the imported image (tests/unit/test_image_build.py checks it).
IMAGE="${IMAGE:-ghcr.io/flexmig/flexmig:$version}"
SOURCES=(api driver controller kubeletplugin flexmig)
mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$here/packages.txt")

cache_root="${FLEXMIG_IMAGE_CACHE:-$HOME/.cache/flexmig/image}"

# The inputs' hash: file names and contents (bytecode caches excluded), then the settings.
inputs_hash() {
  (
    cd "$repo"
    {
      find deployments/image/build.sh deployments/image/install.sh deployments/image/packages.txt \
        deployments/constraints.txt pyproject.toml README.md "${SOURCES[@]}" \
        -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
      printf '%s\n' "$IMAGE" "$REVISION" "$SOURCE_DATE_EPOCH" "$DEBIAN_MIRROR" "$SUITE"
    } | sha256sum | cut -c1-16
  )
}
key="$(inputs_hash)"
if [[ -n "$print_key" ]]; then echo "$key"; exit 0; fi
final="$cache_root/$key"
tar_name=flexmig-image.tar

publish() {
  if [[ -n "$out" ]]; then
    mkdir -p "$(dirname "$out")"
    cp "$final/$tar_name" "$out.tmp.$$" && mv -f "$out.tmp.$$" "$out"
    cp "$final/packages.txt" "${out%.tar}.packages.txt"
    log "image $IMAGE: $out ($(du -h "$out" | cut -f1)); Debian packages: ${out%.tar}.packages.txt"
    echo "$out"
  else
    echo "$final/$tar_name"
  fi
}

if [[ -f "$final/$tar_name" ]]; then
  log "cached: $final/$tar_name ($IMAGE)"
  publish
  exit 0
fi

[[ "$(id -u)" == 0 ]] || { log "run as root (e.g. sudo make image): mmdebstrap's root mode"; exit 1; }

# --- tools ----------------------------------------------------------------------------------------
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
if [[ ${#missing[@]} -gt 0 ]]; then
  if command -v apt-get >/dev/null; then
    log "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  else
    log "need ${missing[*]}: apt-get install mmdebstrap umoci (Debian >= 12, Ubuntu >= 22.04)"; exit 1
  fi
fi
py_version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$py_version" == 3.11 ]] \
  || { log "$PYTHON is Python $py_version; the wheels must be for 3.11, bookworm's python3: set PYTHON"; exit 1; }

mkdir -p "$cache_root/wheels" "$cache_root/debs"
work="$(mktemp -d "$cache_root/.build-$key.XXXXXX")"
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
start=$SECONDS
log "building $IMAGE (inputs $key; SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH) in $work"

# --- 1. wheels ------------------------------------------------------------------------------------
# Built from a copy of exactly the hashed sources, so the repository's tree is never written to.
mkdir -p "$work/src" "$work/wheels"
(cd "$repo" && cp -r pyproject.toml README.md "${SOURCES[@]}" "$work/src/")
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
PIP_CONSTRAINT="$repo/deployments/constraints.txt" PIP_FIND_LINKS="$cache_root/wheels" \
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$PYTHON" -m pip wheel --quiet --wheel-dir "$work/wheels" \
  --only-binary=:all: --no-binary=flexmig "$work/src" >&2
# Keep the dependencies' wheels for the next build (the flexmig wheel changes with every source edit).
find "$work/wheels" -name '*.whl' ! -name 'flexmig-*' -exec cp -n {} "$cache_root/wheels/" \;
log "wheels: $(ls "$work/wheels" | wc -l) in $((SECONDS - start))s"

# --- 2. root filesystem ---------------------------------------------------------------------------
t=$SECONDS
includes="$(IFS=,; echo "${packages[*]}")"
# Debian's docs, man pages, locales and info are left out (their copyright files stay, for the
# licences); apt's download cache is shared between builds through the sync-in/out hooks.
mmdebstrap --quiet --mode=root --variant=essential --include="$includes" \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --skip=essential/unlink \
  --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
  --setup-hook="sync-in '$cache_root/debs' /var/cache/apt/archives/" \
  --customize-hook="sync-out /var/cache/apt/archives '$cache_root/debs'" \
  --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
  --customize-hook='mkdir -p "$1/tmp/flexmig-install"' \
  --customize-hook="copy-in '$work/wheels' '$here/install.sh' /tmp/flexmig-install" \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin sh /tmp/flexmig-install/install.sh /tmp/flexmig-install/wheels' \
  --customize-hook='rm -rf "$1/tmp/flexmig-install"' \
  --customize-hook='mkdir -p "$1/usr/lib/flexmig-image"' \
  --customize-hook='chroot "$1" dpkg-query -W -f "\${Package} \${Version} \${Architecture}\n" > "$1/usr/lib/flexmig-image/packages.txt"' \
  "$SUITE" "$work/rootfs" "$DEBIAN_MIRROR" >&2
cp "$work/rootfs/usr/lib/flexmig-image/packages.txt" "$work/packages.txt"
# apt is not in the image; its directories are mmdebstrap's leftovers, owned by _apt or root depending
# on whether the packages came from the cache.
rm -rf "$work/rootfs/var/cache/apt" "$work/rootfs/var/lib/apt"
# What the build wrote (venv, dpkg's database, /etc) gets a fixed time, after mmdebstrap's own cleanup.
find "$work/rootfs" -xdev -newermt "@$SOURCE_DATE_EPOCH" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
log "root filesystem: $(du -sh "$work/rootfs" | cut -f1) in $((SECONDS - t))s"

# --- 3. OCI image ---------------------------------------------------------------------------------
t=$SECONDS
tag="${IMAGE##*:}"
[[ "$IMAGE" == *:* && "$tag" != */* ]] || { log "IMAGE=$IMAGE has no tag"; exit 1; }
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
# One layer, written by tar in a fixed order with fixed owners' ids and no access/change times, so
# equal inputs give an equal layer. /dev stays empty: the runtime mounts its own.
(cd "$work/rootfs" && LC_ALL=C ls -A | grep -vx dev) > "$work/top"
tar --sort=name --numeric-owner --format=pax --pax-option=delete=atime,delete=ctime \
  -C "$work/rootfs" -cf "$work/layer.tar" --no-recursion dev --recursion -T "$work/top"
umoci raw add-layer --image "$layout:$tag" --history.created "$created" \
  --history.created_by "deployments/image/build.sh" "$work/layer.tar"
rm -f "$work/layer.tar"
labels=(
  "org.opencontainers.image.title=flexmig"
  "org.opencontainers.image.description=Kubernetes DRA driver gpu.flexmig.dev: NVIDIA MIG instances on demand (controller, webhook, kubelet plugin)"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.created=$created"
  "org.opencontainers.image.source=https://github.com/flexmig/flexmig"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.base.name=debian:$SUITE (mmdebstrap --variant=essential)"
)
env=(
  "PATH=/opt/flexmig/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  # Nothing may be written to the read-only root filesystem; the bytecode is built in.
  "PYTHONDONTWRITEBYTECODE=1"
  "PYTHONUNBUFFERED=1"
)
if [[ -n "$REVISION" ]]; then
  labels+=("org.opencontainers.image.revision=$REVISION")
  env+=("FLEXMIG_REVISION=$REVISION")
fi
config=(--config.user 65532:65532 --config.entrypoint flexmig --config.cmd --help --config.workingdir /)
for l in "${labels[@]}"; do config+=(--config.label "$l"); done
for e in "${env[@]}"; do config+=(--config.env "$e"); done
umoci config --image "$layout:$tag" --created "$created" --os linux \
  --architecture "$(dpkg --print-architecture)" --author "flexmig" "${config[@]}" \
  --history.created "$created" --history.created_by "deployments/image/build.sh (config)"
umoci gc --layout "$layout"
# The full name for containerd (`ctr images import` names the image after this annotation).
"$PYTHON" - "$layout/index.json" "$IMAGE" <<'EOF'
import json, sys
path, name = sys.argv[1], sys.argv[2]
index = json.load(open(path))
[manifest] = index["manifests"]
manifest.setdefault("annotations", {})["io.containerd.image.name"] = name
json.dump(index, open(path, "w"), sort_keys=True)
EOF
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$layout" -cf "$work/$tar_name" oci-layout index.json blobs
printf '%s\n' "$IMAGE" > "$work/name"
rm -rf "$work/rootfs" "$work/oci" "$work/src" "$work/wheels"
log "OCI image: $(du -h "$work/$tar_name" | cut -f1) in $((SECONDS - t))s"

# Atomic publish: another concurrent build may have won the race; then keep theirs.
if ! mv -T "$work" "$final" 2>/dev/null; then
  [[ -f "$final/$tar_name" ]] || { rm -rf "$final"; mv -T "$work" "$final"; }
fi
trap - EXIT
rm -rf "$work"
log "built $IMAGE in $((SECONDS - start))s"
publish
}

main "$@"
