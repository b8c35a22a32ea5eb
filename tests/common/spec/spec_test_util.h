// Helpers shared by the spec tests: paths of the shipped examples and a
// field-by-field JobSpec comparison (along the field list, job_spec_fields.h).
#ifndef ULYSSES_TESTS_COMMON_SPEC_SPEC_TEST_UTIL_H_
#define ULYSSES_TESTS_COMMON_SPEC_SPEC_TEST_UTIL_H_

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_fields.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"

namespace ulysses::spec::testing {

inline std::string SourceDir() {
  const char* dir = std::getenv("ULYSSES_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// configs/jobs/<file>.
inline std::string ShippedSpec(const std::string& file) {
  return SourceDir() + "/configs/jobs/" + file;
}

// Every *.yaml under configs/jobs, sorted: read from the directory, so a new
// example is checked without anyone listing it here.
inline std::vector<std::string> ShippedSpecs() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(SourceDir() + "/configs/jobs")) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml") {
      paths.push_back(SourceDir() + "/configs/jobs/" + entry.path().filename().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

using ::ulysses::testing::ReadFile;

// Compares two sections element by element along the field list (job_spec_fields.h),
// naming each difference by its path.
template <class S>
class SpecComparer {
 public:
  SpecComparer(const S& a, const S& b, std::string path) : a_(a), b_(b), path_(std::move(path)) {}

  template <class T>
  void Field(const char* key, T S::*m, fields::Opt) {
    EXPECT_EQ(a_.*m, b_.*m) << Join(key);
  }
  void Constant(const char* key, std::string S::*m, const char*) {
    EXPECT_EQ(a_.*m, b_.*m) << Join(key);
  }
  void Pair(const char* key, double S::*first, double S::*second) {
    EXPECT_EQ(a_.*first, b_.*first) << Join(key) << "[0]";
    EXPECT_EQ(a_.*second, b_.*second) << Join(key) << "[1]";
  }
  void IntOrAuto(const char* key, int64_t S::*value, bool S::*is_auto) {
    EXPECT_EQ(a_.*value, b_.*value) << Join(key);
    EXPECT_EQ(a_.*is_auto, b_.*is_auto) << Join(key) << " (auto)";
  }
  void Labels(const char* key, std::map<std::string, std::string> S::*m) {
    EXPECT_EQ(a_.*m, b_.*m) << Join(key);
  }
  void Shape() {
    const ModelSpec &m = a_, &n = b_;
    for (const std::string& key : ShapeFieldKeys()) {
      EXPECT_TRUE(ShapeFieldEquals(m, n, key))
          << Join(key) << ": " << ShapeFieldText(m, key) << " != " << ShapeFieldText(n, key);
    }
    EXPECT_EQ(m.from_init, n.from_init) << path_ << " (keys left to init_from)";
  }
  template <class M, class F>
  void Section(const char* key, M S::*m, F list, fields::Opt) {
    Compare(a_.*m, b_.*m, Join(key), list);
  }
  template <class F>
  void Section(const char* key, fields::Self, F list, fields::Opt) {
    Compare(a_, b_, Join(key), list);
  }
  template <class T, class F>
  void List(const char* key, std::vector<T> S::*m, F list, fields::ListOpt) {
    const std::vector<T>&a = a_.*m, &b = b_.*m;
    ASSERT_EQ(a.size(), b.size()) << Join(key);
    for (size_t i = 0; i < a.size(); ++i) {
      Compare(a[i], b[i], absl::StrCat(Join(key), "[", i, "]"), list);
    }
  }

  template <class T, class F>
  static void Compare(const T& a, const T& b, const std::string& path, F list) {
    SpecComparer<T> child(a, b, path);
    list(child);
  }
  template <class T, class F>
  static void Compare(const std::optional<T>& a, const std::optional<T>& b, const std::string& path,
                      F list) {
    ASSERT_EQ(a.has_value(), b.has_value()) << path;
    if (a) {
      Compare(*a, *b, path, list);
    }
  }

 private:
  std::string Join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const S& a_;
  const S& b_;
  std::string path_;
};

// Every field of `a` equals the one of `b` (reports each difference by its path).
inline void ExpectSpecEq(const JobSpec& a, const JobSpec& b) {
  SpecComparer<JobSpec>::Compare(a, b, "", fields::DocumentFields{});
}

}  // namespace ulysses::spec::testing

#endif  // ULYSSES_TESTS_COMMON_SPEC_SPEC_TEST_UTIL_H_
