#include "tools/llm_common.h"

#include <filesystem>
#include <sstream>

#include "llm/cuda/cuda_decoder_model.h"
#include "llm/decoder_model.h"
#include "llm/tensor_parallel.h"

namespace kiln::tools {

LoadedLlm loadLlm(const std::string& dir, const LlmTarget& target) {
    namespace fs = std::filesystem;
    check(fs::is_directory(dir) || (fs::is_regular_file(dir) && fs::path(dir).extension() == ".onnx"),
          dir + ": not a model folder (config.json and model.safetensors or its shards, or model.onnx) nor an .onnx file");
    LoadedLlm m;
    check(target.tp >= 1, "--tp must be at least 1");
    // GPU tensor parallelism needs one GPU per shard and NCCL between them; no multi-GPU
    // machine has been available to build and check it, so it is refused rather than guessed.
    check(target.device != "cuda" || target.tp == 1,
          "--tp " + std::to_string(target.tp) + " with --target cuda is not available: GPU tensor parallelism (NCCL) is not built yet; use --target cpu --tp N or --tp 1");
    if (target.device == "cuda") m.model = llm::loadCudaDecoderModel(dir);
    else if (target.tp > 1) m.model = llm::TensorParallelCpuModel::load(dir, target.tp);
    else m.model = std::make_unique<llm::DecoderModel>(llm::DecoderModel::load(dir));
    m.tokenizer = llm::loadTokenizer(fs::is_directory(dir) ? fs::path(dir) : fs::path(dir).parent_path());
    return m;
}

void addLlmTargetOption(CLI::App& cmd, LlmTarget& target) {
    cmd.add_option("--target", target.device, "Where the model runs: cpu (f32) or cuda (f16 weights and KV cache on the GPU)")->check(CLI::IsMember({"cpu", "cuda"}));
    cmd.add_option("--tp", target.tp, "Tensor-parallel shards (Megatron split; on the CPU one thread per shard)")->check(CLI::PositiveNumber);
}

std::vector<int64_t> parseTokenList(const std::string& text, const std::string& flag) {
    std::vector<int64_t> ids;
    std::stringstream ss(text);
    std::string part;
    while (std::getline(ss, part, ',')) {
        check(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos && part.size() < 10, flag + ": '" + part + "' is not a token id");
        ids.push_back(std::stoll(part));
    }
    check(!ids.empty(), flag + ": no token ids");
    return ids;
}

}  // namespace kiln::tools
