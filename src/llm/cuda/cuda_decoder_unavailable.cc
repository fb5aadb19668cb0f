// Kiln built without CUDA: the GPU decoder says so.
#include "ir/error.h"
#include "llm/cuda/cuda_decoder_model.h"

namespace kiln::llm {

std::unique_ptr<LanguageModel> makeCudaDecoderModel(const DecoderConfig&, const std::map<std::string, Tensor>&, CudaDecoderOptions) {
    throw Error("--target cuda: this Kiln was built without CUDA (configure with nvcc present and KILN_ENABLE_CUDA=ON)");
}

std::unique_ptr<LanguageModel> loadCudaDecoderModel(const std::filesystem::path&, CudaDecoderOptions) {
    throw Error("--target cuda: this Kiln was built without CUDA (configure with nvcc present and KILN_ENABLE_CUDA=ON)");
}

}  // namespace kiln::llm
