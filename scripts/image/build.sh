#!/usr/bin/env bash
# Container images without a daemon: a Debian base (rootfs.sh) and the binary as two layers, put
# together by umoci into an OCI image, written as an OCI archive (a tar of the image layout).
#
#   scripts/image/build.sh [--out DIR] [--tag TAG] [--registry REG] COMPONENT...
#
#   agent, controller   switchyard-agent / switchyard-controller from a release build of this tree
#   agent-no-nft        the agent image with `nft` deleted by a whiteout layer: what a node whose image
#                       lacks nftables runs (the real-cluster suite's bad input), tagged <tag>-no-nft
#   pause, agnhost      the test images a lab cluster needs, from $SWITCHYARD_K8S_BIN (docs/reference.md, "The Kubernetes binaries")
#
# Each archive is DIR/<name>.tar (default target/images), with the image's full reference in the
# index (org.opencontainers.image.ref.name), so `ctr images import`, `skopeo copy oci-archive:...`
# and `podman load` name it. Prints one line per image: reference, manifest digest, the binary
# layer's digest, compressed size.
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the commit time), files are root-owned
# and sorted, and the binaries are built with their source paths remapped, so the same commit gives
# the same binary layer digest wherever it is checked out. The base layer changes only with Debian's
# package versions. The binaries are built in target/image-build (their own flags, so they never
# invalidate the usual release build).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

out=target/images
tag=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
registry=ghcr.io/switchyard
components=()
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --registry) registry=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown flag $1" >&2; exit 2 ;;
    *) components+=("$1"); shift ;;
  esac
done
((${#components[@]})) || components=(agent controller)

missing=()
for tool in umoci mmdebstrap tar gzip sha256sum; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "build.sh: missing ${missing[*]} (Debian: apt-get install umoci mmdebstrap)" >&2
  exit 2
fi

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p "$out"
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A layer tar of one directory, byte-for-byte the same for the same files.
layer_tar() { # DIR OUT
  tar -C "$1" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime --owner=0 --group=0 \
    --numeric-owner --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -cf "$2" .
}

# The base root filesystem, cached by the script that makes it and the Debian day, with the other
# caches (`make clean` keeps it; `make clean-caches` removes it). One per component: a new day's
# replaces the last.
base_cache=${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/image-base
base_tar() { # COMPONENT
  local key
  key=$(cat scripts/image/rootfs.sh | sha256sum | cut -c1-12)
  local cached="$base_cache/$1-$key-$(date -u +%Y%m%d).tar"
  if [[ ! -s "$cached" ]]; then
    echo "build.sh: $1 base: mmdebstrap (Debian packages; about a minute)" >&2
    mkdir -p "$base_cache"
    find "$base_cache" -name "$1-*.tar" -delete
    # NB: `|| return`: this runs in a command substitution, where bash does not apply `set -e`.
    scripts/image/rootfs.sh "$1" "$cached" || return 1
  fi
  echo "$cached"
}

# Both binaries in one cargo run (the second call finds them up to date).
release_binary() { # NAME
  echo "build.sh: cargo build --release (target/image-build)" >&2
  # Paths in panic messages: the tree and the registry, remapped, so the binary does not depend on
  # where this checkout or ~/.cargo lives.
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  CARGO_TARGET_DIR=target/image-build \
  CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=symbols \
  RUSTFLAGS="--remap-path-prefix=$repo=/src --remap-path-prefix=$cargo_home=/cargo ${RUSTFLAGS:-}" \
    cargo build --release --locked -q -p switchyard-agent -p switchyard-controller \
      --bin switchyard-agent --bin switchyard-controller >&2 || return 1
  echo "target/image-build/release/$1"
}

k8s_binary() { # NAME: unpacked in $SWITCHYARD_K8S_BIN
  local dir=${SWITCHYARD_K8S_BIN:-}
  if [[ -z "$dir" || ! -x "$dir/$1" ]]; then
    echo "build.sh: $1 comes from SWITCHYARD_K8S_BIN (a folder of Kubernetes binaries: docs/reference.md, "The Kubernetes binaries")" >&2
    exit 2
  fi
  echo "$dir/$1"
}

# image NAME TAG BASE_TAR|- FILES_DIR CONFIG_ARGS...
# (with $archive set: the archive's name instead of NAME; with $whiteouts set: one more layer that
# deletes those paths, as `RUN rm` would in a Dockerfile)
image() {
  local name=$1 image_tag=$2 base=$3 files=$4
  shift 4
  local layout="$work/${archive:-$name}" ref="$registry/$name:$image_tag"
  case $name in
    pause) ref="registry.k8s.io/pause:$image_tag" ;;
    agnhost) ref="registry.k8s.io/e2e-test-images/agnhost:$image_tag" ;;
  esac
  umoci init --layout "$layout"
  umoci new --image "$layout:$image_tag"
  if [[ $base != - ]]; then
    umoci raw add-layer --image "$layout:$image_tag" --history.created="$created" \
      --history.created_by="scripts/image/rootfs.sh $name" "$base"
  fi
  layer_tar "$files" "$work/$name-files.tar"
  umoci raw add-layer --image "$layout:$image_tag" --history.created="$created" \
    --history.created_by="scripts/image/build.sh $name" "$work/$name-files.tar"
  if [[ -n ${whiteouts:-} ]]; then
    local deleted="$work/$name-whiteouts" path
    for path in $whiteouts; do
      mkdir -p "$deleted/$(dirname "$path")"
      : > "$deleted/$(dirname "$path")/.wh.$(basename "$path")"
    done
    layer_tar "$deleted" "$work/$name-whiteouts.tar"
    umoci raw add-layer --image "$layout:$image_tag" --history.created="$created" \
      --history.created_by="rm $whiteouts" "$work/$name-whiteouts.tar"
  fi
  umoci config --image "$layout:$image_tag" --created="$created" --author=switchyard \
    --os=linux --architecture=amd64 --no-history "$@"
  umoci gc --layout "$layout"
  # The index names the image by its full reference, which is what importers tag it with.
  local index="$layout/index.json"
  sed -i "s|\"org.opencontainers.image.ref.name\":\"$image_tag\"|\"org.opencontainers.image.ref.name\":\"$ref\"|" "$index"
  layer_tar "$layout" "$out/${archive:-$name}.tar.partial"
  mv "$out/${archive:-$name}.tar.partial" "$out/${archive:-$name}.tar"

  local manifest_digest manifest size=0 blob last_layer
  manifest_digest=$(sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' "$index")
  manifest="$layout/blobs/sha256/${manifest_digest#sha256:}"
  for blob in $(grep -o 'sha256:[0-9a-f]*' "$manifest"); do
    size=$((size + $(stat -c %s "$layout/blobs/sha256/${blob#sha256:}")))
  done
  last_layer=$(grep -o '"layers":.*' "$manifest" | grep -o 'sha256:[0-9a-f]*' | tail -n1)
  printf '%-52s %s  binary layer %s  %s compressed\n' "$ref" "$manifest_digest" "${last_layer:0:19}" \
    "$(numfmt --to=iec-i --suffix=B "$size")"
  echo "$ref $manifest_digest $last_layer $size" >> "$out/images.txt.partial"
}

labels() { # TITLE
  echo --config.label="org.opencontainers.image.title=$1" \
    --config.label="org.opencontainers.image.version=$tag" \
    --config.label="org.opencontainers.image.revision=$revision" \
    --config.label="org.opencontainers.image.licenses=Apache-2.0" \
    --config.label="org.opencontainers.image.source=https://github.com/switchyard/switchyard"
}

rm -f "$out/images.txt.partial"
for component in "${components[@]}"; do
  files="$work/$component-root"
  mkdir -p "$files"
  case "$component" in
    agent | agent-no-nft)
      binary=$(release_binary switchyard-agent)
      base=$(base_tar agent)
      install -D -m 0755 "$binary" "$files/usr/local/bin/switchyard-agent"
      # NB: image() reads `archive` and `whiteouts`: set them only for its call (prefix assignments),
      # never as globals a later component would inherit.
      agent_tag=$tag agent_archive= agent_whiteouts=
      if [[ $component == agent-no-nft ]]; then
        agent_tag=$tag-no-nft agent_archive=switchyard-agent-no-nft agent_whiteouts=usr/sbin/nft
      fi
      # Root, not privileged: the DaemonSet grants NET_ADMIN and NET_RAW in the host network namespace.
      # shellcheck disable=SC2046
      archive=$agent_archive whiteouts=$agent_whiteouts image switchyard-agent "$agent_tag" "$base" "$files" \
        --config.entrypoint=/usr/local/bin/switchyard-agent --config.cmd=--help --config.user=0:0 \
        $(labels switchyard-agent)
      ;;
    controller)
      binary=$(release_binary switchyard-controller)
      base=$(base_tar controller)
      install -D -m 0755 "$binary" "$files/usr/local/bin/switchyard-controller"
      # Numeric, so the kubelet can verify runAsNonRoot without a passwd entry.
      # shellcheck disable=SC2046
      image switchyard-controller "$tag" "$base" "$files" \
        --config.entrypoint=/usr/local/bin/switchyard-controller --config.cmd=--help --config.user=65532:65532 \
        $(labels switchyard-controller)
      ;;
    pause)
      # The sandbox image a v1.36 node expects (registry.k8s.io/pause:3.10.2): one static binary.
      binary=$(k8s_binary pause)
      install -D -m 0755 "$binary" "$files/pause"
      image pause 3.10.2 - "$files" --config.entrypoint=/pause --config.user=65535:65535
      ;;
    agnhost)
      binary=$(k8s_binary agnhost)
      base=$(base_tar agnhost)
      install -D -m 0755 "$binary" "$files/agnhost"
      image agnhost 2.63.0 "$base" "$files" --config.entrypoint=/agnhost
      ;;
    *) echo "build.sh: unknown component '$component' (agent, agent-no-nft, controller, pause, agnhost)" >&2; exit 2 ;;
  esac
done
mv "$out/images.txt.partial" "$out/images.txt"
