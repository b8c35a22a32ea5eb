"""Every registered ctest entry has a label (its component; `slow` too for the long ones), and
every `slow` one a COST (its CI seconds, so a fresh clone's ctest -j starts it first).
Reads the test list of the build tree it runs in: ctest --show-only=json-v1.
Usage: test_labels_check.py CTEST_COMMAND (run with the build directory as working directory)."""
import json
import subprocess
import sys


def main():
    ctest = sys.argv[1] if len(sys.argv) > 1 else "ctest"
    listing = subprocess.run([ctest, "--show-only=json-v1"], capture_output=True, text=True,
                             check=True).stdout
    tests = json.loads(listing)["tests"]
    problems = []
    for test in tests:
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        labels = props.get("LABELS") or []
        if not labels:
            problems.append(f"{test['name']}: no LABELS (ulysses_add_test labels it by folder; "
                            "an add_test() needs set_tests_properties(... LABELS <component>))")
        if "slow" in labels and not props.get("COST"):
            problems.append(f"{test['name']}: labelled slow without a COST (its seconds in "
                            "docs/BENCHMARKS.md \"CI time\")")
    for p in problems:
        print(p)
    print(f"test_labels_check: {len(tests)} tests, {len(problems)} problems")
    sys.exit(1 if problems or not tests else 0)


if __name__ == "__main__":
    main()
