// A model directory that cannot be read says so: permission denied on the
// directory or on a file is reported as permission denied (it used to read
// "config file not found"), and a directory where a file should be is named
// as a directory (it used to read "weights file not found").
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "engine/model_dir.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/tiny_model.h"

namespace drt {
namespace {

using Catch::Contains;
using testing::MakeTinyModel;
using testing::TempDir;
using testing::TinyModel;
using testing::WriteModelDir;

constexpr uid_t kNobody = 65534;

struct Outcome {
  bool ran = false;  // false: privileges could not be dropped
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;
};

// Root reads files whatever their mode, so as root the load runs in a child
// process as the unprivileged user 'nobody' (65534); otherwise in-process.
Outcome LoadAsUnprivileged(const std::string& dir) {
  if (geteuid() != 0) {
    const absl::Status status = LoadModelDir(dir).status();
    return {true, status.code(), std::string(status.message())};
  }
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    std::string report = "x";  // privileges not dropped
    if (setgroups(0, nullptr) == 0 && setgid(kNobody) == 0 && setuid(kNobody) == 0) {
      const absl::Status status = LoadModelDir(dir).status();
      report = std::to_string(static_cast<int>(status.code())) + "\n" + std::string(status.message());
    }
    const ssize_t written = write(fds[1], report.data(), report.size());
    _exit(written == static_cast<ssize_t>(report.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string report;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) > 0;) report.append(buffer, n);
  close(fds[0]);
  int wait_status = 0;
  waitpid(pid, &wait_status, 0);
  Outcome outcome;
  const size_t newline = report.find('\n');
  if (newline == std::string::npos) return outcome;
  outcome.ran = true;
  outcome.code = static_cast<absl::StatusCode>(std::stoi(report.substr(0, newline)));
  outcome.message = report.substr(newline + 1);
  return outcome;
}

// ctest reports a test that printed this as skipped (tests/CMakeLists.txt).
void SkipNoUnprivilegedUser() { WARN("cannot run here, skipping: cannot switch to uid 65534"); }

// A readable tiny model in <temp>/model; the temp dir is opened to others so
// that 'nobody' can reach it. Modes are restored on exit so that a non-root
// run can clean up.
struct ModelTree {
  TempDir root;
  std::string dir = root.File("model");
  ModelTree() {
    std::filesystem::create_directory(dir);
    chmod(root.path().c_str(), 0755);
    chmod(dir.c_str(), 0755);
    TinyModel model = MakeTinyModel();
    WriteModelDir(dir, model.config, model.weights);
    chmod((dir + "/config.json").c_str(), 0644);
    chmod((dir + "/model.safetensors").c_str(), 0644);
  }
  ~ModelTree() {
    chmod(dir.c_str(), 0755);
    chmod((dir + "/config.json").c_str(), 0644);
    chmod((dir + "/model.safetensors").c_str(), 0644);
  }
};

TEST_CASE("model dir: the tree is loadable as the unprivileged user", "[loader][model_dir]") {
  // The baseline of the cases below: with normal modes the load succeeds.
  ModelTree tree;
  const Outcome outcome = LoadAsUnprivileged(tree.dir);
  if (!outcome.ran) return SkipNoUnprivilegedUser();
  INFO(outcome.message);
  CHECK(outcome.code == absl::StatusCode::kOk);
}

TEST_CASE("model dir: permission denied is reported as such", "[loader][model_dir]") {
  ModelTree tree;
  SECTION("on the directory") {
    chmod(tree.dir.c_str(), 0000);
    const Outcome outcome = LoadAsUnprivileged(tree.dir);
    if (!outcome.ran) return SkipNoUnprivilegedUser();
    INFO(outcome.message);
    CHECK(outcome.code == absl::StatusCode::kPermissionDenied);
    CHECK_THAT(outcome.message, Contains("permission denied"));
    CHECK_THAT(outcome.message, Contains(tree.dir));
    CHECK_THAT(outcome.message, !Contains("not found"));
  }
  SECTION("on the directory, listing allowed but not entering") {
    chmod(tree.dir.c_str(), 0644);
    const Outcome outcome = LoadAsUnprivileged(tree.dir);
    if (!outcome.ran) return SkipNoUnprivilegedUser();
    INFO(outcome.message);
    CHECK(outcome.code == absl::StatusCode::kPermissionDenied);
    CHECK_THAT(outcome.message, Contains("permission denied"));
    CHECK_THAT(outcome.message, !Contains("not found"));
  }
  SECTION("on config.json") {
    chmod((tree.dir + "/config.json").c_str(), 0000);
    const Outcome outcome = LoadAsUnprivileged(tree.dir);
    if (!outcome.ran) return SkipNoUnprivilegedUser();
    INFO(outcome.message);
    CHECK(outcome.code == absl::StatusCode::kPermissionDenied);
    CHECK_THAT(outcome.message, Contains(tree.dir + "/config.json"));
    CHECK_THAT(outcome.message, Contains("permission denied"));
  }
  SECTION("on model.safetensors") {
    chmod((tree.dir + "/model.safetensors").c_str(), 0000);
    const Outcome outcome = LoadAsUnprivileged(tree.dir);
    if (!outcome.ran) return SkipNoUnprivilegedUser();
    INFO(outcome.message);
    CHECK(outcome.code == absl::StatusCode::kPermissionDenied);
    CHECK_THAT(outcome.message, Contains(tree.dir + "/model.safetensors"));
    CHECK_THAT(outcome.message, Contains("permission denied"));
  }
}

TEST_CASE("model dir: a directory where a file belongs is named as a directory",
          "[loader][model_dir]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  WriteModelDir(dir.path(), model.config, model.weights);
  SECTION("model.safetensors") {
    std::filesystem::remove(dir.File("model.safetensors"));
    std::filesystem::create_directory(dir.File("model.safetensors"));
    const absl::Status status = LoadModelDir(dir.path()).status();
    INFO(status.message());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()),
               Contains(dir.File("model.safetensors") + " is a directory, not the weights file"));
  }
  SECTION("config.json") {
    std::filesystem::remove(dir.File("config.json"));
    std::filesystem::create_directory(dir.File("config.json"));
    const absl::Status status = LoadModelDir(dir.path()).status();
    INFO(status.message());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()),
               Contains(dir.File("config.json") + " is a directory, not the config file"));
  }
}

}  // namespace
}  // namespace drt
