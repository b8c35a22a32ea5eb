// The main() of every test binary (ulysses_add_test links it instead of gtest_main).
//
// gtest exits 0 when tests are skipped, so ctest would report a binary whose test
// skipped as "Passed". This main exits ULYSSES_TEST_SKIP_RETURN_CODE (defined by
// tests/CMakeLists.txt, which also sets it as the ctest SKIP_RETURN_CODE) when at
// least one test skipped and none failed, so ctest shows the entry as "Skipped".
// A failure always wins (exit 1): a skip can never hide a failing test, which a
// SKIP_REGULAR_EXPRESSION on "[  SKIPPED ]" would (ctest marks a matching run
// skipped whatever its exit code). A run that selected no test at all (a
// --gtest_filter that matches nothing) fails instead of passing vacuously.
#include <cstdio>

#include "common/process/process_init.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  // A crash prints its stack; a lock-order cycle is printed, not fatal (process_init.h).
  ulysses::InitProcess(argv[0], ulysses::DeadlockReports::kReport);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (unit.test_to_run_count() == 0 && !GTEST_FLAG_GET(list_tests)) {
    std::fprintf(stderr, "no test selected (check --gtest_filter)\n");
    return 1;
  }
  if (unit.skipped_test_count() > 0) return ULYSSES_TEST_SKIP_RETURN_CODE;
  return 0;
}
