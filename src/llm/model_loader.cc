#include "llm/model_loader.h"

#include "ir/error.h"
#include "llm/cuda/cuda_decoder_model.h"
#include "llm/decoder_model.h"
#include "llm/tensor_parallel.h"

namespace kiln::llm {

std::vector<std::string> llmTargets() { return {"cpu", "cuda"}; }

std::unique_ptr<LanguageModel> loadLanguageModel(const std::string& path, const std::string& target, int tp, const LlmRuntimeOptions& options) {
    check(tp >= 1, "--tp must be at least 1");
    if (target == "cuda") {
        // GPU tensor parallelism needs one GPU per shard and NCCL between them; no multi-GPU
        // machine has been available to build and check it, so it is refused rather than guessed.
        check(tp == 1, "--tp " + std::to_string(tp) + " with --target cuda is not available: GPU tensor parallelism (NCCL) is not built yet; use --target cpu --tp N or --tp 1");
        return loadCudaDecoderModel(path, options.cuda);
    }
    check(target == "cpu", "unknown LLM target '" + target + "' (targets: cpu, cuda)");
    if (tp > 1) return TensorParallelCpuModel::load(path, tp);
    return std::make_unique<DecoderModel>(DecoderModel::load(path));
}

}  // namespace kiln::llm
