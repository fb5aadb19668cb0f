// bench/decode_megakernel_bench.cu --handoff: how long one dependent step takes on the GPU
// when it does nothing but hand a vector from every CTA to every CTA.
#pragma once
#include <vector>

#include "device_primitives.cuh"
#include "model_reference.cuh"

constexpr int kHandOffThreads = 256, kHandOffMax = 5632;

// The floor of one dependent step: every CTA waits for a whole vector of n flagged words that
// all CTAs wrote in the previous step, then writes its own slice of the next (value + 1), with
// no weights and no arithmetic. Steps alternate between two buffers. One load in flight per
// thread: right for 768 elements (3 per thread); larger vectors wait on each word in turn.
// sleep_ns > 0: a waiting thread sleeps between polls (less L2 traffic from the pollers).
__global__ void __launch_bounds__(kHandOffThreads, 1) handOff(Word* a, Word* b, int n, int steps, unsigned base, int sleep_ns) {
    __shared__ float v[kHandOffMax];
    const int cta = blockIdx.x, ctas = gridDim.x, r0 = int(long(n) * cta / ctas), r1 = int(long(n) * (cta + 1) / ctas);
    for (int s = 0; s < steps; ++s) {
        Word* in = s % 2 ? b : a;
        Word* out = s % 2 ? a : b;
        const unsigned flag = base + unsigned(s);
        for (int j = threadIdx.x; j < n; j += kHandOffThreads) v[j] = awaitWord(in + j, flag, sleep_ns);
        __syncthreads();
        for (int r = r0 + threadIdx.x; r < r1; r += kHandOffThreads) storeWord(out + r, v[r] + 1.f, base + unsigned(s) + 1u);
    }
}

static void runHandOff(int sms) {
    std::printf("\nhand-over floor: each step every CTA waits for all of a flagged vector and writes its slice\n%-6s %-10s %-10s %12s\n", "CTAs", "elements", "sleep ns", "us per step");
    Word *a, *b;
    CHECK(cudaMalloc(&a, kHandOffMax * 8));
    CHECK(cudaMalloc(&b, kHandOffMax * 8));
    CHECK(cudaMemset(b, 0, kHandOffMax * 8));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    unsigned base = 1;
    struct Case {
        int ctas, n, sleep_ns;
    };
    for (const Case c : {Case{sms, 768, 0}, Case{sms, 768, 32}, Case{sms, 768, 200}, Case{sms / 2, 768, 0}, Case{sms / 4, 768, 0}, Case{sms, 3072, 0},
                         Case{sms, 2048, 0}, Case{sms, 5632, 0}}) {
        const int n = c.n;
        std::vector<double> per_step;
        for (int rep = 0; rep < 7; ++rep) {
            const int steps = 2000;
            std::vector<Word> init(n, Word(base) << 32);  // step 0's input: zeros with flag base
            CHECK(cudaMemcpy(a, init.data(), n * 8, cudaMemcpyHostToDevice));
            int n_ = n, steps_ = steps;
            unsigned base_ = base;
            int sleep_ = c.sleep_ns;
            void* args[] = {&a, &b, &n_, &steps_, &base_, &sleep_};
            CHECK(cudaEventRecord(e0));
            CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(handOff), dim3(c.ctas), dim3(kHandOffThreads), args, 0, nullptr));
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            per_step.push_back(ms * 1e3 / steps);
            base += steps + 1;
        }
        std::printf("%-6d %-10d %-10d %12.3f\n", c.ctas, n, c.sleep_ns, median(per_step));
    }
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

