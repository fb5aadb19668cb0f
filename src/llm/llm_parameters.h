// The LLM runtime's tunable choices as parameters of the compiler's vocabulary: the
// scheduler's (both targets) and the GPU decoder step's (llm.cuda.*). `kiln routes MODEL_DIR`
// lists them, `--route` on generate, serve and bench-llm sets them, and `kiln tune MODEL_DIR`
// searches them.
#pragma once
#include <string>
#include <vector>

#include "llm/cuda/cuda_decoder_model.h"
#include "route/build_route.h"

namespace kiln::llm {

// Every LLM parameter, scheduler first; defaults are the runtime's defaults.
const ParameterSpace& llmSpace();
// Whether a parameter applies on a target ("cpu", "cuda"): llm.cuda.* on cuda only.
bool llmParameterApplies(const std::string& name, const std::string& target);

// What a route sets, typed.
struct LlmRuntimeOptions {
    int64_t block_size = 16;      // KV cache block size in tokens
    int64_t max_num_tokens = 64;  // tokens per step (chunked prefill budget)
    CudaDecoderOptions cuda;
};
LlmRuntimeOptions llmRuntimeOptions(const BuildRoute& route);

// An Error, naming `flag` and the parameter, when the route changes one that does not
// apply on `target`.
void checkLlmRouteTarget(const BuildRoute& route, const std::string& target, const std::string& flag);
// Parses a route for `target` (checkLlmRouteTarget, as --route).
BuildRoute parseLlmRoute(const std::string& text, const std::string& target);

}  // namespace kiln::llm
