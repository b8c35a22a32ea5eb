#!/usr/bin/env bash
# deploy_image_test: the control-plane image of scripts/images/build_control_plane.sh runs the
# coordinator, and ulyssesctl (built here, outside the image) talks to it: it lists workers,
# submits a job and sees it PENDING; the image's /metrics reports the image's git sha in
# ulysses_build_info, /livez and /readyz answer.
#
# Cache: build_control_plane.sh records its image in OUT/image.env (IMAGE, GIT_SHA; the image is
# also tagged VERSION-GIT_SHA). That image is reused and checked against its own sha; the test
# says when HEAD has moved on since. Building one takes minutes (Debian downloads), so the
# test builds only with ULYSSES_IMAGE_BUILD=1 and otherwise skips, saying how to build it.
# Where podman cannot run a container (no podman, or a sandbox without the kernel features),
# it runs the same checks on the image's root filesystem with chroot (root only) and exits 77
# (ctest: skipped, with the reason printed) when neither works.
set -euo pipefail
SRC=${ULYSSES_SOURCE_DIR:?run through ctest}
CTL=${ULYSSES_CLI_TOOL:?run through ctest}
OUT=${ULYSSES_IMAGE_DIR:-$SRC/build-image}
skip() { echo "SKIPPED: $*"; exit 77; }

version=$(sed -n 's/^project(ulysses VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
head_sha=$(git -C "$SRC" rev-parse --short=12 HEAD)
if [[ "${ULYSSES_IMAGE_BUILD:-0}" == 1 ]]; then
  command -v mmdebstrap >/dev/null || skip "mmdebstrap missing (Debian package mmdebstrap)"
  if command -v podman >/dev/null; then
    "$SRC/scripts/images/build_control_plane.sh" "$OUT"
  else
    "$SRC/scripts/images/build_control_plane.sh" --rootfs-only "$OUT"
  fi
fi
[[ -f "$OUT/image.env" && -f "$OUT/rootfs.tar" ]] ||
  skip "no control-plane image in $OUT: build it with scripts/images/build_control_plane.sh" \
    "(a few minutes), or run with ULYSSES_IMAGE_BUILD=1"
sha=$(sed -n 's/^GIT_SHA=//p' "$OUT/image.env")
tag="ulysses-control-plane:$version-$sha"
[[ "$sha" == "$head_sha" ]] || echo "NOTE: the cached image was built from $sha; HEAD is $head_sha"
work=$(mktemp -d /tmp/ulysses_image_test_XXXXXX)
cid=""
cleanup() {
  [[ -z "$cid" ]] || podman rm -f "$cid" >/dev/null 2>&1 || true
  [[ -z "${coord_pid:-}" ]] || kill "$coord_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
http() { python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=5)
    print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
except OSError as e:
    print(0); print(e)
PY
}

have_image=0
if command -v podman >/dev/null && podman image exists "$tag" 2>/dev/null; then
  have_image=1
fi

# The image's metadata (podman), else the root filesystem's files.
state="$work/state"
mkdir -p "$state"
chown 10001:10001 "$state" 2>/dev/null || { command -v podman >/dev/null && podman unshare chown 10001:10001 "$state"; } || true
port=$(free_port)
mport=$(free_port)
args=(--listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" --state-dir /var/lib/ulysses)
runner=""
if ((have_image)); then
  label=$(podman image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$tag")
  [[ "$label" == "$sha" ]] || { echo "FAIL: image revision label '$label' != $sha"; exit 1; }
  user=$(podman image inspect --format '{{.Config.User}}' "$tag")
  [[ "$user" == 10001:10001 ]] || { echo "FAIL: image user '$user'"; exit 1; }
  if cid=$(podman run -d --network=host -v "$state:/var/lib/ulysses" "$tag" "${args[@]}" 2>"$work/run.err"); then
    runner=podman
  else
    echo "podman cannot run containers here: $(cat "$work/run.err")"
    cid=""
  fi
fi
if [[ -z "$runner" ]]; then
  [[ -f "$OUT/rootfs.tar" ]] || skip "podman cannot run containers here and there is no rootfs.tar"
  [[ $(id -u) == 0 ]] && command -v chroot >/dev/null && command -v setpriv >/dev/null ||
    skip "podman cannot run containers here, and chroot into the rootfs needs root"
  root="$work/rootfs"
  mkdir -p "$root"
  tar -xf "$OUT/rootfs.tar" -C "$root" 2>"$work/tar.err" || echo "tar: $(tail -n3 "$work/tar.err")"
  grep -q "^ulysses:x:10001:10001:" "$root/etc/passwd" || { echo "FAIL: no user 10001 in the rootfs"; exit 1; }
  grep -qx "git_sha=$sha" "$root/opt/ulysses/BUILD_INFO" || { echo "FAIL: BUILD_INFO lacks $sha"; exit 1; }
  mkdir -p "$root/var/lib/ulysses" "$root/proc"
  mount --bind "$state" "$root/var/lib/ulysses" 2>/dev/null || skip "cannot bind-mount into the rootfs"
  mount -t proc proc "$root/proc" 2>/dev/null || true
  trap 'kill "${coord_pid:-0}" 2>/dev/null; wait 2>/dev/null; umount "$root/proc" "$root/var/lib/ulysses" 2>/dev/null || true; cleanup' EXIT
  # The rootfs's own loader and libraries only: a library missing from the image fails here.
  chroot --userspec=10001:10001 "$root" /opt/ulysses/bin/ulysses-coordinator "${args[@]}" \
    >"$work/coordinator.log" 2>&1 &
  coord_pid=$!
  runner="chroot (podman unavailable)"
fi
echo "running the coordinator from the image via $runner"

# Ready: /readyz answers 200 (polled; the coordinator recovers its empty state first).
for _ in $(seq 1 150); do
  [[ "$(http "http://127.0.0.1:$mport/readyz" | head -n1)" == 200 ]] && break
  sleep 0.2
done
ready=$(http "http://127.0.0.1:$mport/readyz")
if [[ "$(head -n1 <<<"$ready")" != 200 ]]; then
  echo "FAIL: /readyz: $ready"
  [[ -n "$cid" ]] && podman logs "$cid"
  [[ -f "$work/coordinator.log" ]] && cat "$work/coordinator.log"
  exit 1
fi
[[ "$(http "http://127.0.0.1:$mport/livez" | head -n1)" == 200 ]] || { echo "FAIL: /livez"; exit 1; }
metrics=$(http "http://127.0.0.1:$mport/metrics")
grep -q "ulysses_build_info{version=\"$version\",git_sha=\"$sha\"} 1" <<<"$metrics" ||
  { echo "FAIL: build_info is not $sha:"; grep build_info <<<"$metrics"; exit 1; }

# ulyssesctl from this build, with the admin token the coordinator wrote into its state dir
# (the client config it wrote names the path inside the image; this one the host's).
[[ -s "$state/admin.token" ]] || { echo "FAIL: no admin.token in the state dir"; exit 1; }
cat >"$work/ulyssesctl.yaml" <<YAML
current-context: image
contexts:
  - name: image
    server: 127.0.0.1:$port
    token_file: $state/admin.token
YAML
export ULYSSES_CONFIG="$work/ulyssesctl.yaml"
"$CTL" get workers -o json
id=$("$CTL" submit -f "$SRC/configs/jobs/tiny-demo.yaml" --set spec.stages[0].steps=1)
echo "submitted $id"
"$CTL" get jobs -o json | python3 -c '
import json, sys
jobs = json.load(sys.stdin)
ids = {j["id"]: j["state"] for j in jobs}
assert ids.get(sys.argv[1]) == "PENDING", ids
print("job", sys.argv[1], "PENDING in the coordinator of the image")' "$id"
echo "PASS ($runner)"
