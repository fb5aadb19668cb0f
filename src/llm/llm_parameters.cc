#include "llm/llm_parameters.h"

#include "ir/error.h"

namespace kiln::llm {

namespace {

const char* kOnOff[] = {"on", "off"};

std::vector<ParameterSpec> llmParameters() {
    const std::vector<std::string> on_off(std::begin(kOnOff), std::end(kOnOff));
    const std::string sched = "llm/scheduler", gpu = "llm/cuda";
    return {
        {"llm.block_size", {"8", "16", "32", "64", "128"}, "16", sched, "KV cache block size in tokens (the paged cache's page)"},
        {"llm.max_num_tokens", {"16", "32", "64", "128", "256", "512", "1024"}, "64", sched,
         "Tokens computed per step, prompt chunks and decodes together (the chunked-prefill budget)"},
        {"llm.cuda.graphs", on_off, "on", gpu, "Decode steps replay a CUDA graph captured per batch size"},
        {"llm.cuda.small_gemm", on_off, "on", gpu, "Steps of at most 4 tokens run the fused small GEMMs (off: cuBLAS throughout)"},
        {"llm.cuda.pdl", on_off, "on", gpu, "Programmatic dependent launch: a kernel starts during its predecessor's tail (sm_90+)"},
        {"llm.cuda.fused_argmax", on_off, "on", gpu, "Greedy small steps take the argmax in the LM head's epilogue"},
        {"llm.cuda.gemv_row_pairs", on_off, "on", gpu, "Short rows of the small GEMM go in pairs where a warp would have several tasks"},
        {"llm.cuda.gemv_half_products", {"f32", "f16x8", "f16x16", "f16_chunk"}, "f16x16", gpu,
         "Small GEMM products: f32, or f16 products summed in f16 eight, sixteen or a chunk at a time"},
        {"llm.cuda.gemv_ctas_per_sm", {"auto", "1", "2", "3", "4"}, "auto", gpu, "Resident small-GEMM CTAs per SM (auto: as occupancy allows)"},
        {"llm.cuda.weights_evict_first", on_off, "on", gpu, "Weight loads marked evict-first in L2"},
        {"llm.cuda.gemv_red_add", on_off, "on", gpu, "Residual adds as reductions in L2 instead of load and store"},
        {"llm.cuda.gemv_leave_room", {"off", "two_chunks", "one_chunk", "auto"}, "auto", gpu,
         "A small GEMM runs in half a wave, leaving room for the next kernel's loads: never, up to two chunks a warp, one, or by weight size"},
        {"llm.cuda.attention_splits", {"1", "2", "4", "8", "16"}, "16", gpu, "Most key splits of decode attention (flash-decoding)"},
        {"llm.cuda.attention_keys", {"auto", "4", "8"}, "auto", gpu, "Keys in flight per group in decode attention (auto: 8 when few token-head pairs)"},
        {"llm.cuda.attention_min_split", {"64", "128", "256", "512"}, "256", gpu, "Fewest keys a decode-attention split takes"},
    };
}

int indexOf(const ParameterSpec& p, const std::string& value) {
    for (size_t i = 0; i < p.values.size(); ++i)
        if (p.values[i] == value) return static_cast<int>(i);
    throw Error(p.name + ": unknown value '" + value + "'");
}

}  // namespace

const ParameterSpace& llmSpace() {
    static const ParameterSpace space(llmParameters());
    return space;
}

bool llmParameterApplies(const std::string& name, const std::string& target) { return target == "cuda" || !name.starts_with("llm.cuda."); }

LlmRuntimeOptions llmRuntimeOptions(const BuildRoute& route) {
    const ParameterSpace& space = llmSpace();
    auto on = [&](const char* name) { return route.get(name) == "on"; };
    // "auto" is 0 in the knobs that have it (CTAs per SM, attention keys).
    auto number = [&](const char* name) {
        const std::string& v = route.get(name);
        return v == "auto" ? 0 : std::stoi(v);
    };
    LlmRuntimeOptions o;
    o.block_size = number("llm.block_size");
    o.max_num_tokens = number("llm.max_num_tokens");
    o.cuda.cuda_graphs = on("llm.cuda.graphs");
    o.cuda.small_gemm = on("llm.cuda.small_gemm");
    DecoderKnobs& k = o.cuda.knobs;
    k.pdl = on("llm.cuda.pdl");
    k.fused_argmax = on("llm.cuda.fused_argmax");
    k.gemv_row_pairs = on("llm.cuda.gemv_row_pairs");
    k.gemv_half_products = indexOf(space.get("llm.cuda.gemv_half_products"), route.get("llm.cuda.gemv_half_products"));
    k.gemv_ctas_per_sm = number("llm.cuda.gemv_ctas_per_sm");
    k.weights_evict_first = on("llm.cuda.weights_evict_first");
    k.gemv_red_add = on("llm.cuda.gemv_red_add");
    k.gemv_leave_room = indexOf(space.get("llm.cuda.gemv_leave_room"), route.get("llm.cuda.gemv_leave_room"));
    k.attention_splits = number("llm.cuda.attention_splits");
    k.attention_keys = number("llm.cuda.attention_keys");
    k.attention_min_split = number("llm.cuda.attention_min_split");
    return o;
}

void checkLlmRouteTarget(const BuildRoute& route, const std::string& target, const std::string& flag) {
    for (const auto& p : llmSpace().parameters())
        check(llmParameterApplies(p.name, target) || route.get(p.name) == p.default_value,
              [&] { return flag + ": " + p.name + " applies to --target cuda only, not " + target; });
}

BuildRoute parseLlmRoute(const std::string& text, const std::string& target) {
    BuildRoute route = BuildRoute::parse(text, llmSpace());
    checkLlmRouteTarget(route, target, "--route");
    return route;
}

}  // namespace kiln::llm
