// L2 prefetch of decode-step weights (host side: what each kernel asks for). Batch-1 decode
// streams every weight once per step, but HBM idles while attention runs and at each kernel
// boundary; a kernel that asks L2 for the next kernels' first weights then fills those gaps,
// and the small GEMM that reads them hits L2. Plain C++ (no CUDA headers): the plan is
// tested without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kiln::llm::cuda {

// Byte ranges one kernel prefetches (16-byte aligned, sizes multiples of 16; empty ones unused).
struct L2Prefetch {
    static constexpr int kMaxRanges = 4;
    const void* ptr[kMaxRanges] = {};
    uint32_t bytes[kMaxRanges] = {};
};

// The step's weights laid end to end in the order its kernels read them, and how far into
// that order prefetches have been asked for.
class L2PrefetchPlan {
public:
    // (address, bytes) of each weight in read order; addresses 16-byte aligned.
    void assign(std::vector<std::pair<const void*, size_t>> weights);
    size_t weights() const { return weights_.size(); }
    size_t begin(size_t i) const { return starts_[i]; }
    size_t end(size_t i) const { return starts_[i + 1]; }
    // The ranges from where the last request stopped (or `from`, if later) up to
    // `from + ahead` bytes into the order (16-byte multiples, at most kMaxRanges weights);
    // later requests start where this one stops.
    L2Prefetch request(size_t from, size_t ahead);
    void restart() { cursor_ = 0; }

private:
    std::vector<std::pair<const void*, size_t>> weights_;
    std::vector<size_t> starts_{0};
    size_t cursor_ = 0;
};

}  // namespace kiln::llm::cuda
