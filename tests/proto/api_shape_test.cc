// Checks OUR evolution rules of the ulysses.v1 API (stated at the top of
// proto/ulysses/v1/types.proto and in docs/API.md) on the compiled descriptors:
//   - every .proto under proto/ulysses/v1 is compiled in, proto3, package ulysses.v1;
//   - every message reserves 100..199; every enum starts with <NAME>_UNSPECIFIED = 0;
//   - field numbers, enum values and RPCs are never reused, retyped or renamed: the
//     API as released is recorded in tests/proto/api_v1.lock; an element that left
//     the API must have its number and name `reserved`, and a new element must be
//     added to the lock (the failure prints its line), so every API change shows up
//     in review as a lock diff.
// To rewrite the lock after a deliberate change (v1 is not yet released):
//   ULYSSES_WRITE_API_LOCK=1 build/bin/proto_api_shape_test
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "ulysses/v1/job_service.grpc.pb.h"
#include "ulysses/v1/types.pb.h"
#include "ulysses/v1/worker_service.grpc.pb.h"

namespace ulysses::v1 {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;

std::string SourceDir() {
  const char* dir = std::getenv("ULYSSES_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}
std::string LockPath() { return SourceDir() + "/tests/proto/api_v1.lock"; }

// The files of the API, from the source tree: a new .proto is checked without
// anyone listing it here.
std::vector<const FileDescriptor*> ApiFiles() {
  // Static-library objects are linked only when used: touch one message per file.
  (void)Job::descriptor();
  (void)SubmitJobRequest::descriptor();
  (void)WorkerMessage::descriptor();
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(SourceDir() + "/proto/ulysses/v1")) {
    if (entry.path().extension() == ".proto") {
      names.push_back("ulysses/v1/" + entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  std::vector<const FileDescriptor*> files;
  for (const std::string& name : names) {
    const FileDescriptor* f = DescriptorPool::generated_pool()->FindFileByName(name);
    EXPECT_NE(f, nullptr) << name << " is not compiled into ulysses_proto (or this test does "
                          << "not reference a message of it: see ApiFiles)";
    if (f != nullptr) files.push_back(f);
  }
  return files;
}

std::string UpperSnake(const std::string& camel) {
  std::string out;
  for (size_t i = 0; i < camel.size(); ++i) {
    const char c = camel[i];
    if (i > 0 && c >= 'A' && c <= 'Z') out += '_';
    out += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  }
  return out;
}

std::string TypeOf(const FieldDescriptor* f) {
  std::string type;
  if (f->message_type() != nullptr) {
    type = f->message_type()->full_name();
  } else if (f->enum_type() != nullptr) {
    type = f->enum_type()->full_name();
  } else {
    type = f->type_name();
  }
  return f->is_repeated() ? "repeated " + type : type;
}

// The API as lock lines, keyed by what may never change meaning:
//   "field <message> <number>" -> "<name> <type>"
//   "enum <enum> <number>"     -> "<name>"
//   "rpc <service>.<method>"   -> "<input> <output> <unary|client_stream|server_stream|bidi>"
using Api = std::map<std::string, std::string>;

void AddEnum(const EnumDescriptor* e, Api* api) {
  for (int i = 0; i < e->value_count(); ++i) {
    (*api)[absl::StrCat("enum ", e->full_name(), " ", e->value(i)->number())] = e->value(i)->name();
  }
}

void AddMessage(const Descriptor* d, Api* api) {
  if (d->options().map_entry()) return;  // Described by the map field's type.
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    (*api)[absl::StrCat("field ", d->full_name(), " ", f->number())] =
        absl::StrCat(f->name(), " ", TypeOf(f));
  }
  for (int i = 0; i < d->nested_type_count(); ++i) AddMessage(d->nested_type(i), api);
  for (int i = 0; i < d->enum_type_count(); ++i) AddEnum(d->enum_type(i), api);
}

Api CurrentApi(const std::vector<const FileDescriptor*>& files) {
  Api api;
  for (const FileDescriptor* f : files) {
    for (int i = 0; i < f->message_type_count(); ++i) AddMessage(f->message_type(i), &api);
    for (int i = 0; i < f->enum_type_count(); ++i) AddEnum(f->enum_type(i), &api);
    for (int s = 0; s < f->service_count(); ++s) {
      for (int m = 0; m < f->service(s)->method_count(); ++m) {
        const auto* method = f->service(s)->method(m);
        const char* kind = method->client_streaming()
                               ? (method->server_streaming() ? "bidi" : "client_stream")
                               : (method->server_streaming() ? "server_stream" : "unary");
        api[absl::StrCat("rpc ", method->full_name())] = absl::StrCat(
            method->input_type()->full_name(), " ", method->output_type()->full_name(), " ", kind);
      }
    }
  }
  return api;
}

std::string LockLine(const std::string& key, const std::string& value) { return key + " " + value; }

// Lock lines: "<kind> <owner> <number> <rest...>" or "rpc <method> <rest...>".
Api ReadLock(const std::string& path) {
  Api api;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    const size_t key_words = words[0] == "rpc" ? 2 : 3;
    if (words.size() <= key_words) {
      ADD_FAILURE() << path << ": malformed line: " << line;
      continue;
    }
    const std::string key =
        absl::StrJoin(words.begin(), words.begin() + static_cast<ptrdiff_t>(key_words), " ");
    api[key] = absl::StrJoin(words.begin() + static_cast<ptrdiff_t>(key_words), words.end(), " ");
  }
  return api;
}

void WriteLock(const std::string& path, const Api& api) {
  std::ofstream out(path, std::ios::trunc);
  out << "# The ulysses.v1 API as released: checked by tests/proto/api_shape_test.cc.\n"
      << "# Never edit a line's number or meaning; see docs/API.md (Evolution rules).\n";
  for (const auto& [key, value] : api) out << LockLine(key, value) << "\n";
}

bool Reserved(const Descriptor* d, int number, const std::string& name) {
  return d->IsReservedNumber(number) && d->IsReservedName(name);
}
bool Reserved(const EnumDescriptor* e, int number, const std::string& name) {
  return e->IsReservedNumber(number) && e->IsReservedName(name);
}

// Why a locked element that is no longer in the API is not properly retired ("" if it is).
std::string RetirementProblem(const std::string& key, const std::string& value) {
  std::vector<std::string> words = absl::StrSplit(key, ' ');
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  if (words[0] == "rpc") {
    return "an RPC was removed (v1 keeps its methods; breaking changes go to ulysses.v2)";
  }
  const int number = std::stoi(words[2]);
  const std::string name = std::vector<std::string>(absl::StrSplit(value, ' '))[0];
  if (words[0] == "field") {
    const Descriptor* d = pool->FindMessageTypeByName(words[1]);
    if (d == nullptr) return "its message was removed (v1 keeps its messages)";
    if (!Reserved(d, number, name)) {
      return absl::StrCat("removed without `reserved ", number, "; reserved \"", name, "\";` in ",
                          words[1]);
    }
    return "";
  }
  const EnumDescriptor* e = pool->FindEnumTypeByName(words[1]);
  if (e == nullptr) return "its enum was removed (v1 keeps its enums)";
  if (!Reserved(e, number, name)) {
    return absl::StrCat("removed without `reserved ", number, "; reserved \"", name, "\";` in ",
                        words[1]);
  }
  return "";
}

void CheckEnum(const EnumDescriptor* e) {
  ASSERT_GT(e->value_count(), 0);
  EXPECT_EQ(e->value(0)->number(), 0) << e->full_name();
  EXPECT_EQ(e->value(0)->name(), UpperSnake(e->name()) + "_UNSPECIFIED") << e->full_name();
}

void CheckMessage(const Descriptor* d) {
  if (d->options().map_entry()) return;
  bool reserved = false;
  for (int i = 0; i < d->reserved_range_count(); ++i) {
    const auto* r = d->reserved_range(i);
    if (r->start <= 100 && r->end >= 200) reserved = true;  // end is exclusive.
  }
  EXPECT_TRUE(reserved) << d->full_name() << " must reserve 100 to 199";
  for (int i = 0; i < d->nested_type_count(); ++i) CheckMessage(d->nested_type(i));
  for (int i = 0; i < d->enum_type_count(); ++i) CheckEnum(d->enum_type(i));
}

TEST(ApiShapeTest, EveryFileIsProto3InPackageV1) {
  const auto files = ApiFiles();
  EXPECT_GE(files.size(), 3u);
  for (const FileDescriptor* f : files) {
    EXPECT_EQ(f->package(), "ulysses.v1") << f->name();
    // proto3: no `required`, no default values, open enums (the "zero means unset" rule).
    EXPECT_EQ(f->syntax(), FileDescriptor::SYNTAX_PROTO3) << f->name();
  }
}

TEST(ApiShapeTest, MessagesReserveTheCoreRangeAndEnumsStartUnspecified) {
  for (const FileDescriptor* f : ApiFiles()) {
    for (int i = 0; i < f->message_type_count(); ++i) CheckMessage(f->message_type(i));
    for (int i = 0; i < f->enum_type_count(); ++i) CheckEnum(f->enum_type(i));
  }
}

TEST(ApiShapeTest, NumbersAreNeverReusedRetypedOrRenamed) {
  const Api now = CurrentApi(ApiFiles());
  ASSERT_GT(now.size(), 50u);
  const Api lock = ReadLock(LockPath());
  if (std::getenv("ULYSSES_WRITE_API_LOCK") != nullptr) {
    // The current API plus the properly retired elements (their history stays).
    Api record = now;
    for (const auto& [key, was] : lock) {
      if (!now.count(key) && RetirementProblem(key, was).empty()) record[key] = was;
    }
    WriteLock(LockPath(), record);
    GTEST_SKIP() << "wrote " << LockPath() << " (" << record.size() << " lines): review the diff";
  }
  ASSERT_FALSE(lock.empty()) << LockPath() << " is missing or empty";
  for (const auto& [key, was] : lock) {
    auto it = now.find(key);
    if (it == now.end()) {
      const std::string problem = RetirementProblem(key, was);
      EXPECT_EQ(problem, "") << LockLine(key, was) << ": " << problem;
    } else {
      EXPECT_EQ(it->second, was) << key << " was `" << was << "` and is now `" << it->second
                                 << "`: numbers are never reused, retyped or renamed (add a new "
                                 << "number and reserve the old one)";
    }
  }
  for (const auto& [key, value] : now) {
    EXPECT_TRUE(lock.count(key)) << "new API element; after review, add this line to " << LockPath()
                                 << ":\n"
                                 << LockLine(key, value);
  }
}

}  // namespace
}  // namespace ulysses::v1
