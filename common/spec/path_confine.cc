#include "common/spec/path_confine.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ulysses::spec {
namespace {

std::string Quoted(absl::string_view path) { return absl::StrCat("\"", absl::CEscape(path), "\""); }

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

absl::Status Refuse(absl::string_view field, absl::string_view path, absl::string_view problem,
                    absl::string_view fix) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", Quoted(path), " ", problem, " (", fix, ")"));
}

}  // namespace

absl::Status CheckPathText(absl::string_view field, absl::string_view path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": empty path (give an absolute path)"));
  }
  for (size_t i = 0; i < path.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (c < 0x20 || c == 0x7f) {
      return Refuse(field, path,
                    absl::StrCat("has a control character (byte ", static_cast<int>(c),
                                 " at offset ", i, ")"),
                    "write a plain path: no NUL, newline, tab, escape or other control characters");
    }
  }
  if (IsSpace(path.front()) || IsSpace(path.back())) {
    return Refuse(field, path, "starts or ends with whitespace",
                  "remove the leading and trailing spaces");
  }
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] == '#' && IsSpace(path[i - 1])) {
      return Refuse(field, path, "has a '#' after a space, which YAML reads as a comment",
                    "rename the directory without \" #\"");
    }
  }
  if (path.front() != '/') {
    return Refuse(field, path, "is relative",
                  "give an absolute path; the coordinator and workers do not share a working "
                  "directory");
  }
  std::vector<absl::string_view> parts = absl::StrSplit(path.substr(1), '/');
  if (!parts.empty() && parts.back().empty()) parts.pop_back();  // "/a/b/" -> "/a/b".
  for (absl::string_view part : parts) {
    if (part.empty() || part == "." || part == "..") {
      return Refuse(field, path,
                    absl::StrCat("has a \"", part.empty() ? "//" : part, "\" component"),
                    "write the path without \".\", \"..\" or \"//\"");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolvePath(absl::string_view field, absl::string_view path) {
  if (absl::Status text = CheckPathText(field, path); !text.ok()) return text;
  std::vector<absl::string_view> parts = absl::StrSplit(path.substr(1), '/');
  if (!parts.empty() && parts.back().empty()) parts.pop_back();
  // Resolve component by component from the root: every component that exists is
  // resolved; the first that does not ends the walk (nothing below it exists either).
  std::string base = "/";
  size_t existing = 0;
  for (; existing < parts.size(); ++existing) {
    const std::string prefix =
        absl::StrCat("/", absl::StrJoin(parts.begin(), parts.begin() + existing + 1, "/"));
    std::unique_ptr<char, decltype(&free)> resolved(realpath(prefix.c_str(), nullptr), &free);
    if (resolved) {
      base = resolved.get();
      continue;
    }
    const int resolve_errno = errno;
    struct stat st;
    const bool present = lstat(prefix.c_str(), &st) == 0;
    if (!present && (errno == ENOENT || errno == ENOTDIR)) break;
    return Refuse(
        field, path,
        absl::StrCat("has a component ", Quoted(prefix), " that cannot be resolved (",
                     present && S_ISLNK(st.st_mode) ? "a symbolic link whose target is missing or "
                                                      "loops: "
                                                    : "",
                     std::strerror(resolve_errno), ")"),
        "point the link at an existing directory, or name the real path");
  }
  std::string out = base;
  for (size_t i = existing; i < parts.size(); ++i) {
    if (out.back() != '/') out += '/';
    absl::StrAppend(&out, parts[i]);
  }
  return out;
}

bool IsWithin(absl::string_view path, absl::string_view root) {
  if (root == "/") return absl::StartsWith(path, "/");
  if (!absl::StartsWith(path, root)) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

bool Overlaps(absl::string_view a, absl::string_view b) { return IsWithin(a, b) || IsWithin(b, a); }

}  // namespace ulysses::spec
