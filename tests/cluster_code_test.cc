// kernels/cluster_code.h: which compiled code of the split decode kernel can
// run its thread block clusters, and MakeCudaBackend's refusal message for a
// build without it (window_decode_splits > 1). The versions are those
// cudaFuncGetAttributes reports (major * 10 + minor).
#include <string>

#include <catch2/catch.hpp>

#include "kernels/cluster_code.h"

namespace drt::kernels {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("cluster code: the PTX version decides, not the JIT target", "[cluster_code]") {
  // An sm_90 build on an H100.
  CHECK(HasClusterCode(90, 90));
  // A later architecture's code (sm_100 on a Blackwell) has clusters too.
  CHECK(HasClusterCode(100, 100));
  // A build for sm_80 only: the driver JIT-compiles its compute_80 PTX for
  // the H100, so the binary version reads 90, but the code is the __trap()
  // branch compiled for __CUDA_ARCH__ 800.
  CHECK_FALSE(HasClusterCode(80, 90));
  CHECK_FALSE(HasClusterCode(80, 80));
  CHECK_FALSE(HasClusterCode(89, 90));
  // An undefined PTX version (0, old cubins): the binary version decides.
  CHECK(HasClusterCode(0, 90));
  CHECK_FALSE(HasClusterCode(0, 80));
}

TEST_CASE("cluster code: a build without sm_90 is refused by name for splits above 1",
          "[cluster_code]") {
  for (int splits : {2, 4, 8}) {
    INFO("splits " << splits);
    const absl::Status s = CheckSplitDecodeCode(splits, 80, 90);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Contains("window_decode_splits " + std::to_string(splits)));
    CHECK_THAT(std::string(s.message()), Contains("built without sm_90"));
    CHECK_THAT(std::string(s.message()), Contains("PTX version is 80"));
    CHECK(CheckSplitDecodeCode(splits, 90, 90).ok());
  }
  // 0 (the row kernel) and 1 (one block, no cluster) run on any build.
  CHECK(CheckSplitDecodeCode(0, 80, 90).ok());
  CHECK(CheckSplitDecodeCode(1, 80, 80).ok());
}

}  // namespace
}  // namespace drt::kernels
