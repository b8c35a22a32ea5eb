// The rows of a markdown table in one of the repo's docs, for tests that hold a doc to the code.
#ifndef ULYSSES_TESTS_TESTING_DOC_TABLE_H_
#define ULYSSES_TESTS_TESTING_DOC_TABLE_H_

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ulysses::testing {

// $ULYSSES_SOURCE_DIR/<relative> (ctest sets the variable); "" when unset.
inline std::string SourcePath(const std::string& relative) {
  const char* dir = std::getenv("ULYSSES_SOURCE_DIR");
  return dir == nullptr ? "" : std::string(dir) + "/" + relative;
}

// The cells (trimmed) of each body row of the first table after the line that starts with
// `heading`, header and separator rows left out. Empty when the file or heading is missing.
inline std::vector<std::vector<std::string>> DocTableRows(const std::string& path,
                                                          const std::string& heading) {
  std::ifstream in(path);
  std::string line;
  bool after_heading = false;
  bool in_table = false;
  int row = 0;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    if (!after_heading) {
      after_heading = line.rfind(heading, 0) == 0;
      continue;
    }
    if (line.rfind("|", 0) != 0) {
      if (in_table) break;
      continue;
    }
    in_table = true;
    if (row++ < 2) continue;  // Header and |---|.
    absl::string_view body = line;
    absl::ConsumePrefix(&body, "|");
    absl::ConsumeSuffix(&body, "|");
    std::vector<std::string> cells;
    for (absl::string_view cell : absl::StrSplit(body, " | ")) {
      cells.emplace_back(absl::StripAsciiWhitespace(cell));
    }
    rows.push_back(std::move(cells));
  }
  return rows;
}

// (first cell without its backticks, second cell) of each row of that table: a settings
// table's name and default.
inline std::vector<std::pair<std::string, std::string>> DocTableNameAndDefault(
    const std::string& path, const std::string& heading) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::vector<std::string>& row : DocTableRows(path, heading)) {
    absl::string_view name = row[0];
    if (absl::ConsumePrefix(&name, "`")) absl::ConsumeSuffix(&name, "`");
    out.emplace_back(std::string(name), row.size() > 1 ? row[1] : "");
  }
  return out;
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_DOC_TABLE_H_
