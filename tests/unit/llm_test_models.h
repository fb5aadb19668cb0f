// Small random-weight decoder models (GPT-2 and Llama families) shared by the LLM tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ir/tensor.h"
#include "llm/decoder_config.h"
#include "llm/safetensors.h"
#include "llm/scheduler.h"

namespace kiln::llm::testing {

using Weights = std::map<std::string, Tensor>;

inline Tensor randomTensor(const Dims& dims, std::mt19937& rng, float scale = 0.2f) {
    Tensor t(DType::F32, dims);
    std::normal_distribution<float> n(0.f, scale);
    for (auto& v : t.span<float>()) v = n(rng);
    return t;
}

inline DecoderConfig tinyConfig(Family family) {
    DecoderConfig c;
    c.family = family;
    c.vocab = 37, c.hidden = 16, c.layers = 2, c.heads = 4, c.head_dim = 4, c.intermediate = 24, c.max_positions = 64;
    c.kv_heads = family == Family::Llama ? 2 : 4;  // grouped-query attention for Llama
    c.tie_embeddings = family == Family::Gpt2;
    return c;
}

// Matrices and biases drawn with standard deviation `scale`, norm weights with 1.
inline Weights randomWeights(const DecoderConfig& c, uint32_t seed, float scale = 0.2f) {
    std::mt19937 rng(seed);
    Weights w;
    const int64_t H = c.hidden, I = c.intermediate, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim;
    if (c.family == Family::Gpt2) {
        w["transformer.wte.weight"] = randomTensor({c.vocab, H}, rng, scale);
        w["transformer.wpe.weight"] = randomTensor({c.max_positions, H}, rng, scale);
        w["transformer.ln_f.weight"] = randomTensor({H}, rng, 1.f);
        w["transformer.ln_f.bias"] = randomTensor({H}, rng, scale);
        for (int64_t l = 0; l < c.layers; ++l) {
            const std::string n = "transformer.h." + std::to_string(l) + ".";
            for (const char* ln : {"ln_1", "ln_2"}) {
                w[n + ln + ".weight"] = randomTensor({H}, rng, 1.f);
                w[n + ln + ".bias"] = randomTensor({H}, rng, scale);
            }
            w[n + "attn.c_attn.weight"] = randomTensor({H, 3 * H}, rng, scale);
            w[n + "attn.c_attn.bias"] = randomTensor({3 * H}, rng, scale);
            w[n + "attn.c_proj.weight"] = randomTensor({H, H}, rng, scale);
            w[n + "attn.c_proj.bias"] = randomTensor({H}, rng, scale);
            w[n + "mlp.c_fc.weight"] = randomTensor({H, I}, rng, scale);
            w[n + "mlp.c_fc.bias"] = randomTensor({I}, rng, scale);
            w[n + "mlp.c_proj.weight"] = randomTensor({I, H}, rng, scale);
            w[n + "mlp.c_proj.bias"] = randomTensor({H}, rng, scale);
        }
    } else {
        w["model.embed_tokens.weight"] = randomTensor({c.vocab, H}, rng, scale);
        w["model.norm.weight"] = randomTensor({H}, rng, 1.f);
        w["lm_head.weight"] = randomTensor({c.vocab, H}, rng, scale);
        for (int64_t l = 0; l < c.layers; ++l) {
            const std::string n = "model.layers." + std::to_string(l) + ".";
            w[n + "input_layernorm.weight"] = randomTensor({H}, rng, 1.f);
            w[n + "post_attention_layernorm.weight"] = randomTensor({H}, rng, 1.f);
            w[n + "self_attn.q_proj.weight"] = randomTensor({Q, H}, rng, scale);
            w[n + "self_attn.k_proj.weight"] = randomTensor({KV, H}, rng, scale);
            w[n + "self_attn.v_proj.weight"] = randomTensor({KV, H}, rng, scale);
            w[n + "self_attn.o_proj.weight"] = randomTensor({H, Q}, rng, scale);
            w[n + "mlp.gate_proj.weight"] = randomTensor({I, H}, rng, scale);
            w[n + "mlp.up_proj.weight"] = randomTensor({I, H}, rng, scale);
            w[n + "mlp.down_proj.weight"] = randomTensor({H, I}, rng, scale);
        }
    }
    return w;
}

// ||got - want|| / ||want|| over two logit vectors.
inline double relativeL2(std::span<const float> got, std::span<const float> want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += double(want[i]) * want[i];
    return std::sqrt(num / std::max(den, 1e-30));
}

// Greedy outputs of `prompts` (max_tokens each) submitted together to one scheduler.
inline std::vector<std::vector<int64_t>> greedyThroughScheduler(const LanguageModel& m, const SchedulerOptions& o, const std::vector<std::vector<int64_t>>& prompts,
                                                                int64_t max_tokens) {
    Scheduler s(m, o);
    std::vector<int64_t> ids;
    for (const auto& p : prompts) {
        Request q;
        q.prompt = p;
        q.max_tokens = max_tokens;
        ids.push_back(s.add(q));
    }
    s.runToCompletion();
    std::vector<std::vector<int64_t>> out;
    for (int64_t id : ids) out.push_back(s.state(id).output);
    return out;
}

// A model folder (config.json, model.safetensors) in the temp folder, for the CLI and server.
inline std::filesystem::path writeModel(const DecoderConfig& c, const Weights& w, const std::string& name) {
    std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kiln_llm_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << (c.family == Family::Gpt2
        ? R"({"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 37, "n_inner": 24})"
        : R"({"model_type": "llama", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 24, "max_position_embeddings": 64, "vocab_size": 37, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})");
    writeSafetensors(dir / "model.safetensors", w);
    return dir;
}

// GPT-2's printable byte alphabet: the character byte-level BPE vocabularies use for byte b.
inline std::string byteChar(int b) {
    static std::vector<std::string> table = [] {
        std::vector<std::string> t(256);
        int next = 256;
        for (int x = 0; x < 256; ++x) {
            const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
            const int cp = printable ? x : next++;
            std::string s;
            if (cp < 0x80) s += static_cast<char>(cp);
            else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
            t[x] = s;
        }
        return t;
    }();
    return table[b];
}


// The 37 bytes of the tiny model's vocabulary (one token each): letters, ' ', ':', '\\n' and the
// bytes of 😀 (4), 中 (3) and é (2) split over tokens, and 0xFF, which is never valid.
inline std::vector<int> vocabularyBytes() {
    std::vector<int> bytes;
    for (int c = 'a'; c <= 'x'; ++c) bytes.push_back(c);
    for (int b : {0xF0, 0x9F, 0x98, 0x80, 0xE4, 0xB8, 0xAD, 0xC3, 0xA9, 0xFF, int(' '), int(':'), int('\n')}) bytes.push_back(b);
    return bytes;
}

// A byte-level BPE tokenizer.json without merges over vocabularyBytes().
inline std::string tokenizerJson() {
    nlohmann::json vocab = nlohmann::json::object();
    const auto bytes = vocabularyBytes();
    for (size_t i = 0; i < bytes.size(); ++i) vocab[byteChar(bytes[i])] = i;
    return nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}}.dump();
}

}  // namespace kiln::llm::testing
