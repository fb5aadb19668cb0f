// The argmax of a row as one integer per value, so that atomicMax over a row's keys finds it:
// the LM head's epilogue keeps each row's best key (greedy decode steps need no argmax
// kernel). Host and device code, so that the ordering is tested where there is no GPU.
#pragma once

#include <cstdint>
#include <cstring>

#include "llm/cuda/host_device.h"

namespace kiln::llm::cuda {

// Orders as (value, then the lower index): the float's bits made monotonic in the high half
// (-0 taken as +0, as comparisons do), the index's complement in the low half. 0 is below
// every key, so zeroed keys mean "none yet"; callers leave NaNs out.
KILN_HOST_DEVICE inline unsigned long long argmaxKey(float value, int index) {
    if (value == 0.f) value = 0.f;
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return (static_cast<unsigned long long>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}

// The index a key holds; 0 for a row without keys (all NaN), as the argmax kernel answers.
inline int64_t argmaxKeyIndex(unsigned long long key) { return key == 0 ? 0 : static_cast<int64_t>(0xFFFFFFFFull - (key & 0xFFFFFFFFull)); }

}  // namespace kiln::llm::cuda
