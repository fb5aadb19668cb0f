// The shape of a decoder-only transformer, read from a Hugging Face config.json: the GPT-2
// family (LayerNorm, learned positions, GELU MLP) and the Llama family (RMSNorm, RoPE,
// SwiGLU, grouped-query attention).
#pragma once
#include <filesystem>
#include <string>

namespace kiln::llm {

enum class Family { Gpt2, Llama };

struct DecoderConfig {
    Family family = Family::Gpt2;
    int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, max_positions = 0;
    float norm_eps = 1e-5f;
    float rope_theta = 10000.f;
    bool tie_embeddings = true;

    // Parses config.json text; `where` names the file in errors.
    static DecoderConfig parse(const std::string& json_text, const std::string& where);
    static DecoderConfig load(const std::filesystem::path& path);
};

}  // namespace kiln::llm
