#include "engine/cpu/cpu_backend.h"

#include <thread>

#include "engine/cpu/cpu_session.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/thread_pool.h"

namespace drt {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& config, const ModelWeights& weights,
             const CpuBackendOptions& options)
      : config_(config),
        weights_(weights),
        options_(options),
        pool_(options.num_threads > 0 ? options.num_threads
                                      : static_cast<int>(std::thread::hardware_concurrency())) {
    cpu::UseSingleThreadedBlas();
  }
  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }
  absl::StatusOr<std::unique_ptr<BackendSession>> NewSession() override {
    return std::make_unique<cpu::CpuSession>(config_, weights_, options_, pool_);
  }

 private:
  const ModelConfig& config_;
  const ModelWeights& weights_;
  CpuBackendOptions options_;
  cpu::ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const ModelConfig& config, const ModelWeights& weights,
                                        const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(config, weights, options);
}

}  // namespace drt
