// Device primitives of bench/decode_megakernel_bench.cu: timer, mbarrier and copy-engine
// wrappers, warp sums, activations, and the flagged words that carry values between CTAs.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "../cuda_bench_check.cuh"

__device__ __forceinline__ unsigned smemAddress(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbarInit(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smemAddress(bar)), "r"(count));
}
__device__ __forceinline__ void mbarArrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smemAddress(bar)) : "memory");
}
__device__ __forceinline__ void mbarExpect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smemAddress(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarWait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smemAddress(bar)), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulkCopy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smemAddress(dst)), "l"(src),
                 "r"(bytes), "r"(smemAddress(bar))
                 : "memory");
}
__device__ __forceinline__ float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))); }
__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

// Values that cross CTAs within a launch travel with the step that wrote them: a 64-bit word of
// value (low half) and flag (high half), written and read in one access, so that a reader that
// sees the flag it expects has the value, with no fence or counter (NCCL's LL protocol).
using Word = unsigned long long;

__device__ __forceinline__ Word loadWord(const Word* a) {
    Word v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory");
    return v;
}
__device__ __forceinline__ void storeWord(Word* a, float v, unsigned flag) {
    const Word w = (Word(flag) << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(a), "l"(w) : "memory");
}
__device__ __forceinline__ float valueOf(Word w) { return __uint_as_float(unsigned(w)); }
// The value at a once it carries flag (spins until then; sleep_ns > 0: sleeps between polls).
__device__ __forceinline__ float awaitWord(const Word* a, unsigned flag, int sleep_ns = 0) {
    Word w = loadWord(a);
    while (unsigned(w >> 32) != flag) {
        if (sleep_ns > 0) __nanosleep(sleep_ns);
        w = loadWord(a);
    }
    return valueOf(w);
}

