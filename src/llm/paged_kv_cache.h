// The paged KV cache: keys and values live in fixed-size blocks; each sequence has a block
// table. Blocks are reference-counted so sequences with a common prompt prefix share the
// full blocks of that prefix (found by a hash of the tokens up to each block's end).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace kiln::llm {

struct KvCacheStats {
    int64_t blocks_total = 0, blocks_used = 0, tokens_stored = 0, shared_blocks = 0;
    double utilization = 0;  // tokens stored / (blocks used * block size)
};

class PagedKvCache {
public:
    // With host_storage false the cache only manages blocks; the keys and values live with
    // the model that computes them (a GPU model keeps them in device memory, device_storage).
    PagedKvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t num_blocks, bool host_storage = true);

    int64_t addSequence();
    void freeSequence(int64_t seq);
    // Attaches cached blocks holding a prefix of `tokens` to an empty sequence; returns how
    // many tokens are already in the cache (a multiple of the block size, < tokens.size()).
    int64_t sharePrefix(int64_t seq, std::span<const int64_t> tokens);
    // Makes room for `n` more tokens; false (and no change) when the blocks run out.
    bool reserve(int64_t seq, int64_t n);
    // After the K/V of `tokens` were written at the sequence's end: records them, and
    // offers each newly filled block for prefix sharing.
    void append(int64_t seq, std::span<const int64_t> tokens);

    int64_t length(int64_t seq) const { return sequences_.at(seq).tokens.size(); }
    std::span<const int32_t> blockTable(int64_t seq) const { return sequences_.at(seq).blocks; }
    int64_t blockSize() const { return block_size_; }
    int64_t freeBlocks() const { return static_cast<int64_t>(free_.size()); }
    int64_t numBlocks() const { return static_cast<int64_t>(refcount_.size()); }
    // Device-side key/value storage of a GPU model (opaque here; owned with the cache).
    std::shared_ptr<void> device_storage;
    // Key / value vector (head_dim floats) of token `pos` of a sequence.
    float* key(int64_t seq, int64_t layer, int64_t head, int64_t pos) { return slot(seq, layer, head, pos, 0); }
    float* value(int64_t seq, int64_t layer, int64_t head, int64_t pos) { return slot(seq, layer, head, pos, 1); }
    KvCacheStats stats() const;

private:
    struct Sequence {
        std::vector<int32_t> blocks;
        std::vector<int64_t> tokens;
    };
    float* slot(int64_t seq, int64_t layer, int64_t head, int64_t pos, int kv);
    void release(int32_t block);
    uint64_t prefixHash(std::span<const int64_t> tokens) const;

    int64_t layers_, kv_heads_, head_dim_, block_size_;
    std::vector<float> storage_;  // [block][k|v][layer][head][slot][head_dim]
    std::vector<int32_t> refcount_;
    std::vector<int32_t> free_;
    std::unordered_map<uint64_t, int32_t> prefix_index_;  // hash of tokens up to a block's end -> block
    std::unordered_map<int32_t, uint64_t> block_hash_;
    std::map<int64_t, Sequence> sequences_;
    int64_t next_id_ = 0;
};

}  // namespace kiln::llm
