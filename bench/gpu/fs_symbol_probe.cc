// Diagnosis of the pip-PyTorch crash (issue 25, pytorch/pytorch#133437): libtorch_cpu.so of the
// PyTorch wheel exports its own statically linked copy of libstdc++'s std::filesystem. This
// program is linked against libtorch like the engine and makes the calls the engine used to
// make, then the ones it makes now:
//
//   fs_symbol_probe DIR
//
// 1. builds DIR/tree (nested directories, files, a symlink) and deletes it with
//    std::filesystem::remove_all; 2. lists and deletes a second tree with
//    std::filesystem::directory_iterator and RemoveTree (common/file_tree.h). Prints one JSON line
// per call ({"call": ..., "ok": ...}); a crash in call 1 is the bug. scripts/gpu/run_checks.sh
// (step `preload`) runs it as is, under LD_DEBUG=bindings (which library each std::filesystem
// symbol bound to) and with LD_PRELOAD of the system libstdc++ (which makes every such symbol bind
// there): a crash only without the preload confirms the cause. The one file allowed to call
// remove_all (scripts/lint.sh).
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <system_error>

#include "common/file_tree.h"

namespace {

void MakeTree(const std::filesystem::path& root) {
  std::filesystem::create_directories(root / "a" / "b" / "c");
  for (const char* f : {"top.bin", "a/mid.bin", "a/b/c/deep.bin"}) {
    std::ofstream(root / f) << std::string(4096, 'x');
  }
  std::error_code ec;
  std::filesystem::create_symlink("a/mid.bin", root / "link", ec);
}

void Report(const std::string& call, bool ok, const std::string& detail) {
  std::cout << "{\"call\": \"" << call << "\", \"ok\": " << (ok ? "true" : "false")
            << ", \"detail\": \"" << detail << "\"}" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fs_symbol_probe DIR\n";
    return 2;
  }
  // Touch libtorch so it is loaded (and its exported symbols are in the lookup scope).
  std::cout << "{\"call\": \"torch\", \"ok\": true, \"detail\": \"" << TORCH_VERSION
            << " sum=" << torch::ones({4}).sum().item<double>() << "\"}" << std::endl;
  const std::filesystem::path dir(argv[1]);
  MakeTree(dir / "old");
  std::error_code ec;
  const auto removed = std::filesystem::remove_all(dir / "old", ec);
  Report("std::filesystem::remove_all", !ec && removed > 0,
         ec ? ec.message() : std::to_string(removed) + " entries");
  MakeTree(dir / "new");
  int entries = 0;
  for (std::filesystem::directory_iterator it(dir / "new", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++entries;
  }
  Report("std::filesystem::directory_iterator", !ec, std::to_string(entries) + " entries");
  const absl::Status status = ulysses::RemoveTree((dir / "new").string());
  Report("ulysses::RemoveTree", status.ok(), std::string(status.message()));
  return 0;
}
