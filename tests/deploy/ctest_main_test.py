"""ctest_main.main()'s exit codes, on throwaway test modules run as their own processes: all
passed -> 0, one skipped and none failed -> 77, one skipped and one failed -> 1, none ran -> 1."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def exit_code(body):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.py")
        with open(path, "w") as f:
            f.write("import sys, unittest\nsys.path.insert(0, %r)\nimport ctest_main\n" % HERE)
            f.write(textwrap.dedent(body))
            f.write("\nif __name__ == '__main__':\n    ctest_main.main()\n")
        return subprocess.run([sys.executable, path], capture_output=True).returncode


class CtestMainTest(unittest.TestCase):
    def test_all_passed_exits_0(self):
        self.assertEqual(exit_code("""
            class T(unittest.TestCase):
                def test_a(self): pass
            """), 0)

    def test_a_skip_without_failures_exits_77(self):
        self.assertEqual(exit_code("""
            class T(unittest.TestCase):
                def test_a(self): pass
                @unittest.skip("tool missing")
                def test_b(self): pass
            """), 77)

    def test_a_failure_wins_over_a_skip(self):
        self.assertEqual(exit_code("""
            class T(unittest.TestCase):
                def test_a(self): self.fail("broken")
                @unittest.skip("tool missing")
                def test_b(self): pass
            """), 1)

    def test_no_test_run_fails(self):
        self.assertEqual(exit_code("x = 1\n"), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
