// drt-server's flag validation and address parsing.
#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include <string>
#include <utility>

#include "absl/flags/reflection.h"
#include "engine/backend_factory.h"
#include "server/server_flags.h"
#include "tests/server/test_util/scoped_flag.h"

namespace drt::server {
namespace {

using testing::ScopedFlag;

TEST_CASE("ParseHostPort takes host:port and [ipv6]:port", "[server][flags]") {
  auto v4 = ParseHostPort("0.0.0.0:50051");
  REQUIRE(v4.ok());
  CHECK(v4->host == "0.0.0.0");
  CHECK(v4->port == 50051);
  CHECK(FormatHostPort(*v4) == "0.0.0.0:50051");

  auto v6 = ParseHostPort("[::1]:0");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  CHECK(v6->port == 0);
  CHECK(FormatHostPort(*v6) == "[::1]:0");

  CHECK_FALSE(ParseHostPort("localhost").ok());
  CHECK_FALSE(ParseHostPort(":9090").ok());
  CHECK_FALSE(ParseHostPort("host:70000").ok());
  CHECK_FALSE(ParseHostPort("host:9x").ok());
  CHECK_FALSE(ParseHostPort("::1:50051").ok());
  CHECK_FALSE(ParseHostPort("[::1]50051").ok());
}

TEST_CASE("ServerConfigFromFlags validates and converts", "[server][flags]") {
  ScopedFlag model("model", "/models/tiny");
  ScopedFlag budget("host_memory_budget_gb", "1.5");
  ScopedFlag no_http("http_listen", "");
  ScopedFlag token("bearer_token", "secret");

  auto config = ServerConfigFromFlags();
  REQUIRE(config.ok());
  CHECK(config->grpc_address == "0.0.0.0:50051");
  CHECK_FALSE(config->http.has_value());
  CHECK(config->model_dir == "/models/tiny");
  // --device defaults to auto: this machine's choice (cpu without a GPU).
  auto expected_device = ResolveDevice(Device::kAuto, 0);
  REQUIRE(expected_device.ok());
  CHECK(config->device == DeviceName(expected_device->device));
  CHECK(config->max_message_bytes == 4 << 20);
  // ... which GetModelInfo reports (ModelInfo.max_message_bytes).
  CHECK(config->service.max_message_bytes == 4 << 20);
  {
    ScopedFlag message("max_message_bytes", "5000000");
    auto larger = ServerConfigFromFlags();
    REQUIRE(larger.ok());
    CHECK(larger->max_message_bytes == 5000000);
    CHECK(larger->service.max_message_bytes == 5000000);
  }
  CHECK(config->shutdown_grace_seconds == 10);
  CHECK(config->service.host_memory_budget_bytes == (3LL << 29));
  CHECK(config->service.bearer_token == "secret");

  SECTION("--compute_workers is accepted, ignored, and said to be") {
    CHECK(config->deprecation_notes.empty());  // not given
    ScopedFlag workers("compute_workers", "4");
    auto deprecated = ServerConfigFromFlags();
    REQUIRE(deprecated.ok());
    REQUIRE(deprecated->deprecation_notes.size() == 1);
    CHECK(deprecated->deprecation_notes[0].find("--compute_workers=4 is deprecated and ignored") !=
          std::string::npos);
    CHECK(deprecated->deprecation_notes[0].find("--threads") != std::string::npos);
  }
  SECTION("--openai_listen: off by default, a host:port, refused naming the flag") {
    CHECK_FALSE(config->openai.has_value());
    {
      ScopedFlag openai("openai_listen", "127.0.0.1:8000");
      auto on = ServerConfigFromFlags();
      REQUIRE(on.ok());
      REQUIRE(on->openai.has_value());
      CHECK(on->openai->host == "127.0.0.1");
      CHECK(on->openai->port == 8000);
    }
    ScopedFlag bad("openai_listen", "8000");
    auto refused = ServerConfigFromFlags();
    REQUIRE_FALSE(refused.ok());
    CHECK(std::string(refused.status().message()).find("--openai_listen") != std::string::npos);
  }
  SECTION("--openai_request_timeout_seconds: 30 by default, 1 to 3600, refused naming the flag") {
    CHECK(config->openai_request_timeout_seconds == 30);
    {
      ScopedFlag timeout("openai_request_timeout_seconds", "3600");
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->openai_request_timeout_seconds == 3600);
    }
    for (const char* bad : {"0", "-5", "3601"}) {
      INFO(bad);
      ScopedFlag timeout("openai_request_timeout_seconds", bad);
      auto refused = ServerConfigFromFlags();
      REQUIRE_FALSE(refused.ok());
      CHECK(std::string(refused.status().message())
                .find(absl::StrCat("--openai_request_timeout_seconds=", bad, ": must be at")) !=
            std::string::npos);
    }
  }
  SECTION("--mixed_lower_only_forwards: on by default, off when given false") {
    CHECK(config->mixed_lower_only_forwards);
    ScopedFlag mixed("mixed_lower_only_forwards", "false");
    auto off = ServerConfigFromFlags();
    REQUIRE(off.ok());
    CHECK_FALSE(off->mixed_lower_only_forwards);
  }
  SECTION("--step_tokens: 0 (the engine's step size) by default, a count, never negative, at "
          "most 2^20") {
    CHECK(config->service.step_tokens == 0);
    for (const char* good : {"512", "1048576"}) {
      ScopedFlag step("step_tokens", good);
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->service.step_tokens == std::stoll(good));
    }
    {
      ScopedFlag step("step_tokens", "-1");
      auto refused = ServerConfigFromFlags();
      CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(refused.status().message().find("--step_tokens=-1: must be at least 0") !=
            std::string::npos);
    }
    // Above it, up to INT64_MAX (which overflowed the conversion to forward
    // positions in main): refused by name, with the limit.
    for (const char* bad : {"1048577", "9223372036854775807"}) {
      INFO(bad);
      ScopedFlag step("step_tokens", bad);
      auto refused = ServerConfigFromFlags();
      CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(refused.status().message().find(std::string("--step_tokens=") + bad +
                                            ": must be at most 1048576") != std::string::npos);
    }
  }
  SECTION("--engine_stall_seconds: 300 by default, 0 (off) up to 10^9, never negative, no "
          "value that overflows the conversion to milliseconds") {
    CHECK(config->engine_stall_seconds == 300);
    for (const char* good : {"0", "1", "1000000000"}) {
      INFO(good);
      ScopedFlag stall("engine_stall_seconds", good);
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->engine_stall_seconds == std::stoll(good));
    }
    {
      ScopedFlag stall("engine_stall_seconds", "-1");
      auto refused = ServerConfigFromFlags();
      CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(refused.status().message().find("--engine_stall_seconds=-1: must be at least 0") !=
            std::string::npos);
    }
    // 9223372036854776 is the first value whose milliseconds overflow int64
    // (INT64_MAX / 1000 + 1): main's conversion wrapped it to a negative
    // limit, which turned the watchdog and /livez off without a word.
    for (const char* bad : {"1000000001", "9223372036854776", "9223372036854775807"}) {
      INFO(bad);
      ScopedFlag stall("engine_stall_seconds", bad);
      auto refused = ServerConfigFromFlags();
      CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(refused.status().message().find(std::string("--engine_stall_seconds=") + bad +
                                            ": must be at most 1000000000") != std::string::npos);
    }
    // Not a whole number of seconds, or beyond int64: absl's parser refuses
    // it before ServerConfigFromFlags runs, naming the flag on the command
    // line (cli::ParseCommandLine exits with its message).
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag("engine_stall_seconds");
    REQUIRE(flag != nullptr);
    for (const char* bad : {"inf", "nan", "1.5", "1e3", "9223372036854775808", ""}) {
      INFO(bad);
      std::string error;
      CHECK_FALSE(flag->ParseFrom(bad, &error));
      CHECK_FALSE(error.empty());
    }
    CHECK(flag->CurrentValue() == "300");  // a refused value changes nothing
  }
  SECTION("--decode_slowdown_limit: 2 by default, at least 1 or 0 (off); "
          "--decode_step_prefill_tokens: -1 (no cap) by default, never below -1") {
    CHECK(config->service.decode_slowdown_limit == 2.0);
    CHECK(config->service.decode_step_prefill_tokens == -1);
    for (const char* good : {"1", "1.5", "0"}) {
      ScopedFlag limit("decode_slowdown_limit", good);
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->service.decode_slowdown_limit == std::stod(good));
    }
    for (const char* bad : {"0.5", "-1", "nan", "inf"}) {
      INFO(bad);
      ScopedFlag limit("decode_slowdown_limit", bad);
      auto refused = ServerConfigFromFlags();
      CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(refused.status().message().find("--decode_slowdown_limit=") != std::string::npos);
      CHECK(refused.status().message().find("must be at least 1") != std::string::npos);
    }
    {
      ScopedFlag cap("decode_step_prefill_tokens", "0");
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->service.decode_step_prefill_tokens == 0);
    }
    ScopedFlag cap("decode_step_prefill_tokens", "-2");
    auto refused = ServerConfigFromFlags();
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("--decode_step_prefill_tokens=-2: must be at least -1") !=
          std::string::npos);
  }
  SECTION("auto picks what ResolveDevice picks for --cuda_device, with a note saying why") {
    ScopedFlag device("device", "auto");
    auto resolved = ServerConfigFromFlags();
    REQUIRE(resolved.ok());
    auto expected = ResolveDevice(Device::kAuto, 0);
    REQUIRE(expected.ok());
    CHECK(resolved->device == DeviceName(expected->device));
    CHECK(resolved->service.device == resolved->device);  // GetModelInfo says it
    CHECK(resolved->device_note == expected->note);
    if (expected->device == Device::kCuda) {
      CHECK(resolved->service.precision == "bf16");
    } else {
      CHECK(resolved->service.precision == "fp32");
      CHECK(resolved->device_note.find("device auto: using cpu (") != std::string::npos);
    }
    // A GPU index no machine has: cpu, naming the index.
    ScopedFlag index("cuda_device", "4096");
    auto far = ServerConfigFromFlags();
    REQUIRE(far.ok());
    CHECK(far->device == "cpu");
    CHECK(far->service.precision == "fp32");
    CHECK(far->device_note.find("device auto: using cpu (") != std::string::npos);
    if (CudaBackendBuilt() && ProbeCuda().device_count.ok()) {
      CHECK(far->device_note.find("device index 4096 requested") != std::string::npos);
    }
  }
  SECTION("cuda is accepted when built (the GPU is checked at startup), refused otherwise") {
    ScopedFlag device("device", "cuda");
    auto parsed = ServerConfigFromFlags();
    if (CudaBackendBuilt()) {
      REQUIRE(parsed.ok());
      CHECK(parsed->device == "cuda");
      CHECK(parsed->cuda_device == 0);
      CHECK(parsed->service.precision == "bf16");  // GetModelInfo and the metric say so
      ScopedFlag precision("cuda_precision", "fp32");
      auto fp32 = ServerConfigFromFlags();
      REQUIRE(fp32.ok());
      CHECK(fp32->service.precision == "fp32");
    } else {
      CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(parsed.status().message().find("no CUDA backend") != std::string::npos);
    }
  }
  SECTION("--cuda_precision: bf16 by default, fp32 on request, anything else refused") {
    CHECK(config->cuda_precision == CudaPrecision::kBf16);
    {
      ScopedFlag precision("cuda_precision", "fp32");
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->cuda_precision == CudaPrecision::kFp32);
    }
    ScopedFlag precision("cuda_precision", "tf32");
    auto refused = ServerConfigFromFlags();
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("--cuda_precision: unknown CUDA precision 'tf32': "
                                          "expected bf16 or fp32") != std::string::npos);
  }
  SECTION("--cuda_chunk_store: kv by default, encoder_rows on request, anything else refused") {
    CHECK(config->cuda_chunk_store == CudaChunkStore::kKeysValues);
    {
      ScopedFlag store("cuda_chunk_store", "encoder_rows");
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->cuda_chunk_store == CudaChunkStore::kEncoderRows);
    }
    ScopedFlag store("cuda_chunk_store", "c");
    auto refused = ServerConfigFromFlags();
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("--cuda_chunk_store: unknown CUDA chunk store 'c': "
                                          "expected kv or encoder_rows") != std::string::npos);
  }
  SECTION("--cuda_chunk_tier: host by default, device or auto on request, anything else refused") {
    CHECK(config->cuda_chunk_tier == CudaChunkTier::kHost);
    for (const auto& [name, tier] : {std::pair{"device", CudaChunkTier::kDevice},
                                     std::pair{"auto", CudaChunkTier::kAuto},
                                     std::pair{"host", CudaChunkTier::kHost}}) {
      ScopedFlag flag("cuda_chunk_tier", name);
      auto parsed = ServerConfigFromFlags();
      REQUIRE(parsed.ok());
      CHECK(parsed->cuda_chunk_tier == tier);
    }
    ScopedFlag flag("cuda_chunk_tier", "gpu");
    auto refused = ServerConfigFromFlags();
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("--cuda_chunk_tier: unknown CUDA chunk tier 'gpu': "
                                          "expected host, device or auto") != std::string::npos);
  }
  SECTION("--cuda_* flags on the cpu backend are named in one note (review-cuda F7)") {
    ScopedFlag cpu("device", "cpu");
    auto plain = ServerConfigFromFlags();
    REQUIRE(plain.ok());
    CHECK(plain->cuda_flags_note.empty());  // none given
    ScopedFlag graphs("cuda_decode_graphs", "true");
    ScopedFlag tier("cuda_chunk_tier", "device");
    ScopedFlag precision("cuda_precision", "fp32");
    auto ignored = ServerConfigFromFlags();
    REQUIRE(ignored.ok());
    CHECK(ignored->cuda_flags_note ==
          "--cuda_precision=fp32, --cuda_chunk_tier=device, --cuda_decode_graphs ignored: "
          "backend cpu (they apply to --device=cuda only)");
    if (CudaBackendBuilt()) {
      // On cuda they apply: no note.
      ScopedFlag cuda("device", "cuda");
      auto applied = ServerConfigFromFlags();
      REQUIRE(applied.ok());
      CHECK(applied->cuda_flags_note.empty());
    }
  }
  SECTION("--cuda_state_export: off by default, on when given") {
    CHECK_FALSE(config->cuda_state_export);
    ScopedFlag on("cuda_state_export", "true");
    auto parsed = ServerConfigFromFlags();
    REQUIRE(parsed.ok());
    CHECK(parsed->cuda_state_export);
  }
  SECTION("--cuda_batched_step_rows: off by default, on when given") {
    CHECK_FALSE(config->cuda_batched_step_rows);
    ScopedFlag on("cuda_batched_step_rows", "true");
    auto parsed = ServerConfigFromFlags();
    REQUIRE(parsed.ok());
    CHECK(parsed->cuda_batched_step_rows);
  }
  SECTION("--cuda_decode_graphs: off by default, on when given") {
    CHECK_FALSE(config->cuda_decode_graphs);
    ScopedFlag on("cuda_decode_graphs", "true");
    auto parsed = ServerConfigFromFlags();
    REQUIRE(parsed.ok());
    CHECK(parsed->cuda_decode_graphs);
  }
  SECTION("--cuda_decode_fused_gemv: off by default, on when given") {
    CHECK_FALSE(config->cuda_decode_fused_gemv);
    ScopedFlag on("cuda_decode_fused_gemv", "true");
    auto parsed = ServerConfigFromFlags();
    REQUIRE(parsed.ok());
    CHECK(parsed->cuda_decode_fused_gemv);
  }
  SECTION("an unknown device is refused with the choices") {
    ScopedFlag device("device", "gpu");
    auto refused = ServerConfigFromFlags();
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("--device=gpu: expected cpu, cuda or auto") !=
          std::string::npos);
  }
  SECTION("a TLS key without a certificate is refused") {
    ScopedFlag key("tls_key", "/tmp/key.pem");
    auto refused = ServerConfigFromFlags();
    CHECK(refused.status().message().find("--tls_cert and --tls_key") != std::string::npos);
  }
  SECTION("every bad value is named at once") {
    ScopedFlag sessions("max_sessions", "0");
    ScopedFlag listen("listen", "nowhere");
    auto refused = ServerConfigFromFlags();
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("--max_sessions=0") != std::string::npos);
    CHECK(refused.status().message().find("'nowhere'") != std::string::npos);
  }
}

TEST_CASE("prefix cache flags: the bytes default is a quarter of the budget on cpu, off on cuda",
          "[server][flags][prefix_cache]") {
  ScopedFlag model("model", "/models/tiny");
  ScopedFlag no_http("http_listen", "");
  // The function the flags' parse uses, for both devices (a cuda build is
  // not needed to check it).
  CHECK(PrefixCacheBytesForDevice(-1, "cpu") == -1);  // main makes it a quarter of the budget
  CHECK(PrefixCacheBytesForDevice(-1, "cuda") == 0);
  CHECK(PrefixCacheBytesForDevice(0, "cuda") == 0);
  CHECK(PrefixCacheBytesForDevice(1 << 20, "cuda") == 1 << 20);  // given: taken
  CHECK(PrefixCacheBytesForDevice(1 << 20, "cpu") == 1 << 20);
  SECTION("cpu: the default stays on, no warning") {
    ScopedFlag device("device", "cpu");
    auto config = ServerConfigFromFlags();
    REQUIRE(config.ok());
    CHECK(config->service.prefix_cache.max_bytes == -1);
    CHECK(config->service.prefix_cache.max_entries == 32);
    CHECK(config->prefix_cache_note.empty());
  }
  SECTION("cuda: off by default, a given value taken with a WARNING about device memory") {
    if (!CudaBackendBuilt()) {
      WARN("no CUDA backend in this build: --device=cuda is refused, only the function checked");
      return;
    }
    ScopedFlag device("device", "cuda");
    auto config = ServerConfigFromFlags();
    REQUIRE(config.ok());
    CHECK(config->service.prefix_cache.max_bytes == 0);
    CHECK(config->prefix_cache_note.empty());
    ScopedFlag bytes("prefix_cache_bytes", "1000000");
    auto given = ServerConfigFromFlags();
    REQUIRE(given.ok());
    CHECK(given->service.prefix_cache.max_bytes == 1000000);
    CHECK(given->prefix_cache_note.find("WARNING: --prefix_cache_bytes=1000000") !=
          std::string::npos);
    CHECK(given->prefix_cache_note.find("GPU memory") != std::string::npos);
    ScopedFlag no_entries("prefix_cache_entries", "0");  // off by the other flag: no warning
    auto off = ServerConfigFromFlags();
    REQUIRE(off.ok());
    CHECK(off->prefix_cache_note.empty());
  }
}

}  // namespace
}  // namespace drt::server
