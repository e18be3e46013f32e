// The paths behind build_paths.h, from the definitions tests/CMakeLists.txt
// gives this file alone.
#include "tests/test_util/build_paths.h"

#if !defined(DRT_SOURCE_DIR) || !defined(DRT_SERVER_BINARY)
#error "tests/CMakeLists.txt defines DRT_SOURCE_DIR and the DRT_*_BINARY paths for drt_test_paths"
#endif

namespace drt::testing {

const char* SourceDir() { return DRT_SOURCE_DIR; }
const char* ServerBinary() { return DRT_SERVER_BINARY; }
const char* BenchBinary() { return DRT_BENCH_BINARY; }
const char* NiahBinary() { return DRT_NIAH_BINARY; }
const char* ClientBinary() { return DRT_CLIENT_BINARY; }
const char* TokenizerBenchBinary() { return DRT_TOKENIZER_BENCH_BINARY; }
const char* NiahTextBinary() { return DRT_NIAH_TEXT_BINARY; }
const char* BatchBenchBinary() { return DRT_BATCH_BENCH_BINARY; }
const char* StepBenchBinary() { return DRT_STEP_BENCH_BINARY; }
const char* DurableBenchBinary() { return DRT_DURABLE_BENCH_BINARY; }
const char* PplBinary() { return DRT_PPL_BINARY; }
const char* WindowBenchBinary() {
#ifdef DRT_WINDOW_BENCH_BINARY
  return DRT_WINDOW_BENCH_BINARY;
#else
  return nullptr;
#endif
}

}  // namespace drt::testing
