"""unittest's main with ctest's skip convention, for the Python checks (tests/deploy).

A run in which a test skipped and none failed or errored exits SKIP_RETURN_CODE (77, the
code tests/CMakeLists.txt gives every test's SKIP_RETURN_CODE), so ctest shows the check as
"Skipped", never "Passed" (the same rule as the gtest binaries: tests/testing/gtest_main.cc).
A failure exits 1 (a skip never hides it), as does a run in which no test ran; a run where
everything ran and passed exits 0. ctest_main_test.py checks the three codes."""
import sys
import unittest

SKIP_RETURN_CODE = 77


def main():
    program = unittest.main(module="__main__", verbosity=2, exit=False)
    result = program.result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.testsRun == 0:
        print("ctest_main: no test ran", file=sys.stderr)
        sys.exit(1)
    if result.skipped:
        names = ", ".join(f"{test.id()} ({reason})" for test, reason in result.skipped)
        print(f"ctest_main: {len(result.skipped)} skipped, none failed: exit "
              f"{SKIP_RETURN_CODE} (skipped): {names}", file=sys.stderr)
        sys.exit(SKIP_RETURN_CODE)
    sys.exit(0)
