#!/usr/bin/env bash
# Clang thread-safety analysis of the control plane: every source under coordinator/,
# worker/agent/, client/ and common/ that uses Abseil's lock annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED, absl::MutexLock, ...) directly or through a project header it
# includes is parsed by clang++ with -Wthread-safety -Werror (syntax only: nothing is built).
# GCC ignores the annotations, so without this check they are comments.
#
#   scripts/thread_safety.sh            check every annotated source
#   scripts/thread_safety.sh FILE...    check these sources
#
# Needs $BUILD_DIR/compile_commands.json and the generated proto headers (a built tree).
# Exits 77 (ctest "skipped", see tests/CMakeLists.txt lint_thread_safety) when clang++ or the
# compilation database is missing, 1 when the analysis reports anything.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build_env.sh

clang=$(command -v clang++ || true)
if [ -z "$clang" ]; then
  echo "thread_safety: clang++ not installed (scripts/bootstrap.sh installs clang); skipped"
  exit 77
fi
db="$BUILD_DIR/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "thread_safety: $db missing: build first (scripts/bootstrap.sh); skipped"
  exit 77
fi

# One line per unit: the clang++ command (as a JSON list) that parses it.
mapfile -t commands < <(python3 - "$db" "$PWD" "$clang" "$@" <<'PY'
import json, os, re, shlex, sys
db, root, clang, wanted = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ANNOTATED = re.compile(r"ABSL_(GUARDED_BY|PT_GUARDED_BY|EXCLUSIVE_LOCKS_REQUIRED|"
                       r"SHARED_LOCKS_REQUIRED|LOCKS_EXCLUDED|LOCK_RETURNED|"
                       r"EXCLUSIVE_LOCK_FUNCTION|UNLOCK_FUNCTION|SCOPED_LOCKABLE)|absl::Mutex")
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)
DIRS = ("coordinator/", "worker/agent/", "client/", "common/")

cache = {}
def annotated(rel, seen):
    """True when rel or a project header it includes (transitively) uses the annotations."""
    if rel in seen:
        return False
    seen.add(rel)
    if rel not in cache:
        try:
            text = open(os.path.join(root, rel), encoding="utf-8").read()
        except OSError:
            cache[rel] = (False, [])
        else:
            cache[rel] = (bool(ANNOTATED.search(text)), INCLUDE.findall(text))
    direct, includes = cache[rel]
    return direct or any(annotated(h, seen) for h in includes
                         if os.path.isfile(os.path.join(root, h)))

for entry in json.load(open(db)):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if wanted:
        if rel not in wanted:
            continue
    elif not rel.startswith(DIRS) or not annotated(rel, set()):
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    out, skip = [clang], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = a == "-o"
            continue
        if a == path or a == entry["file"]:
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Wthread-safety-beta",
            "-Werror=thread-safety", "-Werror=thread-safety-beta", path]
    print(rel + "\t" + json.dumps(out))
PY
)
if [ ${#commands[@]} -eq 0 ]; then
  echo "thread_safety: no annotated sources found (is $db from a configured tree?)"
  exit 1
fi

status=0
for line in "${commands[@]}"; do
  rel=${line%%$'\t'*}
  mapfile -t argv < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "${line#*$'\t'}")
  if ! out=$("${argv[@]}" 2>&1); then
    echo "thread_safety: $rel:"
    echo "$out"
    status=1
  fi
done
[ "$status" = 0 ] && echo "thread_safety: ${#commands[@]} sources clean (clang -Wthread-safety)"
exit "$status"
