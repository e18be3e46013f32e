// The model's fingerprint taken on a thread of its own after load
// (server/background_fingerprint.h), as drt-server does with
// --session_files_dir and no --state_dir: the first state call then finds
// it computed and reads nothing, and it is the value one pass over the
// files gives; a weights file changed since load gives the error every
// state call will get.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

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

}  // namespace
}  // namespace drt::server
