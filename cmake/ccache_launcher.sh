#!/usr/bin/env bash
# The compiler launcher when ccache is installed (CMakeLists.txt):
#   ccache_launcher.sh SOURCE_DIR BUILD_DIR CCACHE COMPILER ARGS...
# runs ccache with the settings precompiled headers need (cmake/Pch.cmake), and makes a
# precompiled header's cache key the same in every checkout.
#
# A unit built with a PCH is keyed by ccache on the PCH's bytes, and Clang writes the checkout's
# absolute paths into them: each fresh clone (CI's) built a PCH of other bytes and so missed the
# cache for every unit that uses one (about 250 of 430, ~400 s on 2 cores). With
# pch_external_checksum ccache hashes "<pch>.sum" instead, which this script writes next to the
# PCH in the same build step: a hash of the compile command and of the content of every file the
# PCH read (its -MF dependency list), with SOURCE_DIR and BUILD_DIR written as placeholders. It
# changes whenever the PCH's inputs do; a stale one is removed before the PCH is rebuilt. The PCH
# is always compiled here (ccache off for it): its bytes name this checkout's paths.
set -euo pipefail
source_dir=$1 build_dir=$2
shift 2
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# Depend mode: on a miss ccache takes the headers from the compiler's -MD file instead of
# running the preprocessor first (about 1 CPU-s a unit on an empty cache).
export CCACHE_DEPEND=1
export CCACHE_PCH_EXTSUM=1

# CMake passes the PCH's header as `-Xclang -include -Xclang <BUILD_DIR>/...`, an argument
# ccache does not know to be a path (its base_dir rewriting skips it): name it relative to the
# build directory, where the compiler runs, so that it hashes the same in every checkout.
args=() out="" depfile="" emits_pch=0 prev=""
for arg in "$@"; do
  case "$prev" in
    -o) out=$arg ;;
    -MF) depfile=$arg ;;
  esac
  [ "$arg" = "-emit-pch" ] && emits_pch=1
  if [ "$PWD" = "$build_dir" ] && [[ "$arg" == "$build_dir"/*/cmake_pch.hxx ]]; then
    arg=${arg#"$build_dir"/}
  fi
  args+=("$arg")
  prev=$arg
done
set -- "${args[@]}"
if [ "$emits_pch" = 0 ] || [ -z "$out" ] || [ -z "$depfile" ]; then
  exec "$@"
fi

rm -f "$out.sum"
# The PCH itself is compiled, never taken from the cache: Clang records the absolute path of
# its header in it, so another checkout's PCH (same key) would name that checkout's files.
CCACHE_DISABLE=1 "$@"
placeholders() { sed -e "s|$build_dir|@BUILD@|g" -e "s|$source_dir|@SOURCE@|g"; }
{
  printf '%s\n' "$@" | placeholders
  # The dependency list: "target: dep dep \" lines; one path a line, in order.
  sed -e 's/^[^:]*://' -e 's/\\$//' "$depfile" | tr -s ' \t' '\n\n' | sed '/^$/d' |
    while IFS= read -r dep; do
      printf '%s ' "$dep" | placeholders
      sha256sum < "$dep"
    done
} | sha256sum > "$out.sum.tmp"
mv "$out.sum.tmp" "$out.sum"
