// The CUDA target in a build made without the CUDA toolkit: every entry point explains
// that the target is missing instead of failing to link.
#include "backends/cuda/cuda_executor.h"
#include "ir/error.h"

namespace kiln::cuda {

namespace {
const char* kMissing = "this build of Kiln has no CUDA support (configure with the CUDA toolkit installed)";
}

bool deviceAvailable(std::string* why) {
    if (why) *why = kMissing;
    return false;
}
std::string deviceSignature() { throw Error(std::string("target cuda: ") + kMissing); }

struct CudaExecutor::Impl {};
CudaExecutor::CudaExecutor(const Graph&, CudaOptions) { throw Error(std::string("target cuda: ") + kMissing); }
CudaExecutor::~CudaExecutor() = default;
std::vector<Tensor> CudaExecutor::run(const std::map<std::string, Tensor>&) { throw Error(kMissing); }
const CudaStats& CudaExecutor::stats() const { throw Error(kMissing); }
const std::map<std::string, std::string>& CudaExecutor::chosenTactics() const { throw Error(kMissing); }
std::map<std::string, std::string> calibrateTactics(const Graph&, const RouteValues&, const std::map<std::string, Dims>&) { throw Error(kMissing); }

}  // namespace kiln::cuda
