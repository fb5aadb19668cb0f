#include "tools/llm_common.h"

#include <filesystem>
#include <sstream>

#include "llm/llm_parameters.h"
#include "llm/model_loader.h"

namespace kiln::tools {

LoadedLlm loadLlm(const std::string& dir, const LlmTarget& target) {
    namespace fs = std::filesystem;
    check(fs::is_directory(dir) || (fs::is_regular_file(dir) && fs::path(dir).extension() == ".onnx"),
          dir + ": not a model folder (config.json and model.safetensors or its shards, or model.onnx) nor an .onnx file");
    LoadedLlm m;
    m.model = llm::loadLanguageModel(dir, target.device, target.tp, llm::llmRuntimeOptions(llm::parseLlmRoute(target.route, target.device)));
    m.tokenizer = llm::loadTokenizer(fs::is_directory(dir) ? fs::path(dir) : fs::path(dir).parent_path());
    return m;
}

void addLlmTargetOption(CLI::App& cmd, LlmTarget& target) {
    cmd.add_option("--target", target.device, "Where the model runs: cpu (f32) or cuda (f16 weights and KV cache on the GPU)")->check(CLI::IsMember(llm::llmTargets()));
    cmd.add_option("--tp", target.tp, "Tensor-parallel shards (Megatron split; on the CPU one thread per shard)")->check(CLI::PositiveNumber);
    cmd.add_option("--route", target.route, "LLM runtime parameters, name=value pairs separated by ';' (kiln routes MODEL_DIR lists them)");
    target.command = &cmd;
}

void applyLlmRoute(const LlmTarget& target, llm::SchedulerOptions& options) {
    const BuildRoute route = llm::parseLlmRoute(target.route, target.device);
    const llm::LlmRuntimeOptions typed = llm::llmRuntimeOptions(route);
    auto take = [&](const char* param, const char* flag, int64_t& value, int64_t from_route) {
        if (route.get(param) == llm::llmSpace().get(param).default_value) return;
        const bool flag_given = target.command && target.command->get_option_no_throw(flag) && target.command->count(flag) > 0;
        check(!flag_given, std::string(flag) + " and --route " + param + " both set it; give one");
        value = from_route;
    };
    take("llm.block_size", "--block-size", options.block_size, typed.block_size);
    take("llm.max_num_tokens", "--max-num-tokens", options.max_num_tokens, typed.max_num_tokens);
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
