#include "llm/paged_kv_cache.h"

#include "ir/error.h"

namespace kiln::llm {

PagedKvCache::PagedKvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t num_blocks, bool host_storage)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), block_size_(block_size) {
    check(layers > 0 && kv_heads > 0 && head_dim > 0 && block_size > 0 && num_blocks > 0, "KV cache: sizes must be positive");
    if (host_storage) storage_.assign(static_cast<size_t>(num_blocks * 2 * layers * kv_heads * block_size * head_dim), 0.f);
    refcount_.assign(num_blocks, 0);
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t PagedKvCache::addSequence() {
    sequences_[next_id_] = {};
    return next_id_++;
}

void PagedKvCache::release(int32_t block) {
    if (--refcount_[block] > 0) return;
    auto h = block_hash_.find(block);
    if (h != block_hash_.end()) {
        auto it = prefix_index_.find(h->second);
        if (it != prefix_index_.end() && it->second == block) prefix_index_.erase(it);
        block_hash_.erase(h);
    }
    free_.push_back(block);
}

void PagedKvCache::freeSequence(int64_t seq) {
    auto it = sequences_.find(seq);
    check(it != sequences_.end(), "KV cache: unknown sequence " + std::to_string(seq));
    for (int32_t b : it->second.blocks) release(b);
    sequences_.erase(it);
}

uint64_t PagedKvCache::prefixHash(std::span<const int64_t> tokens) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
    for (int64_t t : tokens)
        for (int i = 0; i < 8; ++i) h = (h ^ ((static_cast<uint64_t>(t) >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}

int64_t PagedKvCache::sharePrefix(int64_t seq, std::span<const int64_t> tokens) {
    Sequence& s = sequences_.at(seq);
    check(s.tokens.empty(), "KV cache: prefix sharing needs an empty sequence");
    // Leave at least one token to compute, so the caller always gets logits.
    const int64_t full = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
    for (int64_t b = 0; b < full; ++b) {
        auto it = prefix_index_.find(prefixHash(tokens.subspan(0, (b + 1) * block_size_)));
        if (it == prefix_index_.end()) break;
        ++refcount_[it->second];
        s.blocks.push_back(it->second);
        s.tokens.insert(s.tokens.end(), tokens.begin() + b * block_size_, tokens.begin() + (b + 1) * block_size_);
    }
    return static_cast<int64_t>(s.tokens.size());
}

bool PagedKvCache::reserve(int64_t seq, int64_t n) {
    Sequence& s = sequences_.at(seq);
    const int64_t need = (static_cast<int64_t>(s.tokens.size()) + n + block_size_ - 1) / block_size_ - static_cast<int64_t>(s.blocks.size());
    if (need > static_cast<int64_t>(free_.size())) return false;
    for (int64_t i = 0; i < need; ++i) {
        const int32_t b = free_.back();
        free_.pop_back();
        refcount_[b] = 1;
        s.blocks.push_back(b);
    }
    return true;
}

void PagedKvCache::append(int64_t seq, std::span<const int64_t> tokens) {
    Sequence& s = sequences_.at(seq);
    const int64_t before = static_cast<int64_t>(s.tokens.size());
    check(before + static_cast<int64_t>(tokens.size()) <= static_cast<int64_t>(s.blocks.size()) * block_size_, "KV cache: append beyond the reserved blocks");
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
    for (int64_t end = (before / block_size_ + 1) * block_size_; end <= static_cast<int64_t>(s.tokens.size()); end += block_size_) {
        const int32_t block = s.blocks[end / block_size_ - 1];
        const uint64_t h = prefixHash(std::span<const int64_t>(s.tokens).subspan(0, end));
        if (prefix_index_.emplace(h, block).second) block_hash_[block] = h;
    }
}

float* PagedKvCache::slot(int64_t seq, int64_t layer, int64_t head, int64_t pos, int kv) {
    check(!storage_.empty(), "KV cache: keys and values of this cache live on the device");
    const Sequence& s = sequences_.at(seq);
    const int64_t block = s.blocks.at(pos / block_size_);
    const int64_t index = ((((block * 2 + kv) * layers_ + layer) * kv_heads_ + head) * block_size_ + pos % block_size_) * head_dim_;
    return storage_.data() + index;
}

KvCacheStats PagedKvCache::stats() const {
    KvCacheStats st;
    st.blocks_total = static_cast<int64_t>(refcount_.size());
    for (int32_t r : refcount_) {
        st.blocks_used += r > 0;
        st.shared_blocks += r > 1;
    }
    for (const auto& [id, s] : sequences_) st.tokens_stored += static_cast<int64_t>(s.tokens.size());
    // Shared blocks hold their tokens once.
    int64_t distinct = 0;
    std::unordered_map<int32_t, int64_t> filled;
    for (const auto& [id, s] : sequences_)
        for (size_t b = 0; b < s.blocks.size(); ++b)
            filled[s.blocks[b]] = std::max<int64_t>(filled[s.blocks[b]], std::min<int64_t>(block_size_, static_cast<int64_t>(s.tokens.size()) - static_cast<int64_t>(b) * block_size_));
    for (const auto& [b, n] : filled) distinct += std::max<int64_t>(n, 0);
    st.utilization = st.blocks_used ? static_cast<double>(distinct) / static_cast<double>(st.blocks_used * block_size_) : 0.0;
    return st;
}

}  // namespace kiln::llm
