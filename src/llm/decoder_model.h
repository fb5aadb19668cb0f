// A decoder-only transformer (GPT-2 or Llama family) on the CPU, reading and writing its
// keys and values through the paged KV cache. This is the reference path of the LLM
// runtime: every token of a step is computed in f32, attention reads the cache through
// the sequence's block table (paged attention).
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ir/tensor.h"
#include "llm/language_model.h"

namespace kiln::llm {

// The key of weight `name` under the first of the prefixes that has it (e.g.
// "transformer." then ""); an Error naming the weight when none does.
std::string findWeightName(const std::map<std::string, Tensor>& w, const std::vector<std::string>& prefixes, const std::string& name);
// That weight, checked to be a float tensor with the shape the config implies.
const Tensor& findWeight(const std::map<std::string, Tensor>& w, const std::vector<std::string>& prefixes, const std::string& name, const Dims& dims);

// All elements of a float tensor of any float type, as f32.
std::vector<float> toFloats(const Tensor& t);
// A 2-D float tensor's elements transposed, as f32 (nn.Linear stores [out][in]; the forward
// pass wants [in][out]).
std::vector<float> transposed(const Tensor& t);

class DecoderModel : public LanguageModel {
public:
    // Weights by Hugging Face name (with or without the "transformer." / "model." prefix
    // styles of the two families); any float type, kept as f32.
    DecoderModel(DecoderConfig config, const std::map<std::string, Tensor>& weights);
    // A folder with config.json and model.safetensors.
    static DecoderModel load(const std::filesystem::path& dir);

    const DecoderConfig& config() const override { return config_; }
    PagedKvCache makeCache(int64_t block_size, int64_t num_blocks) const override;
    // The chunks one after another, each through forward().
    std::vector<float> forwardBatch(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const override;
    std::string device() const override { return "cpu"; }
    // A tensor-parallel shard (llm/tensor_parallel.h): its heads sit at kv_head_offset in a
    // cache shared by all shards; all_reduce sums the shards' partial attention and MLP
    // outputs (H floats per token, in place) before the residual add; one shard appends.
    struct ShardRole {
        int64_t kv_head_offset = 0;
        std::function<void(std::span<float>)> all_reduce;
        bool appends = true;
    };
    void setShardRole(ShardRole role) { shard_ = std::move(role); }
    // Runs `tokens` at the end of sequence `seq` (whose cache must have room), appends their
    // keys/values and returns the logits of the last token (all tokens' with all_logits).
    std::vector<float> forward(PagedKvCache& cache, int64_t seq, std::span<const int64_t> tokens, bool all_logits = false) const;

private:
    struct Layer {
        std::vector<float> norm1_w, norm1_b, norm2_w, norm2_b;
        std::vector<float> wq, wk, wv, bq, bk, bv, wo, bo;  // [in][out] row-major
        std::vector<float> w_up, b_up, w_gate, w_down, b_down;
    };
    void attention(PagedKvCache& cache, int64_t seq, int64_t layer, int64_t pos, const float* q, float* out) const;
    DecoderConfig config_;
    std::vector<float> embed_, positions_, final_w_, final_b_, lm_head_;  // lm_head [hidden][vocab]
    std::vector<Layer> layers_;
    ShardRole shard_;
};

}  // namespace kiln::llm
