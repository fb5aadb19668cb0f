#include "llm/cuda/l2_prefetch.h"

#include <algorithm>

namespace kiln::llm::cuda {

void L2PrefetchPlan::assign(std::vector<std::pair<const void*, size_t>> weights) {
    weights_ = std::move(weights);
    starts_.assign(1, 0);
    for (const auto& w : weights_) starts_.push_back(starts_.back() + w.second);
    cursor_ = 0;
}

L2Prefetch L2PrefetchPlan::request(size_t from, size_t ahead) {
    L2Prefetch out;
    const size_t stop = std::min(starts_.back(), (from + ahead) / 16 * 16);
    size_t at = std::max(cursor_, from);
    int used = 0;
    // The weight holding byte `at`: the last start at or before it.
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin()) - 1;
    while (at < stop && i < weights_.size() && used < L2Prefetch::kMaxRanges) {
        const size_t offset = at - starts_[i], bytes = std::min(stop, starts_[i + 1]) - at;
        if (bytes > 0) {
            out.ptr[used] = static_cast<const char*>(weights_[i].first) + offset;
            out.bytes[used] = static_cast<uint32_t>(bytes);
            ++used;
        }
        at += bytes;
        ++i;
    }
    cursor_ = std::max(cursor_, at);
    return out;
}

}  // namespace kiln::llm::cuda
