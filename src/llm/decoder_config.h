// The shape of a decoder-only transformer, read from a Hugging Face config.json: the GPT-2
// family (LayerNorm, learned positions, GELU MLP) and the Llama family (RMSNorm, RoPE,
// SwiGLU, grouped-query attention).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::llm {

enum class Family { Gpt2, Llama };

struct DecoderConfig {
    Family family = Family::Gpt2;
    int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, max_positions = 0;
    float norm_eps = 1e-5f;
    float rope_theta = 10000.f;
    bool tie_embeddings = true;
    // End-of-sequence ids: generation stops after one unless a request ignores them.
    // config.json's eos_token_id (an id or a list), overridden by generation_config.json's.
    std::vector<int64_t> eos_token_ids;

    // Parses config.json text; `where` names the file in errors.
    static DecoderConfig parse(const std::string& json_text, const std::string& where);
    // Reads config.json at `path` and, when present beside it, generation_config.json.
    static DecoderConfig load(const std::filesystem::path& path);
};

}  // namespace kiln::llm
