// Where a decoder model runs: the LLM runtime's targets, and loading a model folder onto
// one with a route's options. The tools name no target; they ask here.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "llm/language_model.h"
#include "llm/llm_parameters.h"

namespace kiln::llm {

// "cpu" (the f32 decoder, tensor parallel over threads) and "cuda" (f16 weights and KV
// cache on the GPU).
std::vector<std::string> llmTargets();

// A Hugging Face folder (or a decoder .onnx) on `target` with `tp` shards. An Error for an
// unknown target and for GPU tensor parallelism, which is not built.
std::unique_ptr<LanguageModel> loadLanguageModel(const std::string& path, const std::string& target, int tp, const LlmRuntimeOptions& options);

}  // namespace kiln::llm
