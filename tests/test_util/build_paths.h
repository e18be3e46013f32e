// Where the checkout and the built programs are, for tests.
//
// Only build_paths.cc is compiled with these absolute paths (CMake's
// definitions on the drt_test_paths library). A path compiled into a test
// file would make its object differ per checkout, so ccache could not reuse
// it across worktrees and clean clones; behind these functions every other
// test object is the same wherever the tree lies.
#pragma once

namespace drt::testing {

const char* SourceDir();  // the project's source directory

// The built programs (absolute paths in the build directory).
const char* ServerBinary();
const char* BenchBinary();
const char* NiahBinary();
const char* ClientBinary();
const char* TokenizerBenchBinary();
const char* NiahTextBinary();
const char* BatchBenchBinary();
const char* StepBenchBinary();
const char* DurableBenchBinary();
const char* PplBinary();
// nullptr when built without the CUDA kernels (no drt-window-bench).
const char* WindowBenchBinary();

}  // namespace drt::testing
