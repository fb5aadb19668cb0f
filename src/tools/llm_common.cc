#include "tools/llm_common.h"

#include <filesystem>
#include <sstream>

#include "llm/cuda/cuda_decoder_model.h"
#include "llm/decoder_model.h"

namespace kiln::tools {

LoadedLlm loadLlm(const std::string& dir, const std::string& target) {
    namespace fs = std::filesystem;
    check(fs::is_directory(dir), dir + ": not a folder (expected config.json and model.safetensors)");
    LoadedLlm m;
    if (target == "cuda") m.model = llm::loadCudaDecoderModel(dir);
    else m.model = std::make_unique<llm::DecoderModel>(llm::DecoderModel::load(dir));
    m.tokenizer = llm::loadTokenizer(dir);
    return m;
}

void addLlmTargetOption(CLI::App& cmd, std::string& target) {
    cmd.add_option("--target", target, "Where the model runs: cpu (f32) or cuda (f16 weights and KV cache on the GPU)")->check(CLI::IsMember({"cpu", "cuda"}));
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
