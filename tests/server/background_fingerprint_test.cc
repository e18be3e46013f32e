// The model's fingerprint taken on a thread of its own after load
// (server/background_fingerprint.h), as drt-server does with
// --session_files_dir and no --state_dir: the first state call then finds
// it computed and reads nothing, and it is the value one pass over the
// files gives; a weights file changed since load gives the error every
// state call will get.
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "engine/file_as_loaded.h"
#include "engine/model_dir.h"
#include "engine/model_fingerprint.h"
#include "server/background_fingerprint.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/tiny_model.h"

namespace drt::server {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("the background fingerprint is the one the files give, and the first use reads nothing",
          "[server][fingerprint]") {
  drt::testing::TempDir dir;
  const drt::testing::TinyModel model = drt::testing::MakeTinyModel();
  drt::testing::WriteModelDir(dir.path(), model.config, model.weights);
  auto loaded = LoadModelDir(dir.path());
  REQUIRE(loaded.ok());
  REQUIRE(loaded->config.fingerprint != nullptr);
  REQUIRE_FALSE(loaded->config.fingerprint->computed());  // the load took none
  {
    BackgroundFingerprint background(loaded->config.fingerprint);
    background.Wait();
  }
  // Computed without any caller asking for it.
  CHECK(loaded->config.fingerprint->computed());
  // Truncating the file now changes nothing: the value was taken before
  // (the first use after load would refuse a file changed since load).
  std::filesystem::resize_file(dir.File("model.safetensors"), 4);
  // The eager computation over the files as written (before the truncation).
  drt::testing::TempDir again;
  drt::testing::WriteModelDir(again.path(), model.config, model.weights);
  auto eager = ComputeModelFingerprint(again.File("config.json"), again.File("model.safetensors"));
  REQUIRE(eager.ok());
  auto value = loaded->config.model_fingerprint();
  INFO(value.status().message());
  REQUIRE(value.ok());
  CHECK(*value == *eager);
}

TEST_CASE("a weights file changed before the background fingerprint gives every use its error",
          "[server][fingerprint]") {
  drt::testing::TempDir dir;
  const drt::testing::TinyModel model = drt::testing::MakeTinyModel();
  drt::testing::WriteModelDir(dir.path(), model.config, model.weights);
  auto loaded = LoadModelDir(dir.path());
  REQUIRE(loaded.ok());
  // Past the file system's timestamp tick (see session_state_test.cc).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::filesystem::resize_file(dir.File("model.safetensors"), 4);
  BackgroundFingerprint background(loaded->config.fingerprint);
  background.Wait();
  CHECK(loaded->config.fingerprint->computed());
  auto value = loaded->config.model_fingerprint();
  CHECK(value.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(value.status().message()), Contains("weights file changed since load"));
}

TEST_CASE("a fingerprint known already or absent starts no work", "[server][fingerprint]") {
  auto known = std::make_shared<const ModelFingerprint>(0x1234u);
  BackgroundFingerprint a(known);
  a.Wait();
  CHECK(*known->value() == 0x1234u);
  BackgroundFingerprint b(nullptr);
  b.Wait();
}

TEST_CASE("a cancelled fingerprint read records nothing, and the next use computes it",
          "[server][fingerprint]") {
  drt::testing::TempDir dir;
  const drt::testing::TinyModel model = drt::testing::MakeTinyModel();
  drt::testing::WriteModelDir(dir.path(), model.config, model.weights);
  auto loaded = LoadModelDir(dir.path());
  REQUIRE(loaded.ok());
  const ModelFingerprint& fingerprint = *loaded->config.fingerprint;
  const std::atomic<bool> cancelled{true};
  auto stopped = fingerprint.ValueUnlessCancelled(cancelled);
  CHECK(stopped.status().code() == absl::StatusCode::kCancelled);
  CHECK_FALSE(fingerprint.computed());
  // The next use reads the file (the descriptor was kept) and gets the
  // value one pass over the files gives, not the cancellation.
  auto eager = ComputeModelFingerprint(dir.File("config.json"), dir.File("model.safetensors"));
  REQUIRE(eager.ok());
  auto value = fingerprint.value();
  INFO(value.status().message());
  REQUIRE(value.ok());
  CHECK(*value == *eager);
  CHECK(fingerprint.computed());
  // Once computed, a cancel flag changes nothing.
  auto again = fingerprint.ValueUnlessCancelled(cancelled);
  REQUIRE(again.ok());
  CHECK(*again == *eager);
}

TEST_CASE("destroying the background fingerprint stops its read instead of waiting for it",
          "[server][fingerprint]") {
  // A 4 GiB weights file (sparse: it takes no disk), whose read takes
  // seconds: the destructor, called right after the start, returns with
  // the fingerprint not computed. (It used to wait for the whole read,
  // which then left it computed.)
  drt::testing::TempDir dir;
  const std::string path = dir.path() + "/big.safetensors";
  { std::ofstream(path) << "x"; }
  std::filesystem::resize_file(path, 4ull << 30);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  auto fingerprint =
      std::make_shared<const ModelFingerprint>(0u, std::make_unique<FileAsLoaded>(path, fd, st));
  const auto started = std::chrono::steady_clock::now();
  { BackgroundFingerprint background(fingerprint); }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO("the destructor returned after " << seconds << " s");
  CHECK_FALSE(fingerprint->computed());
}

}  // namespace
}  // namespace drt::server
