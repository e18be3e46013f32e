// Model loader: config.json parsing and validation, the safetensors reader,
// weight loading against the config, and the model directory.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model_config.h"
#include "engine/generation_defaults.h"
#include "engine/model_dir.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/test_util/safetensors_writer.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/tiny_model.h"
#include "tests/test_util/tiny_model_dir.h"
#include "tests/test_util/build_paths.h"

namespace drt {
namespace {

using Catch::Contains;
using nlohmann::json;
using testing::EncodeSafetensors;
using testing::LoadTinyDirStatus;
using testing::MakeTinyModel;
using testing::SafetensorsWriter;
using testing::TempDir;
using testing::TinyConfigJson;
using testing::TinyModel;
using testing::WriteFile;
using testing::WriteModelDir;

// Copies of the reference repository's configs (config/DRT/config_63.json and
// config/DRT-unittest/config_res.json).
std::string ReferenceConfigDir() {
  return std::string(drt::testing::SourceDir()) + "/tests/fixtures/reference_configs";
}

absl::Status ConfigStatus(const json& config) {
  return ParseModelConfig(config.dump(), "dir/config.json").status();
}

json TinyConfigWith(const std::string& key, const json& value) {
  json config = TinyConfigJson();
  config[key] = value;
  return config;
}

json TinyConfigWithout(const std::string& key) {
  json config = TinyConfigJson();
  config.erase(key);
  return config;
}

// Writes a safetensors file from a (possibly broken) header and data section.
absl::Status OpenStatus(const TempDir& dir, const std::string& header, const std::string& data) {
  const std::string path = dir.File("model.safetensors");
  WriteFile(path, EncodeSafetensors(header, data));
  return SafetensorsFile::Open(path).status();
}

// A one-tensor header: "w", F32 [2, 2], bytes [0, 16).
json OneTensorHeader() {
  return {{"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}}};
}

// ---------------------------------------------------------------- config

TEST_CASE("config: reference configs parse", "[loader][config]") {
  absl::StatusOr<ModelConfig> paper =
      LoadModelConfig(ReferenceConfigDir() + "/drt-config_63.json");
  REQUIRE(paper.ok());
  CHECK(paper->vocab_size == 50265);
  CHECK(paper->hidden_size == 768);
  CHECK(paper->num_attention_heads == 12);
  CHECK(paper->num_key_value_heads == 12);
  CHECK(paper->head_dim() == 64);
  CHECK(paper->intermediate_size == 2048);
  CHECK(paper->decoder_layers == std::vector<int64_t>{6, 6});
  CHECK(paper->num_lower_layers() == 6);
  CHECK(paper->num_groups() == 1);
  CHECK(paper->num_upper_layers() == 6);
  CHECK(paper->encoder_layers == 2);
  CHECK(paper->enc_chunk_size == 63);
  CHECK(paper->chunk_positions() == 64);
  CHECK(paper->chunk_topk == 8);
  CHECK(paper->slide_window == 512);
  CHECK(paper->chunk_id == 50264);
  CHECK(paper->pad_id == 50257);
  CHECK(paper->rms_norm_eps == 1e-5);
  CHECK(paper->rope_theta == 10000.0);
  CHECK(paper->tie_word_embeddings);

  // The unittest config turns flash attention off, and with it the reference
  // drops ALiBi and the window: refused as unservable, the rest parses.
  const std::string unittest_path = ReferenceConfigDir() + "/drt-config_unittest.json";
  absl::StatusOr<ModelConfig> refused = LoadModelConfig(unittest_path);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(refused.status().message()), Contains("_flash_attn_2_enabled"));
  std::ifstream in(unittest_path);
  json unittest = json::parse(in);
  unittest["_flash_attn_2_enabled"] = true;
  absl::StatusOr<ModelConfig> tiny = ParseModelConfig(unittest.dump(), unittest_path);
  REQUIRE(tiny.ok());
  CHECK(tiny->num_key_value_heads == 1);
  CHECK(tiny->decoder_layers == std::vector<int64_t>{1, 1, 1});
  CHECK(tiny->num_groups() == 2);
  CHECK(tiny->num_upper_layers() == 2);
}

TEST_CASE("config: optional keys take their defaults", "[loader][config]") {
  json config = TinyConfigJson();
  for (const char* key : {"num_key_value_heads", "rms_norm_eps", "rope_theta",
                          "tie_word_embeddings", "hidden_act", "attention_bias"}) {
    config.erase(key);
  }
  config["rope_scaling"] = nullptr;  // unrelated keys are ignored
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(config.dump(), "config.json");
  REQUIRE(parsed.ok());
  CHECK(parsed->num_key_value_heads == parsed->num_attention_heads);
  CHECK(parsed->rms_norm_eps == 1e-5);
  CHECK(parsed->rope_theta == 10000.0);
  CHECK(parsed->tie_word_embeddings);

  SECTION("null counts as absent") {
    config["num_key_value_heads"] = nullptr;
    absl::StatusOr<ModelConfig> with_null = ParseModelConfig(config.dump(), "config.json");
    REQUIRE(with_null.ok());
    CHECK(with_null->num_key_value_heads == 2);
  }
}

TEST_CASE("config: missing file", "[loader][config]") {
  TempDir dir;
  absl::Status status = LoadModelConfig(dir.File("config.json")).status();
  CHECK(status.code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(status.message()), Contains(dir.File("config.json")));
}

TEST_CASE("config: malformed JSON names the file", "[loader][config]") {
  absl::Status status = ParseModelConfig("{\"vocab_size\": 11,", "dir/config.json").status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("dir/config.json"));
  REQUIRE_THAT(std::string(status.message()), Contains("malformed JSON"));
}

TEST_CASE("config: top level must be an object", "[loader][config]") {
  absl::Status status = ParseModelConfig("[1, 2]", "dir/config.json").status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("must be a JSON object"));
}

TEST_CASE("config: missing required key", "[loader][config]") {
  const std::string key = GENERATE(
      "vocab_size", "hidden_size", "num_attention_heads", "intermediate_size", "decoder_layers",
      "encoder_layers", "enc_chunk_size", "chunk_topk", "slide_window", "chunk_id", "pad_id");
  absl::Status status = ConfigStatus(TinyConfigWithout(key));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("dir/config.json"));
  REQUIRE_THAT(std::string(status.message()), Contains("'" + key + "' is missing"));
}

TEST_CASE("config: hidden_size not divisible by heads", "[loader][config]") {
  json config = TinyConfigWith("num_attention_heads", 3);
  config["num_key_value_heads"] = 3;
  absl::Status status = ConfigStatus(config);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("dir/config.json"));
  REQUIRE_THAT(std::string(status.message()),
               Contains("'hidden_size' (8) is not divisible by num_attention_heads (3)"));
}

TEST_CASE("config: heads not divisible by key/value heads", "[loader][config]") {
  json config = TinyConfigWith("num_attention_heads", 4);
  config["num_key_value_heads"] = 3;
  absl::Status status = ConfigStatus(config);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()),
               Contains("'num_attention_heads' (4) is not divisible by num_key_value_heads (3)"));
}

TEST_CASE("config: non-positive sizes", "[loader][config]") {
  const std::string key =
      GENERATE("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "enc_chunk_size", "chunk_topk", "slide_window");
  const int value = GENERATE(0, -1);
  absl::Status status = ConfigStatus(TinyConfigWith(key, value));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("dir/config.json"));
  REQUIRE_THAT(std::string(status.message()), Contains("'" + key + "' must be positive"));
}

TEST_CASE("config: enc_chunk_size below 1", "[loader][config]") {
  absl::Status status = ConfigStatus(TinyConfigWith("enc_chunk_size", 0));
  REQUIRE_THAT(std::string(status.message()), Contains("'enc_chunk_size' must be positive, got 0"));
}

TEST_CASE("config: sizes too large for the engine", "[loader][config]") {
  absl::Status status = ConfigStatus(TinyConfigWith("hidden_size", int64_t{1} << 40));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("'hidden_size' is too large"));

  status = ConfigStatus(TinyConfigWith("vocab_size", std::numeric_limits<uint64_t>::max()));
  REQUIRE_THAT(std::string(status.message()), Contains("'vocab_size' is too large"));
}

TEST_CASE("config: decoder_layers needs at least one group", "[loader][config]") {
  const json layers = GENERATE(json::array(), json::array({4}));
  absl::Status status = ConfigStatus(TinyConfigWith("decoder_layers", layers));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("'decoder_layers'"));
  REQUIRE_THAT(std::string(status.message()), Contains("at least one group"));
}

TEST_CASE("config: decoder_layers entries", "[loader][config]") {
  SECTION("negative entry") {
    absl::Status status = ConfigStatus(TinyConfigWith("decoder_layers", {1, -2}));
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(status.message()),
                 Contains("'decoder_layers' entry 1 must be between 0 and"));
  }
  SECTION("not an array") {
    absl::Status status = ConfigStatus(TinyConfigWith("decoder_layers", 6));
    REQUIRE_THAT(std::string(status.message()), Contains("'decoder_layers' must be an array"));
  }
  SECTION("non-integer entry") {
    absl::Status status = ConfigStatus(TinyConfigWith("decoder_layers", {1, "2"}));
    REQUIRE_THAT(std::string(status.message()), Contains("'decoder_layers[1]' must be an integer"));
  }
  SECTION("empty groups and no lower layers are servable") {
    REQUIRE(ConfigStatus(TinyConfigWith("decoder_layers", {0, 0, 1})).ok());
  }
}

TEST_CASE("config: negative encoder_layers", "[loader][config]") {
  absl::Status status = ConfigStatus(TinyConfigWith("encoder_layers", -1));
  REQUIRE_THAT(std::string(status.message()), Contains("'encoder_layers' must be between 0 and"));
}

TEST_CASE("config: token ids outside the vocabulary", "[loader][config]") {
  const std::string key = GENERATE("chunk_id", "pad_id");
  const int id = GENERATE(11, -1);
  absl::Status status = ConfigStatus(TinyConfigWith(key, id));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()),
               Contains("'" + key + "' (" + std::to_string(id) + ") is outside [0, 11)"));
}

TEST_CASE("config: unsupported activation", "[loader][config]") {
  absl::Status status = ConfigStatus(TinyConfigWith("hidden_act", "gelu"));
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(status.message()), Contains("dir/config.json"));
  REQUIRE_THAT(std::string(status.message()), Contains("'hidden_act' is 'gelu'"));

  CHECK(ConfigStatus(TinyConfigWith("hidden_act", "swish")).ok());
}

TEST_CASE("config: attention_bias true", "[loader][config]") {
  absl::Status status = ConfigStatus(TinyConfigWith("attention_bias", true));
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(status.message()), Contains("'attention_bias' is true"));
}

TEST_CASE("config: architecture variants of the reference", "[loader][config]") {
  absl::Status status = ConfigStatus(TinyConfigWith("gpt2_mlp", true));
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(status.message()), Contains("'gpt2_mlp' is true"));

  status = ConfigStatus(TinyConfigWith("enable_alibi", false));
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(status.message()), Contains("'enable_alibi' is false"));

  status = ConfigStatus(TinyConfigWith("_flash_attn_2_enabled", false));
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(status.message()), Contains("'_flash_attn_2_enabled' is false"));
}

TEST_CASE("config: wrong JSON types", "[loader][config]") {
  SECTION("integer given as a string") {
    absl::Status status = ConfigStatus(TinyConfigWith("hidden_size", "8"));
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(status.message()), Contains("'hidden_size' must be an integer"));
  }
  SECTION("integer given as a fraction") {
    absl::Status status = ConfigStatus(TinyConfigWith("vocab_size", 11.5));
    REQUIRE_THAT(std::string(status.message()), Contains("'vocab_size' must be an integer"));
  }
  SECTION("boolean given as a string") {
    absl::Status status = ConfigStatus(TinyConfigWith("tie_word_embeddings", "yes"));
    REQUIRE_THAT(std::string(status.message()),
                 Contains("'tie_word_embeddings' must be true or false"));
  }
  SECTION("number given as a string") {
    absl::Status status = ConfigStatus(TinyConfigWith("rms_norm_eps", "1e-5"));
    REQUIRE_THAT(std::string(status.message()), Contains("'rms_norm_eps' must be a number"));
  }
  SECTION("activation given as a number") {
    absl::Status status = ConfigStatus(TinyConfigWith("hidden_act", 1));
    REQUIRE_THAT(std::string(status.message()), Contains("'hidden_act' must be a string"));
  }
}

TEST_CASE("config: non-positive rms_norm_eps and rope_theta", "[loader][config]") {
  const std::string key = GENERATE("rms_norm_eps", "rope_theta");
  absl::Status status = ConfigStatus(TinyConfigWith(key, 0.0));
  REQUIRE_THAT(std::string(status.message()), Contains("'" + key + "' must be a positive"));
}

// ---------------------------------------------------------------- safetensors

TEST_CASE("safetensors: missing file", "[loader][safetensors]") {
  TempDir dir;
  absl::Status status = SafetensorsFile::Open(dir.File("absent.safetensors")).status();
  CHECK(status.code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(status.message()), Contains(dir.File("absent.safetensors")));
}

TEST_CASE("safetensors: file shorter than the length prefix", "[loader][safetensors]") {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  WriteFile(path, std::string("\x10\x00\x00", 3));
  absl::Status status = SafetensorsFile::Open(path).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(path));
  REQUIRE_THAT(std::string(status.message()), Contains("shorter than the 8-byte header length"));

  WriteFile(path, "");
  REQUIRE_THAT(std::string(SafetensorsFile::Open(path).status().message()),
               Contains("file is 0 bytes"));
}

TEST_CASE("safetensors: header length too large", "[loader][safetensors]") {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  SECTION("just past the end") {
    std::string bytes = EncodeSafetensors("{}", "");
    bytes[0] = 3;  // claims 3 header bytes, the file has 2
    WriteFile(path, bytes);
  }
  SECTION("near 2^64, where header + 8 would wrap") {
    std::string bytes = EncodeSafetensors("{}", "");
    for (int i = 0; i < 8; ++i) bytes[i] = '\xFF';
    WriteFile(path, bytes);
  }
  absl::Status status = SafetensorsFile::Open(path).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(path));
  REQUIRE_THAT(std::string(status.message()), Contains("is beyond the end of the file"));
}

TEST_CASE("safetensors: malformed header JSON", "[loader][safetensors]") {
  TempDir dir;
  absl::Status status = OpenStatus(dir, "{\"w\": {\"dtype\": \"F32\",", "");
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(dir.File("model.safetensors")));
  REQUIRE_THAT(std::string(status.message()), Contains("malformed JSON header"));
}

TEST_CASE("safetensors: header not an object", "[loader][safetensors]") {
  TempDir dir;
  absl::Status status = OpenStatus(dir, "[1, 2, 3]", "");
  REQUIRE_THAT(std::string(status.message()), Contains("JSON header must be an object"));
}

TEST_CASE("safetensors: entry missing a field", "[loader][safetensors]") {
  TempDir dir;
  const std::string field = GENERATE("dtype", "shape", "data_offsets");
  json header = OneTensorHeader();
  header["w"].erase(field);
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("tensor 'w': missing " + field));
}

TEST_CASE("safetensors: entry fields of the wrong type", "[loader][safetensors]") {
  TempDir dir;
  json header = OneTensorHeader();
  std::string expected;
  SECTION("entry not an object") {
    header["w"] = 5;
    expected = "tensor 'w': header entry must be an object";
  }
  SECTION("dtype not a string") {
    header["w"]["dtype"] = 1;
    expected = "tensor 'w': dtype must be a string";
  }
  SECTION("shape not an array") {
    header["w"]["shape"] = "2x2";
    expected = "tensor 'w': shape must be an array of integers";
  }
  SECTION("shape with a fraction") {
    header["w"]["shape"] = {2, 2.5};
    expected = "tensor 'w': shape must be an array of integers";
  }
  SECTION("data_offsets with three entries") {
    header["w"]["data_offsets"] = {0, 8, 16};
    expected = "tensor 'w': data_offsets must be an array of two integers";
  }
  SECTION("negative data_offsets") {
    header["w"]["data_offsets"] = {-16, 16};
    expected = "tensor 'w': data_offsets must be non-negative integers";
  }
  SECTION("metadata not an object") {
    header["__metadata__"] = "pt";
    expected = "__metadata__ must be an object";
  }
  SECTION("metadata value not a string") {
    header["__metadata__"] = {{"format", 1}};
    expected = "__metadata__ value for 'format' must be a string";
  }
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(expected));
}

TEST_CASE("safetensors: unknown dtype", "[loader][safetensors]") {
  TempDir dir;
  const std::string dtype = GENERATE("F64", "U8", "F8_E4M3", "f32");
  json header = OneTensorHeader();
  header["w"]["dtype"] = dtype;
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()),
               Contains("tensor 'w': unknown or unsupported dtype '" + dtype + "'"));
}

TEST_CASE("safetensors: negative dimension", "[loader][safetensors]") {
  TempDir dir;
  json header = OneTensorHeader();
  header["w"]["shape"] = {-2, -2};
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  REQUIRE_THAT(std::string(status.message()), Contains("tensor 'w': negative dimension"));
}

TEST_CASE("safetensors: data_offsets out of range", "[loader][safetensors]") {
  TempDir dir;
  json header = OneTensorHeader();
  header["w"]["data_offsets"] = {8, 24};
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(dir.File("model.safetensors")));
  REQUIRE_THAT(
      std::string(status.message()),
      Contains("tensor 'w': data_offsets [8, 24] out of range of the data section (16 bytes)"));
}

TEST_CASE("safetensors: data_offsets begin after end", "[loader][safetensors]") {
  TempDir dir;
  json header = OneTensorHeader();
  header["w"]["data_offsets"] = {16, 0};
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  REQUIRE_THAT(std::string(status.message()),
               Contains("tensor 'w': data_offsets begin 16 is after end 0"));
}

TEST_CASE("safetensors: overlapping tensors", "[loader][safetensors]") {
  TempDir dir;
  json header = OneTensorHeader();
  header["v"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {12, 20}}};
  absl::Status status = OpenStatus(dir, header.dump(), std::string(20, '\0'));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("tensors 'w' [0, 16) and 'v' [12, 20)"));
  REQUIRE_THAT(std::string(status.message()), Contains("overlapping data_offsets"));
}

TEST_CASE("safetensors: byte count differs from shape x dtype size", "[loader][safetensors]") {
  TempDir dir;
  json header = OneTensorHeader();
  header["w"]["dtype"] = "BF16";  // [2, 2] BF16 needs 8 bytes, not 16
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(
      std::string(status.message()),
      Contains("tensor 'w': data_offsets span 16 bytes but shape [2, 2] of BF16 needs 8 bytes"));
}

TEST_CASE("safetensors: element count overflowing 64 bits", "[loader][safetensors]") {
  TempDir dir;
  json header = OneTensorHeader();
  header["w"]["shape"] = {int64_t{1} << 62, int64_t{1} << 62, 4};
  absl::Status status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  REQUIRE_THAT(std::string(status.message()), Contains("needs more than 2^64 bytes"));

  // 2^62 F32 elements are 2^64 bytes: the byte count overflows, the element count does not.
  header["w"]["shape"] = {int64_t{1} << 62};
  status = OpenStatus(dir, header.dump(), std::string(16, '\0'));
  REQUIRE_THAT(std::string(status.message()), Contains("needs 18446744073709551616 bytes"));
}

TEST_CASE("safetensors: truncated data section", "[loader][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.SetFloats("a", "F32", {4}, {1, 2, 3, 4});
  writer.SetFloats("b", "F32", {2, 3}, {1, 2, 3, 4, 5, 6});
  std::string bytes = writer.Serialize();
  bytes.resize(bytes.size() - 5);
  const std::string path = dir.File("model.safetensors");
  WriteFile(path, bytes);
  absl::Status status = SafetensorsFile::Open(path).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(path));
  REQUIRE_THAT(
      std::string(status.message()),
      Contains("tensor 'b': data_offsets [16, 40] out of range of the data section (35 bytes)"));
}

TEST_CASE("safetensors: reads tensors, metadata and empty tensors", "[loader][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.SetFloats("f", "F32", {2, 2}, {1.0f, -2.5f, 3.25f, 1e-30f});
  writer.SetValues<int32_t>("i32", "I32", {3}, {-7, 0, 2147483647});
  writer.SetValues<int64_t>("i64", "I64", {2}, {-(int64_t{1} << 40), 5});
  writer.Set("empty", "F32", {0, 4}, "");
  writer.Set("scalar", "F32", {}, std::string("\x00\x00\xC0\x3F", 4));  // 1.5f
  writer.SetMetadata("format", "pt");
  writer.WriteTo(dir.File("model.safetensors"));

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(dir.File("model.safetensors"));
  REQUIRE(file.ok());
  CHECK((*file)->tensors().size() == 5);
  CHECK((*file)->metadata().at("format") == "pt");

  absl::StatusOr<const TensorView*> f = (*file)->Get("f");
  REQUIRE(f.ok());
  CHECK((*f)->dtype == DType::kF32);
  CHECK((*f)->shape == std::vector<int64_t>{2, 2});
  CHECK((*f)->num_elements() == 4);
  CHECK((*f)->num_bytes == 16);
  CHECK(*(*file)->ReadF32("f") == std::vector<float>{1.0f, -2.5f, 3.25f, 1e-30f});
  CHECK(*(*file)->ReadI64("i32") == std::vector<int64_t>{-7, 0, 2147483647});
  CHECK(*(*file)->ReadI64("i64") == std::vector<int64_t>{-(int64_t{1} << 40), 5});
  CHECK((*file)->ReadF32("empty")->empty());
  CHECK((*(*file)->Get("empty"))->num_elements() == 0);
  CHECK(*(*file)->ReadF32("scalar") == std::vector<float>{1.5f});
  CHECK((*(*file)->Get("scalar"))->num_elements() == 1);

  absl::Status missing = (*file)->Get("nope").status();
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(missing.message()), Contains("tensor 'nope' not found"));

  absl::Status int_as_float = (*file)->ReadF32("i32").status();
  REQUIRE_THAT(std::string(int_as_float.message()),
               Contains("tensor 'i32' has dtype I32, expected a float dtype"));
  absl::Status float_as_int = (*file)->ReadI64("f").status();
  REQUIRE_THAT(std::string(float_as_int.message()),
               Contains("tensor 'f' has dtype F32, expected an integer dtype"));
}

TEST_CASE("safetensors: unaligned data section", "[loader][safetensors]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.SetFloats("w", "F32", {3}, {0.5f, -1.0f, 7.0f});
  std::string header = writer.Header().dump() + " ";  // odd length: data starts unaligned
  if (header.size() % 4 == 0) header += " ";
  WriteFile(dir.File("model.safetensors"), EncodeSafetensors(header, writer.Data()));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(dir.File("model.safetensors"));
  REQUIRE(file.ok());
  CHECK(*(*file)->ReadF32("w") == std::vector<float>{0.5f, -1.0f, 7.0f});
}

TEST_CASE("safetensors: f16 and bf16 bit patterns convert exactly", "[loader][safetensors]") {
  TempDir dir;
  const std::vector<uint16_t> half_bits = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x0400, 0x7BFF,
                                           0x7C00, 0xFC00, 0x8000, 0x3555, 0x8001};
  const std::vector<uint16_t> bf16_bits = {0x3FC0, 0xBF80, 0x7F80, 0x0001, 0x8000, 0x4049};
  SafetensorsWriter writer;
  writer.SetValues("h", "F16", {static_cast<int64_t>(half_bits.size())}, half_bits);
  writer.SetValues("b", "BF16", {static_cast<int64_t>(bf16_bits.size())}, bf16_bits);
  writer.SetValues<uint16_t>("nan_h", "F16", {1}, {0x7E00});
  writer.SetValues<uint16_t>("nan_b", "BF16", {1}, {0x7FC0});
  writer.WriteTo(dir.File("model.safetensors"));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(dir.File("model.safetensors"));
  REQUIRE(file.ok());

  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> half = *(*file)->ReadF32("h");
  CHECK(half[0] == 1.0f);
  CHECK(half[1] == -2.0f);
  CHECK(half[2] == std::ldexp(1.0f, -24));     // smallest subnormal
  CHECK(half[3] == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(half[4] == std::ldexp(1.0f, -14));     // smallest normal
  CHECK(half[5] == 65504.0f);                  // largest finite
  CHECK(half[6] == inf);
  CHECK(half[7] == -inf);
  CHECK(half[8] == 0.0f);
  CHECK(std::signbit(half[8]));
  CHECK(half[9] == std::ldexp(static_cast<float>(0x555 | 0x400), -12));  // 0.333251953125
  CHECK(half[10] == -std::ldexp(1.0f, -24));
  CHECK(std::isnan((*(*file)->ReadF32("nan_h"))[0]));

  const std::vector<float> bf16 = *(*file)->ReadF32("b");
  CHECK(bf16[0] == 1.5f);
  CHECK(bf16[1] == -1.0f);
  CHECK(bf16[2] == inf);
  CHECK(bf16[3] == std::ldexp(1.0f, -133));  // float subnormal, kept exactly
  CHECK(bf16[4] == 0.0f);
  CHECK(std::signbit(bf16[4]));
  CHECK(bf16[5] == 3.140625f);
  CHECK(std::isnan((*(*file)->ReadF32("nan_b"))[0]));
}

#ifdef __FLT16_MAX__
TEST_CASE("safetensors: HalfToFloat agrees with the compiler on every f16",
          "[loader][safetensors]") {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const _Float16 half = std::bit_cast<_Float16>(static_cast<uint16_t>(bits));
    const float expected = static_cast<float>(half);
    const float actual = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(expected)) {
      REQUIRE(std::isnan(actual));
    } else {
      REQUIRE(std::bit_cast<uint32_t>(actual) == std::bit_cast<uint32_t>(expected));
    }
  }
}
#endif

// ---------------------------------------------------------------- weights

TEST_CASE("weights: expected tensor names follow the reference state_dict", "[loader][weights]") {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(TinyConfigJson().dump(), "tiny");
  REQUIRE(config.ok());
  const std::vector<ExpectedTensor> expected = ExpectedTensors(*config);
  auto shape_of = [&](const std::string& name) -> std::vector<int64_t> {
    for (const ExpectedTensor& tensor : expected) {
      if (tensor.name == name) return tensor.shape;
    }
    FAIL("no expected tensor " << name);
    return {};
  };
  using Shape = std::vector<int64_t>;
  // d=8, F=12, K/V rows 1 head x 4 in the decoder, 8 in the MHA encoder.
  CHECK(shape_of("model.embed_tokens.weight") == Shape{11, 8});
  CHECK(shape_of("model.norm.weight") == Shape{8});
  for (const std::string prefix :
       {"model.lower_layers.0", "model.upper_layers.0.0", "model.upper_layers.0.1",
        "model.upper_layers.1.0", "model.encoder.layers.0"}) {
    const bool encoder = prefix == "model.encoder.layers.0";
    CHECK(shape_of(prefix + ".input_layernorm.weight") == Shape{8});
    CHECK(shape_of(prefix + ".post_attention_layernorm.weight") == Shape{8});
    CHECK(shape_of(prefix + ".self_attn.q_proj.weight") == Shape{8, 8});
    CHECK(shape_of(prefix + ".self_attn.k_proj.weight") == Shape{encoder ? 8 : 4, 8});
    CHECK(shape_of(prefix + ".self_attn.v_proj.weight") == Shape{encoder ? 8 : 4, 8});
    CHECK(shape_of(prefix + ".self_attn.o_proj.weight") == Shape{8, 8});
    CHECK(shape_of(prefix + ".mlp.gate_proj.weight") == Shape{12, 8});
    CHECK(shape_of(prefix + ".mlp.up_proj.weight") == Shape{12, 8});
    CHECK(shape_of(prefix + ".mlp.down_proj.weight") == Shape{8, 12});
  }
  for (const std::string prefix :
       {"model.upper_layers.0.0", "model.upper_layers.0.1", "model.upper_layers.1.0"}) {
    CHECK(shape_of(prefix + ".gca.pre_norm.weight") == Shape{8});
    CHECK(shape_of(prefix + ".gca.q_proj.weight") == Shape{8, 8});
    CHECK(shape_of(prefix + ".gca.o_proj.weight") == Shape{8, 8});
  }
  CHECK(shape_of("model.lmk_norms.0.weight") == Shape{8});
  CHECK(shape_of("model.lmk_norms.1.weight") == Shape{8});
  CHECK(shape_of("model.enc_prenorm.weight") == Shape{8});
  CHECK(shape_of("model.encoder.norm.weight") == Shape{8});
  CHECK(shape_of("model.chunk_k_proj.weight") == Shape{8, 8});
  CHECK(shape_of("model.chunk_v_proj.weight") == Shape{8, 8});
  // 2 + 5 layers x 9 + 3 x 3 gca + 2 lmk norms + prenorm, encoder norm, chunk k/v; tied head.
  CHECK(expected.size() == 2 + 5 * 9 + 3 * 3 + 2 + 4);

  config->tie_word_embeddings = false;
  const std::vector<ExpectedTensor> untied = ExpectedTensors(*config);
  CHECK(untied.size() == expected.size() + 1);
  CHECK(untied.back().name == "lm_head.weight");
  CHECK(untied.back().shape == Shape{11, 8});
}

// Every ModelWeights field with the checkpoint name it must come from, written
// out independently of the loader so that a misplaced tensor shows.
std::vector<std::pair<std::string, const std::vector<float>*>> NamedFields(
    const ModelWeights& weights) {
  std::vector<std::pair<std::string, const std::vector<float>*>> fields;
  auto add_layer = [&](const std::string& prefix, const LayerWeights& layer) {
    fields.push_back({prefix + ".input_layernorm.weight", &layer.input_layernorm});
    fields.push_back(
        {prefix + ".post_attention_layernorm.weight", &layer.post_attention_layernorm});
    fields.push_back({prefix + ".self_attn.q_proj.weight", &layer.self_attn.q_proj});
    fields.push_back({prefix + ".self_attn.k_proj.weight", &layer.self_attn.k_proj});
    fields.push_back({prefix + ".self_attn.v_proj.weight", &layer.self_attn.v_proj});
    fields.push_back({prefix + ".self_attn.o_proj.weight", &layer.self_attn.o_proj});
    fields.push_back({prefix + ".mlp.gate_proj.weight", &layer.mlp.gate_proj});
    fields.push_back({prefix + ".mlp.up_proj.weight", &layer.mlp.up_proj});
    fields.push_back({prefix + ".mlp.down_proj.weight", &layer.mlp.down_proj});
  };
  fields.push_back({"model.embed_tokens.weight", &weights.embed_tokens});
  fields.push_back({"model.norm.weight", &weights.norm});
  for (size_t i = 0; i < weights.lower_layers.size(); ++i) {
    add_layer("model.lower_layers." + std::to_string(i), weights.lower_layers[i]);
  }
  for (size_t g = 0; g < weights.upper_layers.size(); ++g) {
    for (size_t j = 0; j < weights.upper_layers[g].size(); ++j) {
      const std::string prefix =
          "model.upper_layers." + std::to_string(g) + "." + std::to_string(j);
      const UpperLayerWeights& layer = weights.upper_layers[g][j];
      add_layer(prefix, layer.base);
      fields.push_back({prefix + ".gca.pre_norm.weight", &layer.gca.pre_norm});
      fields.push_back({prefix + ".gca.q_proj.weight", &layer.gca.q_proj});
      fields.push_back({prefix + ".gca.o_proj.weight", &layer.gca.o_proj});
    }
  }
  for (size_t g = 0; g < weights.lmk_norms.size(); ++g) {
    fields.push_back({"model.lmk_norms." + std::to_string(g) + ".weight", &weights.lmk_norms[g]});
  }
  fields.push_back({"model.enc_prenorm.weight", &weights.enc_prenorm});
  for (size_t e = 0; e < weights.encoder_layers.size(); ++e) {
    add_layer("model.encoder.layers." + std::to_string(e), weights.encoder_layers[e]);
  }
  fields.push_back({"model.encoder.norm.weight", &weights.encoder_norm});
  fields.push_back({"model.chunk_k_proj.weight", &weights.chunk_k_proj});
  fields.push_back({"model.chunk_v_proj.weight", &weights.chunk_v_proj});
  return fields;
}

TEST_CASE("weights: valid load converts every dtype exactly", "[loader][weights]") {
  const std::string dtype = GENERATE("F32", "F16", "BF16");
  TempDir dir;
  TinyModel model = MakeTinyModel(dtype);
  // Known bit patterns in the final norm: 1.5, -2, the smallest subnormal,
  // the largest finite value, -0. (NaN and infinity are refused at load:
  // tests/nonfinite_weights_test.cc.)
  std::vector<float> norm;
  if (dtype == "F32") {
    norm = {
        1.5f,  -2.0f, std::ldexp(1.0f, -149), std::numeric_limits<float>::max(), 1.0f, 0.0f,
        -0.0f, 0.5f};
    model.weights.SetFloats("model.norm.weight", "F32", {8}, norm);
  } else if (dtype == "F16") {
    const std::vector<uint16_t> bits = {0x3E00, 0xC000, 0x0001, 0x7BFF,
                                        0x3C00, 0x0000, 0x8000, 0x3800};
    model.weights.SetValues("model.norm.weight", "F16", {8}, bits);
    norm = {1.5f, -2.0f, std::ldexp(1.0f, -24), 65504.0f, 1.0f, 0.0f, -0.0f, 0.5f};
  } else if (dtype == "BF16") {
    const std::vector<uint16_t> bits = {0x3FC0, 0xC000, 0x0001, 0x7F7F,
                                        0x3F80, 0x0000, 0x8000, 0x3F00};
    model.weights.SetValues("model.norm.weight", "BF16", {8}, bits);
    // 0x7F7F: exponent 254 - 127, mantissa 1 + 127/128, i.e. 255 * 2^120.
    norm = {1.5f, -2.0f, std::ldexp(1.0f, -133), std::ldexp(255.0f, 120), 1.0f, 0.0f, -0.0f, 0.5f};
  }
  model.values["model.norm.weight"] = norm;
  WriteModelDir(dir.path(), model.config, model.weights);

  absl::StatusOr<LoadedModel> loaded = LoadModelDir(dir.path());
  REQUIRE(loaded.ok());
  const ModelWeights& weights = loaded->weights;
  CHECK(loaded->config.hidden_size == 8);
  CHECK(weights.lower_layers.size() == 1);
  REQUIRE(weights.upper_layers.size() == 2);
  CHECK(weights.upper_layers[0].size() == 2);
  CHECK(weights.upper_layers[1].size() == 1);
  CHECK(weights.lmk_norms.size() == 2);
  CHECK(weights.encoder_layers.size() == 1);

  const auto fields = NamedFields(weights);
  CHECK(fields.size() == model.values.size());
  for (const auto& [name, field] : fields) {
    INFO(dtype << " " << name);
    REQUIRE(model.values.contains(name));
    CHECK(*field == model.values.at(name));
  }
  CHECK(weights.norm[2] > 0.0f);  // subnormal kept, not flushed
  CHECK(std::signbit(weights.norm[6]));
  // Tied, no lm_head.weight in the file: the embedding serves, uncopied.
  CHECK(weights.lm_head.empty());
  CHECK(&weights.output_embedding() == &weights.embed_tokens);
}

TEST_CASE("weights: wrong shape", "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  model.weights.SetFloats("model.upper_layers.1.0.self_attn.k_proj.weight", "F32", {8, 8},
                          std::vector<float>(64, 0.0f));
  absl::Status status = LoadTinyDirStatus(dir, model);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(dir.File("model.safetensors")));
  REQUIRE_THAT(std::string(status.message()),
               Contains("tensor 'model.upper_layers.1.0.self_attn.k_proj.weight' has shape [8, 8], "
                        "expected [4, 8]"));
}

TEST_CASE("weights: integer dtype for a weight", "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  model.weights.SetValues<int32_t>("model.lmk_norms.1.weight", "I32", {8},
                                   std::vector<int32_t>(8, 1));
  absl::Status status = LoadTinyDirStatus(dir, model);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()),
               Contains("tensor 'model.lmk_norms.1.weight' has dtype I32, expected a float dtype"));
}

TEST_CASE("weights: missing tensor", "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  model.weights.Remove("model.encoder.layers.0.mlp.up_proj.weight");
  absl::Status status = LoadTinyDirStatus(dir, model);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains(dir.File("model.safetensors")));
  REQUIRE_THAT(std::string(status.message()),
               Contains("1 missing tensor(s): model.encoder.layers.0.mlp.up_proj.weight"));
}

TEST_CASE("weights: unexpected tensor", "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  model.weights.SetFloats("model.lower_layers.1.input_layernorm.weight", "F32", {8},
                          std::vector<float>(8, 1.0f));
  absl::Status status = LoadTinyDirStatus(dir, model);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()),
               Contains("1 unexpected tensor(s): model.lower_layers.1.input_layernorm.weight"));
}

TEST_CASE("weights: many unexpected tensors are listed in part", "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  for (int i = 0; i < 8; ++i) {
    model.weights.SetFloats("extra." + std::to_string(i), "F32", {1}, {0.0f});
  }
  absl::Status status = LoadTinyDirStatus(dir, model);
  REQUIRE_THAT(std::string(status.message()),
               Contains("8 unexpected tensor(s): extra.0, extra.1, extra.2, extra.3, extra.4 "
                        "and 3 more"));
}

TEST_CASE("weights: a checkpoint without the model. prefix reports both sides",
          "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  const std::vector<float> values = model.values.at("model.norm.weight");
  model.weights.Remove("model.norm.weight");
  model.weights.SetFloats("norm.weight", "F32", {8}, values);
  absl::Status status = LoadTinyDirStatus(dir, model);
  REQUIRE_THAT(std::string(status.message()), Contains("1 missing tensor(s): model.norm.weight; "
                                                       "1 unexpected tensor(s): norm.weight"));
}

TEST_CASE("weights: lm_head", "[loader][weights]") {
  TempDir dir;
  SECTION("untied and absent is an error") {
    TinyModel model = MakeTinyModel("F32", TinyConfigWith("tie_word_embeddings", false));
    model.weights.Remove("lm_head.weight");
    absl::Status status = LoadTinyDirStatus(dir, model);
    REQUIRE_THAT(std::string(status.message()), Contains("missing tensor(s): lm_head.weight"));
  }
  SECTION("untied and present is used") {
    TinyModel model = MakeTinyModel("BF16", TinyConfigWith("tie_word_embeddings", false));
    WriteModelDir(dir.path(), model.config, model.weights);
    absl::StatusOr<LoadedModel> loaded = LoadModelDir(dir.path());
    REQUIRE(loaded.ok());
    CHECK(loaded->weights.lm_head == model.values.at("lm_head.weight"));
    CHECK(loaded->weights.lm_head != loaded->weights.embed_tokens);
  }
  SECTION("tied and present is used") {
    TinyModel model = MakeTinyModel();
    const std::vector<float> head(11 * 8, 0.25f);
    model.weights.SetFloats("lm_head.weight", "F32", {11, 8}, head);
    WriteModelDir(dir.path(), model.config, model.weights);
    absl::StatusOr<LoadedModel> loaded = LoadModelDir(dir.path());
    REQUIRE(loaded.ok());
    CHECK(loaded->weights.lm_head == head);
  }
  SECTION("tied and present with the wrong shape is an error") {
    TinyModel model = MakeTinyModel();
    model.weights.SetFloats("lm_head.weight", "F32", {8, 11}, std::vector<float>(88, 0.0f));
    absl::Status status = LoadTinyDirStatus(dir, model);
    REQUIRE_THAT(std::string(status.message()),
                 Contains("tensor 'lm_head.weight' has shape [8, 11], expected [11, 8]"));
  }
}

TEST_CASE("weights: ALiBi slope buffers of the reference are accepted", "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  for (const std::string layer : {"model.lower_layers.0", "model.upper_layers.0.0",
                                  "model.upper_layers.0.1", "model.upper_layers.1.0"}) {
    model.weights.SetFloats(layer + ".self_attn.m", "F32", {2}, {0.0625f, 0.00390625f});
  }
  SECTION("with the right shape") { REQUIRE(LoadTinyDirStatus(dir, model).ok()); }
  SECTION("with the wrong shape") {
    model.weights.SetFloats("model.upper_layers.0.1.self_attn.m", "F32", {3}, {1, 2, 3});
    absl::Status status = LoadTinyDirStatus(dir, model);
    REQUIRE_THAT(
        std::string(status.message()),
        Contains("tensor 'model.upper_layers.0.1.self_attn.m' has shape [3], expected [2]"));
  }
  SECTION("but not in the MHA encoder, which has no ALiBi") {
    model.weights.SetFloats("model.encoder.layers.0.self_attn.m", "F32", {2}, {1, 2});
    absl::Status status = LoadTinyDirStatus(dir, model);
    REQUIRE_THAT(std::string(status.message()),
                 Contains("unexpected tensor(s): model.encoder.layers.0.self_attn.m"));
  }
}

TEST_CASE("weights: a corrupt file is reported by LoadModelWeights", "[loader][weights]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  std::string bytes = model.weights.Serialize();
  bytes.resize(bytes.size() - 1);
  WriteFile(dir.File("model.safetensors"), bytes);
  absl::StatusOr<ModelConfig> config = ParseModelConfig(model.config.dump(), "config.json");
  REQUIRE(config.ok());
  absl::Status status = LoadModelWeights(dir.File("model.safetensors"), *config).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()), Contains("out of range of the data section"));
}

// ---------------------------------------------------------------- model directory

TEST_CASE("model dir: directory does not exist", "[loader][model_dir]") {
  TempDir dir;
  absl::Status status = LoadModelDir(dir.File("nope")).status();
  CHECK(status.code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(status.message()),
               Contains("model directory '" + dir.File("nope") + "' does not exist"));
}

TEST_CASE("model dir: path is a file", "[loader][model_dir]") {
  TempDir dir;
  WriteFile(dir.File("plain"), "x");
  absl::Status status = LoadModelDir(dir.File("plain")).status();
  REQUIRE_THAT(std::string(status.message()), Contains("is not a directory"));
}

TEST_CASE("model dir: missing config", "[loader][model_dir]") {
  TempDir dir;
  MakeTinyModel().weights.WriteTo(dir.File("model.safetensors"));
  absl::Status status = LoadModelDir(dir.path()).status();
  CHECK(status.code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(status.message()),
               Contains(dir.File("config.json") + ": config file not found"));
}

TEST_CASE("model dir: missing weights file", "[loader][model_dir]") {
  TempDir dir;
  WriteFile(dir.File("config.json"), TinyConfigJson().dump());
  SECTION("nothing in its place") {
    absl::Status status = LoadModelDir(dir.path()).status();
    CHECK(status.code() == absl::StatusCode::kNotFound);
    REQUIRE_THAT(std::string(status.message()),
                 Contains(dir.File("model.safetensors") + ": weights file not found"));
  }
  SECTION("a sharded checkpoint") {
    WriteFile(dir.File("model.safetensors.index.json"), "{}");
    absl::Status status = LoadModelDir(dir.path()).status();
    REQUIRE_THAT(std::string(status.message()), Contains("sharded checkpoints are not supported"));
  }
}

TEST_CASE("model dir: config errors name config.json", "[loader][model_dir]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  model.config["hidden_size"] = 9;
  absl::Status status = LoadTinyDirStatus(dir, model);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(status.message()),
               Contains(dir.File("config.json") + ": key 'hidden_size'"));
}

TEST_CASE("model dir: tokenizer.json is optional", "[loader][model_dir]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  WriteModelDir(dir.path(), model.config, model.weights);
  absl::StatusOr<ModelFiles> files = FindModelFiles(dir.path());
  REQUIRE(files.ok());
  CHECK(files->config_path == dir.File("config.json"));
  CHECK(files->weights_path == dir.File("model.safetensors"));
  CHECK_FALSE(files->tokenizer_path.has_value());

  WriteFile(dir.File("tokenizer.json"), "{}");
  files = FindModelFiles(dir.path());
  REQUIRE(files.ok());
  CHECK(files->tokenizer_path == dir.File("tokenizer.json"));
}

TEST_CASE("model dir: generation_config.json sets the padding default", "[loader][model_dir]") {
  TempDir dir;
  absl::StatusOr<GenerationDefaults> defaults = LoadGenerationDefaults(dir.path());
  REQUIRE(defaults.ok());
  CHECK_FALSE(defaults->pad_to_chunk_boundary);  // no file: no padding

  WriteFile(dir.File("generation_config.json"),
            R"({"pad_to_chunk_boundary": true, "max_new_tokens": 8, "_from_model_config": true})");
  defaults = LoadGenerationDefaults(dir.path());
  REQUIRE(defaults.ok());
  CHECK(defaults->pad_to_chunk_boundary);

  WriteFile(dir.File("generation_config.json"), R"({"temperature": 0.7})");
  defaults = LoadGenerationDefaults(dir.path());
  REQUIRE(defaults.ok());
  CHECK_FALSE(defaults->pad_to_chunk_boundary);

  WriteFile(dir.File("generation_config.json"), R"({"pad_to_chunk_boundary": "yes"})");
  defaults = LoadGenerationDefaults(dir.path());
  REQUIRE_FALSE(defaults.ok());
  CHECK(defaults.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(defaults.status().message()),
             Contains(dir.File("generation_config.json") + ": pad_to_chunk_boundary must be true or false"));

  WriteFile(dir.File("generation_config.json"), R"({"pad_to_chunk_boundary": tru)");
  defaults = LoadGenerationDefaults(dir.path());
  REQUIRE_FALSE(defaults.ok());
  CHECK_THAT(std::string(defaults.status().message()), Contains("malformed JSON"));
}

}  // namespace
}  // namespace drt
