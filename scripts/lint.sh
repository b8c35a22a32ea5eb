#!/usr/bin/env bash
# Lint: the clang-format check over the whole tree, then clang-tidy over changed files.
#
#   scripts/lint.sh                 format check + clang-tidy on the C++ files changed since
#                                   the merge-base with main (committed, staged, unstaged,
#                                   untracked)
#   scripts/lint.sh FILE...         format check + clang-tidy on these files
#   scripts/lint.sh --format-only   only the format check (what CI runs: a few seconds)
#   BASE=origin/main scripts/lint.sh    compare with another base
#
# Format: every tracked *.cc, *.h and *.proto must be unchanged by `clang-format`
# (.clang-format); fix with `clang-format -i FILE`. clang-tidy uses .clang-tidy and
# $BUILD_DIR/compile_commands.json (configure first, see scripts/bootstrap.sh); a changed
# header is checked through its .cc (or, failing that, through a source that includes it).
# Forbidden: remove_all( in any tracked C++ file (see the check below); also in --format-only.
# Exits 1 if anything is reported. CI runs the format check as the ctest entry lint_format.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build_env.sh

format_only=0
if [ "${1:-}" = "--format-only" ]; then
  format_only=1
  shift
fi

status=0
# Exit 77 (ctest "skipped", see tests/CMakeLists.txt lint_format) when the check cannot run.
if ! command -v clang-format >/dev/null; then
  echo "lint: clang-format not installed (scripts/bootstrap.sh installs it); skipped"
  exit 77
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "lint: not a git checkout (the files checked are git's tracked files); skipped"
  exit 77
fi

# --- clang-format over every tracked C/C++/proto file --------------------------------------
mapfile -t tracked < <(git ls-files -- '*.cc' '*.h' '*.proto' | while read -r f; do
  [ -f "$f" ] && echo "$f"  # Not those deleted in the work tree.
done)
# One clang-format process for all files; each difference is reported as
# "FILE:LINE:COL: error: code should be clang-formatted".
mapfile -t unformatted < <(clang-format --dry-run -Werror "${tracked[@]}" 2>&1 |
  sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
if [ ${#unformatted[@]} -gt 0 ]; then
  echo "lint: ${#unformatted[@]} file(s) not clang-formatted (fix: clang-format -i FILE):"
  printf '  %s\n' "${unformatted[@]}"
  status=1
else
  echo "lint: clang-format: ${#tracked[@]} files clean"
fi
# --- forbidden calls ------------------------------------------------------------------------
# std::filesystem::remove_all may bind to the copy of libstdc++'s filesystem that the PyTorch
# pip wheel exports (pytorch/pytorch#133437) and crash; delete trees with RemoveTree
# (common/file_tree.h).
# bench/gpu/fs_symbol_probe.cc calls it on purpose: it diagnoses that crash.
mapfile -t forbidden < <(git grep -nE '\bremove_all[[:space:]]*\(' -- '*.cc' '*.h' '*.cpp' \
  ':!bench/gpu/fs_symbol_probe.cc' || true)
if [ ${#forbidden[@]} -gt 0 ]; then
  echo "lint: remove_all is forbidden (use ulysses::RemoveTree from common/file_tree.h):"
  printf '  %s\n' "${forbidden[@]}"
  status=1
else
  echo "lint: no remove_all calls"
fi
# --- spec field paths in the engine ------------------------------------------------------
# The engine names spec fields in its messages through spec::fields::PathOf / ShapePathOf
# (common/spec/job_spec_fields.h), never as a literal "spec.x.y": a literal drifts when a field
# moves. Reported: a string literal in worker/engine/**.cc naming spec.<section> (comments skipped).
mapfile -t literal_paths < <(git ls-files -- 'worker/engine/*.cc' | while read -r f; do
  [ -f "$f" ] && perl -ne '
    next if m{^\s*//};
    my $line = $_;
    $line =~ s{//[^"]*$}{};
    while ($line =~ /"((?:[^"\\]|\\.)*)"/g) {
      my $lit = $1;
      if ($lit =~ /(?<![A-Za-z0-9_.])spec\.(metadata|model|data|parallelism|memory|optimizer|stages|checkpoint|scheduling|eval)\b/) {
        print "$ARGV:$.: \"$lit\"\n";
        last;
      }
    }' "$f"
done)
if [ ${#literal_paths[@]} -gt 0 ]; then
  echo "lint: spec field paths written as literals in the engine (use spec::fields::PathOf):"
  printf '  %s\n' "${literal_paths[@]}"
  status=1
else
  echo "lint: engine field paths through PathOf"
fi
[ "$format_only" = 1 ] && exit "$status"

# --- clang-tidy over changed (or given) C++ files ------------------------------------------
db="$BUILD_DIR/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "lint: $db missing: configure the build first (scripts/bootstrap.sh --no-build, then cmake)"
  exit 1
fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  base=$(git merge-base "${BASE:-main}" HEAD)
  mapfile -t files < <({ git diff --name-only --diff-filter=d "$base" -- '*.cc' '*.h';
                         git ls-files --others --exclude-standard -- '*.cc' '*.h'; } | sort -u)
fi

# Sources in the compilation database, relative to the checkout.
mapfile -t compiled < <(python3 - "$db" "$PWD" "$BUILD_DIR" <<'EOF'
import json, os, sys
db, root, build = sys.argv[1], sys.argv[2], os.path.normpath(sys.argv[3])
for entry in json.load(open(db)):
    rel = os.path.relpath(os.path.join(entry["directory"], entry["file"]), root)
    if not rel.startswith("..") and not rel.startswith(build + os.sep):  # Generated code.
        print(rel)
EOF
)
in_db() { printf '%s\n' "${compiled[@]}" | grep -qxF "$1"; }

units=()
for f in "${files[@]}"; do
  case "$f" in
    *.cc)
      if in_db "$f"; then units+=("$f"); else echo "lint: $f is not in $db (not built here); skipped"; fi
      ;;
    *.h)
      sibling="${f%.h}.cc"
      if in_db "$sibling"; then
        units+=("$sibling")
      else
        includer=$(printf '%s\n' "${compiled[@]}" | while read -r c; do
          if grep -qF "#include \"$f\"" "$c" 2>/dev/null; then echo "$c"; break; fi
        done)
        if [ -n "$includer" ]; then units+=("$includer"); else echo "lint: no built source includes $f; skipped"; fi
      fi
      ;;
  esac
done
mapfile -t units < <(printf '%s\n' "${units[@]}" | sort -u | sed '/^$/d')
if [ ${#units[@]} -eq 0 ]; then
  echo "lint: clang-tidy: no changed C++ sources"
  exit "$status"
fi
echo "lint: clang-tidy on ${#units[@]} file(s)"
for u in "${units[@]}"; do
  # --quiet drops the "N warnings generated" lines; warnings from system headers are not shown.
  out=$(clang-tidy --quiet -p "$BUILD_DIR" "$u" 2>/dev/null || true)
  if echo "$out" | grep -qE '(warning|error):'; then
    echo "$out"
    status=1
  fi
done
[ "$status" = 0 ] && echo "lint: clean"
exit "$status"
