// What the LLM runtime needs from a decoder model, whichever device computes it: the
// scheduler hands it every sequence's chunk of one step at once, so a GPU model can run
// them as one batch.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "llm/decoder_config.h"
#include "llm/paged_kv_cache.h"

namespace kiln::llm {

// Tokens to run at the end of one sequence in a step.
struct SequenceChunk {
    int64_t seq = 0;
    std::span<const int64_t> tokens;
};

// Checks that `tokens` can run at the end of sequence `seq`: at least one token, room
// reserved in the cache, ids inside the vocabulary and, when `positions_bounded` (learned
// positions, or block tables sized by max_positions), within the model's positions.
void checkChunk(const DecoderConfig& c, const PagedKvCache& cache, int64_t seq, std::span<const int64_t> tokens, bool positions_bounded);

class LanguageModel {
public:
    virtual ~LanguageModel() = default;
    virtual const DecoderConfig& config() const = 0;
    // A KV cache whose blocks live where this model computes.
    virtual PagedKvCache makeCache(int64_t block_size, int64_t num_blocks) const = 0;
    // Runs each chunk at the end of its sequence (the cache must have room reserved; one
    // chunk per sequence), appends their keys/values, and returns the logits of each
    // chunk's last token, chunk after chunk: [chunks.size()][vocab].
    virtual std::vector<float> forwardBatch(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const = 0;
    // As forwardBatch, but returns only the argmax of each chunk's logits (the lowest id
    // among equal maxima): the greedy next tokens. A GPU model finds them on the device and
    // copies a few ids instead of chunks x vocab logits.
    virtual std::vector<int64_t> forwardBatchArgmax(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const;
    // "cpu" or the GPU's name.
    virtual std::string device() const = 0;
};

}  // namespace kiln::llm
