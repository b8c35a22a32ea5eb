#include "coordinator/path_policy.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"

namespace ulysses::coordinator {
namespace {

namespace fs = std::filesystem;

std::string CheckpointDirPath() { return spec::fields::PathOf(&spec::CheckpointSpec::dir); }

constexpr absl::string_view kCoordinatorDirPrefix = "job-";

std::string Quoted(absl::string_view path) { return absl::StrCat("\"", path, "\""); }

absl::Status ConfineData(absl::string_view field, const std::string& value,
                         const PathRoots& roots) {
  if (value.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string resolved, ResolvePath(field, value));
  for (const std::string& root : roots.data_roots) {
    if (IsWithin(resolved, root)) return absl::OkStatus();
  }
  if (roots.data_roots.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", Quoted(value),
                     " is a file path, but this coordinator has no data roots (start it with "
                     "--data-root DIR, or use synthetic data)"));
  }
  std::string shown =
      resolved == value ? "" : absl::StrCat(" (resolves to ", Quoted(resolved), ")");
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", Quoted(value), shown, " is outside the coordinator's data roots [",
                   absl::StrJoin(roots.data_roots, ", "), "] (put the data under one of them)"));
}

}  // namespace

absl::Status CheckSpecPaths(const spec::JobSpec& spec, const PathRoots& roots) {
  RETURN_IF_ERROR(
      ConfineData(spec::fields::PathOf(&spec::DataSpec::train), spec.data.train, roots));
  RETURN_IF_ERROR(
      ConfineData(spec::fields::PathOf(&spec::DataSpec::validation), spec.data.validation, roots));
  RETURN_IF_ERROR(
      ConfineData(spec::fields::PathOf(&spec::ModelSpec::init_from), spec.model.init_from, roots));
  if (spec.checkpoint.dir.empty()) {
    if (!spec.checkpoint.adopt) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(spec::fields::PathOf(&spec::CheckpointSpec::adopt),
                     ": true without checkpoint.dir (a new job's own directory is always new: "
                     "name the directory to adopt in checkpoint.dir, or drop adopt)"));
  }
  const std::string& dir = spec.checkpoint.dir;
  ASSIGN_OR_RETURN(std::string resolved, ResolvePath(CheckpointDirPath(), dir));
  if (!IsWithin(resolved, roots.checkpoint_root) || resolved == roots.checkpoint_root) {
    return absl::InvalidArgumentError(
        absl::StrCat(CheckpointDirPath(), ": ", Quoted(dir),
                     resolved == dir ? "" : absl::StrCat(" (resolves to ", Quoted(resolved), ")"),
                     " is not a directory below the coordinator's checkpoint root ",
                     Quoted(roots.checkpoint_root),
                     " (leave it unset for <root>/<job id>, or name a directory below the root)"));
  }
  absl::string_view below = absl::string_view(resolved).substr(
      roots.checkpoint_root.size() + (roots.checkpoint_root == "/" ? 0 : 1));
  absl::string_view first = below.substr(0, below.find('/'));
  if (absl::StartsWith(first, kCoordinatorDirPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        CheckpointDirPath(), ": ", Quoted(dir), " uses \"", first,
        "\", a name the coordinator reserves for its per-job directories (pick a name that "
        "does not start with \"job-\", or leave checkpoint.dir unset)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobCheckpointDir(const spec::JobSpec& spec, absl::string_view job_id,
                                             const PathRoots& roots,
                                             absl::Span<const std::string> taken,
                                             absl::Span<const std::string> taken_by) {
  std::string dir;
  if (spec.checkpoint.dir.empty()) {
    dir = absl::StrCat(roots.checkpoint_root, roots.checkpoint_root == "/" ? "" : "/", job_id);
  } else {
    ASSIGN_OR_RETURN(dir, ResolvePath(CheckpointDirPath(), spec.checkpoint.dir));
  }
  for (size_t i = 0; i < taken.size(); ++i) {
    if (taken[i].empty() || !Overlaps(dir, taken[i])) continue;
    // Another tenant's job and directory are never named: the caller learns only that
    // the directory is taken.
    const bool named = i < taken_by.size() && !taken_by[i].empty();
    return absl::FailedPreconditionError(absl::StrCat(
        CheckpointDirPath(), ": ", Quoted(dir), " overlaps ",
        named ? absl::StrCat(Quoted(taken[i]), ", the checkpoint directory of ", taken_by[i])
              : std::string("the checkpoint directory of another job"),
        " (each job needs its own directory: its retention deletes old checkpoints there; pick "
        "another name or leave checkpoint.dir unset)"));
  }
  return dir;
}

absl::Status CheckCheckpointDirClaims(absl::string_view dir, absl::string_view tenant, bool adopt,
                                      absl::Span<const DirClaim> claims) {
  const std::string field = CheckpointDirPath();
  bool claimed = false;
  for (const DirClaim& claim : claims) {
    if (!Overlaps(dir, claim.path)) continue;
    claimed = true;
    if (claim.tenant != tenant) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": ", Quoted(dir),
          " overlaps a checkpoint directory another tenant's job was given (a directory stays "
          "its tenant's after the job is deleted: its checkpoints are still there; pick another "
          "name or leave checkpoint.dir unset)"));
    }
    if (!adopt) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": ", Quoted(dir), " overlaps ", Quoted(claim.path),
                       ", the checkpoint directory of your tenant's job ", claim.job_id,
                       " (its checkpoints may still be there: set ",
                       spec::fields::PathOf(&spec::CheckpointSpec::adopt),
                       ": true to resume from and prune them, or pick another name)"));
    }
  }
  if (claimed) return absl::OkStatus();
  std::error_code ec;
  const fs::path path{std::string(dir)};
  const fs::file_status st = fs::symlink_status(path, ec);
  if (ec || st.type() == fs::file_type::not_found) return absl::OkStatus();
  const bool empty_dir = st.type() == fs::file_type::directory && fs::is_empty(path, ec) && !ec;
  if (empty_dir) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": ", Quoted(dir),
      st.type() == fs::file_type::directory ? " is not empty" : " exists and is not a directory",
      ", and no job of your tenant was given it (a job starts in a new or empty directory: pick "
      "another name, or empty it)"));
}

int64_t HighestJobNumberUnder(const std::string& checkpoint_root) {
  int64_t highest = 0;
  std::error_code ec;
  for (fs::directory_iterator it(checkpoint_root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, kCoordinatorDirPrefix)) continue;
    int64_t n = 0;
    if (absl::SimpleAtoi(absl::string_view(name).substr(kCoordinatorDirPrefix.size()), &n) &&
        n > highest) {
      highest = n;
    }
  }
  return highest;
}

absl::Status CheckCommittedCheckpointPath(absl::string_view field, absl::string_view path,
                                          absl::string_view job_checkpoint_dir) {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", Quoted(path), " is not an absolute path (report the committed directory)"));
  }
  for (absl::string_view part : absl::StrSplit(path.substr(1), '/')) {
    if (part == "." || part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quoted(path), " has a \"", part,
                                                     "\" component (report the path as written)"));
    }
  }
  absl::string_view trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.remove_suffix(1);
  if (!IsWithin(trimmed, job_checkpoint_dir) || trimmed == job_checkpoint_dir) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", Quoted(path), " is not inside the job's checkpoint directory ",
        Quoted(job_checkpoint_dir), " (a rank commits only below its job's directory)"));
  }
  return absl::OkStatus();
}

}  // namespace ulysses::coordinator
