// Megatron-style tensor parallelism for the decoder: each of `world` shards holds heads /
// world attention heads (q, k, v column-split by head, the output projection row-split) and
// intermediate / world MLP columns (up/gate column-split, down row-split); norms,
// embeddings and the LM head are replicated. Two all-reduces per layer (after the
// attention output and after the MLP down projection) sum the shards' partial results.
// TensorParallelCpuModel runs the shards on CPU threads with a shared-memory all-reduce:
// the split math, testable anywhere. A GPU version needs one GPU per shard and NCCL.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/tensor.h"
#include "llm/decoder_model.h"

namespace kiln::llm {

// The shape of one shard; an Error when heads, kv heads or the MLP width do not divide.
DecoderConfig shardConfig(const DecoderConfig& c, int world);
// Shard `rank` of the weights, under the same Hugging Face names with the shard's shapes.
// Row-parallel biases stay on rank 0 (the all-reduce adds them once).
std::map<std::string, Tensor> shardWeights(const DecoderConfig& c, const std::map<std::string, Tensor>& w, int rank, int world);

class TensorParallelCpuModel : public LanguageModel {
public:
    TensorParallelCpuModel(const DecoderConfig& c, const std::map<std::string, Tensor>& w, int world);
    ~TensorParallelCpuModel() override;
    static std::unique_ptr<TensorParallelCpuModel> load(const std::filesystem::path& dir, int world);

    const DecoderConfig& config() const override { return config_; }
    // One cache for all shards: shard r's keys and values are kv heads [r*k, (r+1)*k).
    PagedKvCache makeCache(int64_t block_size, int64_t num_blocks) const override;
    std::vector<float> forwardBatch(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const override;
    std::string device() const override { return "cpu x" + std::to_string(world_) + " (tensor parallel)"; }

private:
    struct Reducer;
    DecoderConfig config_;
    int world_;
    std::vector<std::unique_ptr<DecoderModel>> shards_;
    std::unique_ptr<Reducer> reducer_;
};

}  // namespace kiln::llm
