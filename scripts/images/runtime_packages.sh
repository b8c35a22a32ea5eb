#!/usr/bin/env bash
# Prints the Debian packages (one per line, sorted) that hold the shared libraries the given
# executables load, so an image's runtime stage installs exactly those (Containerfiles under
# deploy/images). Run on the Debian machine that built them:
#
#   scripts/images/runtime_packages.sh BINARY...
#
# Fails, naming the library, when one is not found or belongs to no package.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }

deps=$(ldd "$@")
if missing=$(grep "not found" <<<"$deps"); then
  echo "runtime_packages: unresolved libraries:" >&2
  echo "$missing" >&2
  exit 1
fi
# "libx.so.1 => /lib/x86_64-linux-gnu/libx.so.1 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)".
mapfile -t libs < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(/ {print $1}' \
  <<<"$deps" | sort -u)
# With merged /usr, ldd may name /lib/... where dpkg recorded /usr/lib/... (or the reverse), and
# an alternatives symlink (libblas.so.3) is owned by no package but its target is.
variants() {
  local real
  real=$(readlink -f "$1")
  for p in "$1" "$real"; do
    echo "$p"
    case "$p" in
      /usr/*) echo "${p#/usr}" ;;
      *) echo "/usr$p" ;;
    esac
  done
}
candidates=()
for lib in "${libs[@]}"; do mapfile -t -O ${#candidates[@]} candidates < <(variants "$lib"); done
owners=$(dpkg -S "${candidates[@]}" 2>/dev/null || true)
packages=()
unowned=()
for lib in "${libs[@]}"; do
  pkg=$(variants "$lib" | awk 'NR == FNR {want[$0] = 1; next}
        ($NF in want) {sub(/:.*/, "", $1); print $1; exit}' - <(echo "$owners"))
  if [ -n "$pkg" ]; then packages+=("$pkg"); else unowned+=("$lib"); fi
done
if [ ${#unowned[@]} -gt 0 ]; then
  echo "runtime_packages: these libraries belong to no Debian package: ${unowned[*]}" >&2
  exit 1
fi
printf '%s\n' "${packages[@]}" | sort -u
