#!/usr/bin/env bash
# Builds the node parts the real-node e2e tests run, from their Go modules (no prebuilt downloads):
#   kubelet                     k8s.io/kubernetes (K8S_VERSION in ../versions.env; the control plane's
#                               module, ../kubernetes/go.mod, built from a copy with -mod=mod)
#   containerd, ctr,            github.com/containerd/containerd/v2 (containerd/go.mod here)
#   containerd-shim-runc-v2
#   runc                        github.com/opencontainers/runc with seccomp (runc/go.mod here): without
#                               seccomp every pod sandbox fails ("config provided but seccomp not
#                               supported"). Needs cgo and libseccomp-dev + pkg-config; when they are
#                               missing and we are root, they are installed with apt-get.
#   cdivalidate                 our CDI validator (cdivalidate/main.go) on the CDI reference library
#   busybox                     copied from Debian's busybox-static (installed with apt-get when missing):
#                               the only program in the test images (tests/e2e/realnode/images.py)
#   crictl                      sigs.k8s.io/cri-tools (crictl/go.mod here), for debugging a real-node
#                               test; cached in its OWN directory (below), so adding or changing it
#                               never invalidates the cache of the set above
#   the "net" set               the pod network of the chart's real-node test: the CNI plugins bridge,
#                               host-local, loopback (github.com/containernetworking/plugins, cni/go.mod
#                               here) and kube-proxy (k8s.io/kubernetes, the kubelet's module); cached in
#                               its OWN directory too, so the set above stays valid
#
# Usage: build.sh           the set above, then crictl, then the net set; the last line printed is the
#                           main bin directory. A failed crictl or net build is logged (stderr) but does
#                           not fail this mode: the main set stays usable, and `build.sh net` (which the
#                           chart test runs) reports the error again.
#        build.sh crictl    only crictl; the last line printed is the path of the crictl binary.
#        build.sh net       only the net set; the last line printed is its bin directory.
#
# Cached beside the control plane, under its own key so the control-plane cache stays valid:
#   ${FLEXMIG_K8S_CACHE:-$HOME/.cache/flexmig/k8s}/node-<versions>-<hash of our validator>/bin/
# Built into a temporary directory renamed into place only when everything is built, so a second run is
# instant and an interrupted run leaves no half-filled cache. crictl is cached the same way under
#   ${FLEXMIG_K8S_CACHE:-$HOME/.cache/flexmig/k8s}/crictl-<version>-<hash of crictl/go.mod+go.sum>/bin/crictl
# and the net set under
#   ${FLEXMIG_K8S_CACHE:-$HOME/.cache/flexmig/k8s}/net-<k8s>-cni-<version>-<hash of the two go.mod+go.sum>/bin/
set -euo pipefail
mode="${1:-all}"
case "$mode" in
  all | crictl | net) ;;
  *) echo "build.sh: unknown mode '$mode'; allowed: (none), crictl or net" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../versions.env
source "$here/../versions.env"
# shellcheck source=versions.env
source "$here/versions.env"
if [[ -n "${E2E_GOTOOLCHAIN:-}" ]]; then export GOTOOLCHAIN="$E2E_GOTOOLCHAIN"; fi

cache_root="${FLEXMIG_K8S_CACHE:-$HOME/.cache/flexmig/k8s}"
# Our own Go code is part of the key: a changed validator is rebuilt.
src_hash="$(cat "$here/cdivalidate/main.go" "$here/cdivalidate/go.mod" "$here/cdivalidate/go.sum" | sha256sum | cut -c1-12)"
key="node-${K8S_VERSION}-containerd-${CONTAINERD_VERSION}-runc-${RUNC_VERSION}-cdi-${CDI_LIB_VERSION}-${src_hash}"
final="$cache_root/$key"
binaries=(kubelet containerd ctr containerd-shim-runc-v2 runc cdivalidate busybox)

log() { printf '[nodebuild %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Tolerant of a missing crictl/ so that the main set still builds; build_crictl then reports it.
crictl_hash="$(cat "$here/crictl/go.mod" "$here/crictl/go.sum" 2>/dev/null | sha256sum | cut -c1-12)"
crictl_final="$cache_root/crictl-${CRICTL_VERSION}-${crictl_hash}"

# Builds crictl into its own cache directory (temp dir renamed into place); prints nothing on stdout.
build_crictl() {
  if [[ -x "$crictl_final/bin/crictl" ]]; then log "cached: $crictl_final/bin/crictl"; return 0; fi
  command -v go >/dev/null || { log "go toolchain not found in PATH"; return 1; }
  [[ -f "$here/crictl/go.mod" && -f "$here/crictl/go.sum" ]] \
    || { log "$here/crictl/go.mod or go.sum is missing; run gen-gomod.sh crictl"; return 1; }
  grep -Eq "^[[:space:]]*sigs\.k8s\.io/cri-tools ${CRICTL_VERSION//./\\.}( |$)" "$here/crictl/go.mod" \
    || { log "$here/crictl/go.mod does not pin sigs.k8s.io/cri-tools $CRICTL_VERSION; run gen-gomod.sh crictl"; return 1; }
  mkdir -p "$cache_root"
  local start=$SECONDS
  # Global (not local) so the EXIT trap still sees it when the script is interrupted.
  cw="$(mktemp -d "$cache_root/.build-crictl-${CRICTL_VERSION}.XXXXXX")"
  trap 'rm -rf "$cw"' EXIT
  chmod 755 "$cw"
  mkdir -p "$cw/bin" "$cw/src"
  cp "$here/crictl/go.mod" "$here/crictl/go.sum" "$cw/src/"
  log "building crictl (sigs.k8s.io/cri-tools $CRICTL_VERSION) ..."
  if ! (cd "$cw/src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRICTL_VERSION}" \
    -o "$cw/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl >&2); then
    rm -rf "$cw"; trap - EXIT; log "building crictl failed"; return 1
  fi
  rm -rf "$cw/src"
  # Atomic publish; a concurrent build that won the race is kept.
  if ! mv -T "$cw" "$crictl_final" 2>/dev/null; then
    if [[ -x "$crictl_final/bin/crictl" ]]; then rm -rf "$cw"; else
      rm -rf "$crictl_final.stale.$$"; mv -T "$crictl_final" "$crictl_final.stale.$$" \
        && mv -T "$cw" "$crictl_final" && rm -rf "$crictl_final.stale.$$"
    fi
  fi
  trap - EXIT
  log "built crictl in $((SECONDS - start))s: $crictl_final/bin/crictl"
}

net_hash="$(cat "$here/cni/go.mod" "$here/cni/go.sum" "$here/../kubernetes/go.mod" "$here/../kubernetes/go.sum" \
  2>/dev/null | sha256sum | cut -c1-12)"
net_final="$cache_root/net-${K8S_VERSION}-cni-${CNI_PLUGINS_VERSION}-${net_hash}"
net_binaries=(bridge host-local loopback kube-proxy)

net_complete() {
  local b
  for b in "${net_binaries[@]}"; do [[ -x "$net_final/bin/$b" ]] || return 1; done
}

# Builds the net set into its own cache directory (temp dir renamed into place); nothing on stdout.
build_net() {
  if net_complete; then log "cached: $net_final/bin"; return 0; fi
  command -v go >/dev/null || { log "go toolchain not found in PATH"; return 1; }
  [[ -f "$here/cni/go.mod" && -f "$here/cni/go.sum" ]] \
    || { log "$here/cni/go.mod or go.sum is missing; run gen-gomod.sh cni"; return 1; }
  grep -Eq "^[[:space:]]*github\.com/containernetworking/plugins ${CNI_PLUGINS_VERSION//./\\.}( |$)" "$here/cni/go.mod" \
    || { log "$here/cni/go.mod does not pin the CNI plugins $CNI_PLUGINS_VERSION; run gen-gomod.sh cni"; return 1; }
  mkdir -p "$cache_root"
  local start=$SECONDS p name
  nw="$(mktemp -d "$cache_root/.build-net-${CNI_PLUGINS_VERSION}.XXXXXX")"  # global: the EXIT trap sees it
  trap 'rm -rf "$nw"' EXIT
  chmod 755 "$nw"
  mkdir -p "$nw/bin" "$nw/cni" "$nw/k8s"
  cp "$here/cni/go.mod" "$here/cni/go.sum" "$nw/cni/"
  cp "$here/../kubernetes/go.mod" "$here/../kubernetes/go.sum" "$nw/k8s/"
  log "building the CNI plugins $CNI_PLUGINS_VERSION and kube-proxy $K8S_VERSION ..."
  for p in main/bridge ipam/host-local main/loopback; do
    name="$(basename "$p")"
    if ! (cd "$nw/cni" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
      -o "$nw/bin/$name" "github.com/containernetworking/plugins/plugins/$p" >&2); then
      rm -rf "$nw"; trap - EXIT; log "building the CNI plugin $name failed"; return 1
    fi
  done
  if ! (cd "$nw/k8s" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $k8s_ld" \
    -o "$nw/bin/kube-proxy" k8s.io/kubernetes/cmd/kube-proxy >&2); then
    rm -rf "$nw"; trap - EXIT; log "building kube-proxy failed"; return 1
  fi
  rm -rf "$nw/cni" "$nw/k8s"
  printf 'k8s=%s cni-plugins=%s go=%s built=%s\n' "$K8S_VERSION" "$CNI_PLUGINS_VERSION" \
    "$(go env GOVERSION)" "$now" > "$nw/VERSIONS"
  # Atomic publish; a concurrent build that won the race is kept.
  if ! mv -T "$nw" "$net_final" 2>/dev/null; then
    if net_complete; then rm -rf "$nw"; else
      rm -rf "$net_final.stale.$$"; mv -T "$net_final" "$net_final.stale.$$" \
        && mv -T "$nw" "$net_final" && rm -rf "$net_final.stale.$$"
    fi
  fi
  trap - EXIT
  log "built the net set in $((SECONDS - start))s: $net_final/bin"
}

# kube-proxy (iptables mode) runs the machine's iptables-save/-restore; installed like busybox below.
ensure_iptables() {
  command -v iptables-restore >/dev/null && return 0
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    log "installing iptables (kube-proxy's iptables mode runs it)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >&2
  fi
  command -v iptables-restore >/dev/null || { log "kube-proxy needs iptables: apt-get install iptables"; return 1; }
}

# Version stamps (as kubernetes' hack/lib/version.sh sets them) for the kubelet and kube-proxy.
k8s_minor="${K8S_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
k8s_ld=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ld+=" -X $p.gitVersion=${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${k8s_minor}"
  k8s_ld+=" -X $p.gitTreeState=clean -X $p.buildDate=${now}"
done

if [[ "$mode" == crictl ]]; then
  build_crictl
  echo "$crictl_final/bin/crictl"
  exit 0
fi
if [[ "$mode" == net ]]; then
  build_net
  ensure_iptables
  echo "$net_final/bin"
  exit 0
fi

# In the default mode crictl and the net set are not fatal: their failure is logged.
build_extras_lenient() {
  build_crictl || log "WARNING: crictl is unavailable (see above); the main node binaries are fine"
  { build_net && ensure_iptables; } \
    || log "WARNING: the pod network set (CNI plugins, kube-proxy) is unavailable (see above)"
}

complete() {
  local b
  for b in "${binaries[@]}"; do [[ -x "$final/bin/$b" ]] || return 1; done
}

if complete; then
  log "cached: $final/bin"
  build_extras_lenient
  echo "$final/bin"
  exit 0
fi

command -v go >/dev/null || { log "go toolchain not found in PATH"; exit 1; }

check_pin() { # file, module, version
  grep -Eq "^[[:space:]]*(require )?${2//./\\.} ${3//./\\.}( |$)" "$1" \
    || { log "$1 does not pin $2 $3; run the gen-gomod.sh beside it"; exit 1; }
}
check_pin "$here/../kubernetes/go.mod" k8s.io/kubernetes "$K8S_VERSION"
check_pin "$here/containerd/go.mod" github.com/containerd/containerd/v2 "$CONTAINERD_VERSION"
check_pin "$here/runc/go.mod" github.com/opencontainers/runc "$RUNC_VERSION"
check_pin "$here/cdivalidate/go.mod" tags.cncf.io/container-device-interface "$CDI_LIB_VERSION"

# runc's seccomp support links libseccomp through cgo.
if ! { command -v cc >/dev/null && command -v pkg-config >/dev/null && pkg-config --exists libseccomp; }; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    log "installing libseccomp-dev pkg-config gcc libc6-dev (needed for runc with seccomp)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config gcc libc6-dev >&2
  fi
  pkg-config --exists libseccomp && command -v cc >/dev/null \
    || { log "runc needs a C compiler, pkg-config and libseccomp-dev; install them (apt-get install libseccomp-dev pkg-config gcc)"; exit 1; }
fi

mkdir -p "$cache_root"
work="$(mktemp -d "$cache_root/.build-${key}.XXXXXX")"
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
mkdir -p "$work/bin" "$work/src"

export GOFLAGS=-mod=mod
log "go: $(go version); GOMAXPROCS=${GOMAXPROCS:-default}; cache=$final"

total_start=$SECONDS
build() { # name, module dir (absolute), package, cgo (0/1), tags, extra ldflags
  local name="$1" dir="$2" pkg="$3" cgo="$4" tags="$5" extra="${6:-}" start=$SECONDS
  local src="$work/src/$(basename "$dir")"
  # Build from a copy so that -mod=mod can never rewrite the committed go.mod/go.sum.
  if [[ ! -d "$src" ]]; then
    mkdir -p "$src" && cp "$dir"/go.mod "$dir"/go.sum "$src/"
    if compgen -G "$dir/*.go" >/dev/null; then cp "$dir"/*.go "$src/"; fi
  fi
  log "building $name ($pkg) ..."
  (cd "$src" && CGO_ENABLED="$cgo" go build -trimpath -tags "$tags" -ldflags "-s -w $extra" -o "$work/bin/$name" "$pkg")
  log "built $name in $((SECONDS - start))s ($(du -h "$work/bin/$name" | cut -f1))"
}

ctrd_ld="-X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}"
ctrd_tags="no_btrfs no_devmapper no_zfs"

build cdivalidate "$here/cdivalidate" . 0 ""
build runc "$here/runc" github.com/opencontainers/runc 1 seccomp "-X main.version=${RUNC_VERSION#v}"
for b in containerd ctr containerd-shim-runc-v2; do
  build "$b" "$here/containerd" "github.com/containerd/containerd/v2/cmd/$b" 0 "$ctrd_tags" "$ctrd_ld"
done
build kubelet "$here/../kubernetes" k8s.io/kubernetes/cmd/kubelet 0 "" "$k8s_ld"
"$work/bin/runc" --version | grep -q '^libseccomp:' \
  || { log "runc was built without seccomp support"; exit 1; }

# A static busybox for the test images: Debian's busybox-static puts it at /bin/busybox.
is_static() { [[ -x "$1" ]] && ! ldd "$1" >/dev/null 2>&1; }
if ! is_static /bin/busybox && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
  log "installing busybox-static (the test images' only program)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends busybox-static >&2
fi
is_static /bin/busybox || { log "need a static /bin/busybox: apt-get install busybox-static"; exit 1; }
cp /bin/busybox "$work/bin/busybox"

rm -rf "$work/src"
printf 'k8s=%s containerd=%s runc=%s cdi=%s go=%s built=%s\n' "$K8S_VERSION" "$CONTAINERD_VERSION" \
  "$RUNC_VERSION" "$CDI_LIB_VERSION" "$(go env GOVERSION)" "$now" > "$work/VERSIONS"
# Atomic publish: another concurrent build may have won the race; then keep theirs.
if ! mv -T "$work" "$final" 2>/dev/null; then
  if complete; then log "another build published $final first; using it"; else
    rm -rf "$final.stale.$$"; mv -T "$final" "$final.stale.$$" && mv -T "$work" "$final" && rm -rf "$final.stale.$$"
  fi
fi
trap - EXIT
rm -rf "$work"
log "all node binaries built in $((SECONDS - total_start))s"
build_extras_lenient
echo "$final/bin"
