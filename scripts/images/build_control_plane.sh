#!/usr/bin/env bash
# Builds the control-plane image (ulysses-coordinator, ulyssesctl, ulysses-worker on Debian
# bookworm, uid 10001) from Debian packages, without pulling anything from a container
# registry: mmdebstrap makes the root filesystem from the Debian archive apt already uses,
# with every runtime package pinned to the version the binaries were built against on this
# machine, and `podman import` turns it into an image. deploy/images/Containerfile.control-plane
# is the same image for machines that build from a registry's debian:bookworm.
#
#   scripts/images/build_control_plane.sh [--rootfs-only] [OUT_DIR]
#
# OUT_DIR (default build-image/): stage/ (binaries, runtime-packages.txt), packages.pinned
# (name=version per line), rootfs.tar, image.env (IMAGE=, GIT_SHA=, INPUTS=), and unless
# --rootfs-only the image `ulysses-control-plane:VERSION` (also tagged VERSION-SHA, the cache key
# tests/deploy/image_test.sh reuses; INPUTS, a hash of the binaries and the pinned package list,
# is the label io.ulysses.inputs)
# in podman's store plus OUT_DIR/ulysses-control-plane.oci.tar (`skopeo copy
# oci-archive:... docker://REGISTRY/...` pushes it). The git sha (uncommitted
# changes flag io.ulysses.dirty=true) is compiled into the binaries (ulysses_build_info) and set
# as the image label org.opencontainers.image.revision.
#
# Needs: the project's packages (scripts/bootstrap.sh), mmdebstrap, and podman unless
# --rootfs-only. Runs as root (mmdebstrap --mode=root) or, unprivileged, with user namespaces
# (--mode=unshare). Takes a few minutes (downloads ~60 MB of .deb files once per run).
set -euo pipefail
cd "$(dirname "$0")/../.."
rootfs_only=0
if [[ "${1:-}" == --rootfs-only ]]; then
  rootfs_only=1
  shift
fi
OUT=${1:-build-image}
for tool in mmdebstrap git dpkg-query; do
  command -v "$tool" >/dev/null || { echo "build_control_plane: $tool not found (scripts/bootstrap.sh)" >&2; exit 1; }
done
if ((!rootfs_only)) && ! command -v podman >/dev/null; then
  echo "build_control_plane: podman not found (Debian package podman), or use --rootfs-only" >&2
  exit 1
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The sha the binaries report (ulysses_build_info): CMake reads `git rev-parse --short=12 HEAD` when
# build_binaries.sh configures the build; uncommitted changes are flagged in a label.
sha=$(git rev-parse --short=12 HEAD)
dirty=false
[[ -z "$(git status --porcelain --untracked-files=no)" ]] || dirty=true
version=$(sed -n 's/^project(ulysses VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ -n "$version" ]] || { echo "build_control_plane: no project version in CMakeLists.txt" >&2; exit 1; }

# 1. The binaries (a configure, so the compiled-in sha is HEAD's).
rm -rf "$OUT/stage"
scripts/images/build_binaries.sh "$OUT/stage" ulysses-coordinator ulyssesctl ulysses-worker

# 2. Pinned runtime packages: the version the archive offers now (apt's candidate; bookworm's
# stable ABI, so the binaries built against the installed one load it). The installed version
# itself may be gone from the archive once a point release or security update replaced it.
: >"$OUT/packages.pinned"
while read -r pkg; do
  [[ -n "$pkg" ]] || continue
  ver=$(apt-cache policy "$pkg" | awk '$1 == "Candidate:" {print $2}')
  [[ -n "$ver" && "$ver" != "(none)" ]] || { echo "build_control_plane: no candidate for $pkg" >&2; exit 1; }
  echo "$pkg=$ver" >>"$OUT/packages.pinned"
done <"$OUT/stage/runtime-packages.txt"
inputs=$(cat "$OUT/packages.pinned" "$OUT"/stage/bin/* | sha256sum | cut -c1-16)

# 3. The root filesystem: bookworm (minbase: the required packages, apt, passwd) from the Debian
# archives apt uses here (/etc/apt/sources.list.d/*.sources, bookworm-security included, so the
# pinned versions are found), the pinned packages, the binaries, the user. SOURCE_DATE_EPOCH
# (the commit time) keeps timestamps stable.
mirrors=()
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
  [[ -f "$f" ]] && grep -q '^URIs:.*debian\|^deb .*debian' "$f" && mirrors+=("$f")
done
((${#mirrors[@]})) || mirrors=(http://deb.debian.org/debian)
mode=root
[[ $(id -u) == 0 ]] || mode=unshare
mapfile -t pinned <"$OUT/packages.pinned"
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
mmdebstrap --mode="$mode" --variant=minbase --format=tar \
  --include="$(IFS=,; echo "${pinned[*]}")" \
  --customize-hook='mkdir -p "$1/opt/ulysses/bin"' \
  --customize-hook="copy-in $OUT/stage/bin/ulysses-coordinator $OUT/stage/bin/ulyssesctl $OUT/stage/bin/ulysses-worker /opt/ulysses/bin" \
  --customize-hook='chroot "$1" groupadd --system --gid 10001 ulysses' \
  --customize-hook='chroot "$1" useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ulysses --create-home ulysses' \
  --customize-hook="printf 'version=%s\ngit_sha=%s\ndirty=%s\ninputs=%s\n' '$version' '$sha' '$dirty' '$inputs' >\"\$1/opt/ulysses/BUILD_INFO\"" \
  --customize-hook="cp $OUT/packages.pinned \"\$1/opt/ulysses/packages.pinned\"" \
  --customize-hook='rm -rf "$1/var/lib/apt/lists"/* "$1/var/cache/apt"/*.bin' \
  bookworm "$OUT/rootfs.tar" "${mirrors[@]}"

image="ulysses-control-plane:$version"
printf 'IMAGE=%s\nGIT_SHA=%s\nINPUTS=%s\n' "$image" "$sha" "$inputs" >"$OUT/image.env"
if ((rootfs_only)); then
  echo "build_control_plane: $OUT/rootfs.tar (git $sha, inputs $inputs); no image (--rootfs-only)"
  exit 0
fi

# 4. The image: the same metadata as Containerfile.control-plane's final stage.
podman import \
  --change 'USER 10001:10001' \
  --change 'WORKDIR /var/lib/ulysses' \
  --change 'ENV PATH=/opt/ulysses/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'EXPOSE 50051' --change 'EXPOSE 9090' \
  --change 'ENTRYPOINT ["ulysses-coordinator"]' \
  --change "LABEL org.opencontainers.image.revision=$sha" \
  --change "LABEL org.opencontainers.image.version=$version" \
  --change "LABEL io.ulysses.inputs=$inputs" \
  --change "LABEL io.ulysses.dirty=$dirty" \
  "$OUT/rootfs.tar" "$image" >/dev/null
podman tag "$image" "ulysses-control-plane:$version-$sha"
rm -f "$OUT/ulysses-control-plane.oci.tar"
podman save --format oci-archive -o "$OUT/ulysses-control-plane.oci.tar" "$image" >/dev/null
echo "build_control_plane: $image (also :$version-$sha; git $sha) and $OUT/ulysses-control-plane.oci.tar"
