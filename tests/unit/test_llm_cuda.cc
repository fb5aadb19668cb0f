// The GPU decoder against the CPU reference decoder (same weights): logits of mixed
// prefill/decode batches, CUDA-graph decode steps, and greedy generation through the
// scheduler. Skipped (and says so) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "backends/cuda/cuda_executor.h"
#include "llm/cuda/argmax_key.h"
#include "llm/cuda/small_gemm_plan.h"
#include "llm/cuda/cuda_decoder_model.h"
#include "llm/decoder_model.h"
#include "llm/llm_parameters.h"
#include "llm/scheduler.h"
#include "llm_test_models.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "llm/cuda/decoder_kernels.h"
#endif

using namespace kiln;
using namespace kiln::llm;
using namespace kiln::llm::testing;

namespace {

DecoderConfig gpuConfig(Family family) {
    DecoderConfig c = tinyConfig(family);
    c.vocab = 101, c.hidden = 128, c.heads = 2, c.head_dim = 64, c.intermediate = 192, c.max_positions = 128;
    c.kv_heads = family == Family::Llama ? 1 : 2;
    return c;
}

std::vector<int64_t> tokens(int64_t n, int64_t salt, int64_t vocab) {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < n; ++i) t.push_back((i * 7 + salt * 13 + 3) % vocab);
    return t;
}

bool gpuPresent() {
    std::string why;
    return kiln::cuda::deviceAvailable(&why);
}

class LlmCuda : public ::testing::TestWithParam<Family> {};

TEST_P(LlmCuda, LogitsMatchTheCpuDecoderInMixedAndDecodeSteps) {
    if (!gpuPresent()) GTEST_SKIP() << "no CUDA GPU here: the GPU decoder test is skipped";
    DecoderConfig c = gpuConfig(GetParam());
    c.vocab = 4099;  // odd and larger than a wave of GEMV warps: the LM head's rows go in pairs, the last alone (rowPairs)
    const auto w = randomWeights(c, 3, 0.05f);
    const DecoderModel cpu(c, w);
    const auto gpu = makeCudaDecoderModel(c, w);
    PagedKvCache cpu_cache = cpu.makeCache(4, 80), gpu_cache = gpu->makeCache(4, 80), argmax_cache = gpu->makeCache(4, 80);
    // Three sequences: prompts of 13, 7 and 1 tokens, then decode steps (graph-captured).
    std::vector<std::vector<int64_t>> seqs = {tokens(13, 1, c.vocab), tokens(7, 2, c.vocab), tokens(1, 3, c.vocab)};
    std::vector<int64_t> cpu_ids, gpu_ids;
    for (size_t s = 0; s < seqs.size(); ++s) cpu_ids.push_back(cpu_cache.addSequence()), gpu_ids.push_back(gpu_cache.addSequence());
    for (size_t s = 0; s < seqs.size(); ++s) ASSERT_EQ(argmax_cache.addSequence(), gpu_ids[s]);
    for (int step = 0; step < 6; ++step) {
        std::vector<SequenceChunk> cpu_chunks, gpu_chunks;
        std::vector<std::vector<int64_t>> run(seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s) {
            run[s] = step == 0 ? seqs[s] : std::vector<int64_t>{(step * 11 + static_cast<int64_t>(s) * 5) % c.vocab};
            ASSERT_TRUE(cpu_cache.reserve(cpu_ids[s], static_cast<int64_t>(run[s].size())));
            ASSERT_TRUE(gpu_cache.reserve(gpu_ids[s], static_cast<int64_t>(run[s].size())));
            ASSERT_TRUE(argmax_cache.reserve(gpu_ids[s], static_cast<int64_t>(run[s].size())));
            cpu_chunks.push_back({cpu_ids[s], run[s]});
            gpu_chunks.push_back({gpu_ids[s], run[s]});
        }
        const auto want = cpu.forwardBatch(cpu_cache, cpu_chunks);
        const auto got = gpu->forwardBatch(gpu_cache, gpu_chunks);
        const auto ids = gpu->forwardBatchArgmax(argmax_cache, gpu_chunks);  // the same kernels, then the device argmax
        ASSERT_EQ(got.size(), want.size());
        ASSERT_EQ(ids.size(), seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s) {
            const std::span<const float> g(got.data() + s * c.vocab, c.vocab), r(want.data() + s * c.vocab, c.vocab);
            EXPECT_LT(relativeL2(g, r), 2e-2) << "step " << step << " sequence " << s;
            // The GPU's top token is the CPU's, or within f16 error of it (a near tie).
            const auto top = std::max_element(g.begin(), g.end()) - g.begin();
            EXPECT_EQ(ids[s], top) << "step " << step << " sequence " << s << ": device argmax";
            const float best = *std::max_element(r.begin(), r.end());
            EXPECT_LT(best - r[top], 2e-2f * (std::abs(best) + 1.f)) << "step " << step << " sequence " << s << ": GPU picks " << top;
        }
    }
    EXPECT_EQ(gpu_cache.length(gpu_ids[0]), 13 + 5);
}

TEST_P(LlmCuda, GreedyGenerationThroughTheSchedulerMatchesTheCpu) {
    if (!gpuPresent()) GTEST_SKIP() << "no CUDA GPU here: the GPU decoder test is skipped";
    const DecoderConfig c = gpuConfig(GetParam());
    const auto w = randomWeights(c, 4, 0.05f);
    const DecoderModel cpu(c, w);
    const auto gpu = makeCudaDecoderModel(c, w);
    SchedulerOptions o;
    o.max_batch_size = 4, o.max_num_tokens = 16, o.block_size = 4, o.num_blocks = 40;  // chunked prefill and preemption both happen
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t r = 0; r < 6; ++r) prompts.push_back(tokens(5 + 3 * r, r, c.vocab));
    const auto want = greedyThroughScheduler(cpu, o, prompts, 12), got = greedyThroughScheduler(*gpu, o, prompts, 12);
    int same = 0, total = 0;
    for (size_t r = 0; r < want.size(); ++r) {
        ASSERT_EQ(got[r].size(), want[r].size());
        for (size_t k = 0; k < want[r].size(); ++k) same += got[r][k] == want[r][k], ++total;
        EXPECT_EQ(got[r].front(), want[r].front()) << "request " << r;
    }
    // f16 against f32 may flip a near tie late in a sequence; the rest agrees token for token.
    EXPECT_GE(same, total * 9 / 10) << same << " of " << total << " tokens agree";
}

// Prompts longer than the attention kernel's key tile (256: the keys split over CTAs, two
// and three of them here), then batch-1 decode steps (the fused small-GEMM path) next to the
// same steps through cuBLAS, against the CPU.
TEST_P(LlmCuda, LongContextDecodeMatchesTheCpuOnBothGemmPaths) {
    if (!gpuPresent()) GTEST_SKIP() << "no CUDA GPU here: the GPU decoder test is skipped";
    DecoderConfig c = gpuConfig(GetParam());
    c.max_positions = 640;
    if (GetParam() == Family::Llama) c.heads = 4, c.kv_heads = 2, c.head_dim = 128, c.hidden = 256, c.intermediate = 320;
    const auto w = randomWeights(c, 5, 0.05f);
    const DecoderModel cpu(c, w);
    CudaDecoderOptions cublas_only;
    cublas_only.small_gemm = false;
    const auto fused = makeCudaDecoderModel(c, w), plain = makeCudaDecoderModel(c, w, cublas_only);
    for (const int64_t prompt : {300, 530}) {
        PagedKvCache cpu_cache = cpu.makeCache(16, 48), fused_cache = fused->makeCache(16, 48), plain_cache = plain->makeCache(16, 48);
        const int64_t a = cpu_cache.addSequence(), b = fused_cache.addSequence(), d = plain_cache.addSequence();
        std::vector<int64_t> run = tokens(prompt, 7, c.vocab);
        for (int step = 0; step < 8; ++step) {
            const int64_t n = static_cast<int64_t>(run.size());
            ASSERT_TRUE(cpu_cache.reserve(a, n) && fused_cache.reserve(b, n) && plain_cache.reserve(d, n));
            const auto want = cpu.forwardBatch(cpu_cache, std::vector<SequenceChunk>{{a, run}});
            const auto got = fused->forwardBatch(fused_cache, std::vector<SequenceChunk>{{b, run}});
            const auto also = plain->forwardBatch(plain_cache, std::vector<SequenceChunk>{{d, run}});
            EXPECT_LT(relativeL2(got, want), 2e-2) << "fused path, prompt " << prompt << ", step " << step;
            EXPECT_LT(relativeL2(also, want), 2e-2) << "cuBLAS path, prompt " << prompt << ", step " << step;
            run = {(step * 17 + 5) % c.vocab};
        }
        EXPECT_EQ(fused_cache.length(b), prompt + 7);
    }
}

// Every llm.cuda.* choice set away from its default at once (each selects other kernels or
// launch settings, never other arithmetic's intent): logits of prefill and decode steps stay
// close to the CPU's, through the route that `--route` and `kiln tune` use.
TEST_P(LlmCuda, NonDefaultDecoderParametersKeepTheLogits) {
    if (!gpuPresent()) GTEST_SKIP() << "no CUDA GPU here: the GPU decoder test is skipped";
    const DecoderConfig c = gpuConfig(GetParam());
    const auto w = randomWeights(c, 6, 0.05f);
    const DecoderModel cpu(c, w);
    for (const char* route : {"llm.cuda.pdl=off;llm.cuda.fused_argmax=off;llm.cuda.gemv_row_pairs=off;llm.cuda.gemv_half_products=f32;llm.cuda.gemv_ctas_per_sm=1;"
                              "llm.cuda.weights_evict_first=off;llm.cuda.gemv_red_add=off;llm.cuda.gemv_leave_room=off;llm.cuda.attention_splits=1;llm.cuda.attention_keys=4",
                              "llm.cuda.gemv_half_products=f16_chunk;llm.cuda.gemv_leave_room=one_chunk;llm.cuda.attention_keys=8;llm.cuda.attention_min_split=64;llm.cuda.graphs=off"}) {
        const auto gpu = makeCudaDecoderModel(c, w, llmRuntimeOptions(parseLlmRoute(route, "cuda")).cuda);
        PagedKvCache cpu_cache = cpu.makeCache(16, 48), gpu_cache = gpu->makeCache(16, 48);
        const int64_t a = cpu_cache.addSequence(), b = gpu_cache.addSequence();
        std::vector<int64_t> run = tokens(40, 3, c.vocab);
        for (int step = 0; step < 6; ++step) {
            const int64_t n = static_cast<int64_t>(run.size());
            ASSERT_TRUE(cpu_cache.reserve(a, n) && gpu_cache.reserve(b, n));
            const auto want = cpu.forwardBatch(cpu_cache, std::vector<SequenceChunk>{{a, run}});
            const auto got = gpu->forwardBatch(gpu_cache, std::vector<SequenceChunk>{{b, run}});
            EXPECT_LT(relativeL2(got, want), 2e-2) << route << ", step " << step;
            run = {(step * 13 + 2) % c.vocab};
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Families, LlmCuda, ::testing::Values(Family::Gpt2, Family::Llama),
                         [](const auto& info) { return std::string(info.param == Family::Gpt2 ? "Gpt2" : "Llama"); });

#ifdef KILN_WITH_CUDA
// The device argmax behind greedy steps: GPT-2's vocabulary, the lowest id among equal
// maxima (far apart, so different threads and warps hold them), NaNs never winning.
TEST(LlmCudaArgmax, LowestIdAmongEqualMaximaAndNaNsIgnored) {
    if (!gpuPresent()) GTEST_SKIP() << "no CUDA GPU here: the device argmax test is skipped";
    const int n = 50257, rows = 4;
    std::vector<float> x(static_cast<size_t>(rows) * n);
    uint32_t state = 7;
    for (auto& v : x) v = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) / 16777216.f * 20.f - 10.f;
    x[0 * n + 41000] = 30.f, x[0 * n + 777] = 30.f;                                 // tie: 777 wins
    x[1 * n + 5] = std::nanf(""), x[1 * n + 9] = 50.f, x[1 * n + 50256] = 50.f;  // tie: 9 wins
    x[2 * n + 50256] = 11.f;                                                         // the last id
    x[3 * n + 0] = 10.5f;                                                            // the first id
    float* dx = nullptr;
    int32_t* dids = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dx), x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dids), rows * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    llm::cuda::launchArgmax(rows, n, dx, dids, nullptr);
    std::vector<int32_t> ids(rows);
    ASSERT_EQ(cudaMemcpy(ids.data(), dids, rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dx), cudaFree(dids);
    EXPECT_EQ(ids, (std::vector<int32_t>{777, 9, 50256, 0}));
}
#endif

// The keys whose maximum the LM head's epilogue takes for greedy steps (host code, so this
// runs without a GPU): ordered by value, then the lower index; the index comes back.
TEST(LlmArgmaxKey, OrdersByValueThenTheLowerIndex) {
    using llm::cuda::argmaxKey, llm::cuda::argmaxKeyIndex;
    const float ascending[] = {-INFINITY, -3.5e10f, -2.f, -1e-30f, 0.f, 1e-30f, 0.5f, 2.f, 3.5e10f, INFINITY};
    for (size_t i = 0; i + 1 < std::size(ascending); ++i)
        EXPECT_LT(argmaxKey(ascending[i], 0), argmaxKey(ascending[i + 1], 1000)) << ascending[i] << " < " << ascending[i + 1];
    EXPECT_GT(argmaxKey(1.5f, 7), argmaxKey(1.5f, 8));    // a tie: the lower index wins
    EXPECT_EQ(argmaxKey(-0.f, 3), argmaxKey(0.f, 3));     // -0 == +0, as comparisons say
    EXPECT_GT(argmaxKey(-INFINITY, 50256), 0ull);         // above "no key yet"
    for (int index : {0, 1, 777, 50256, 151935}) EXPECT_EQ(argmaxKeyIndex(argmaxKey(-1.25f, index)), index);
    EXPECT_EQ(argmaxKeyIndex(0), 0);  // no key (all NaN): id 0, as the argmax kernel answers
    // Against std::max_element (first maximum) over random rows with planted ties.
    uint32_t state = 11;
    for (int row = 0; row < 20; ++row) {
        std::vector<float> x(1000);
        for (auto& v : x) v = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) / 16777216.f * 8.f - 4.f;
        x[(row * 37) % 1000] = x[(row * 91 + 500) % 1000] = 4.5f;
        unsigned long long best = 0;
        for (int i = 0; i < 1000; ++i) best = std::max(best, argmaxKey(x[i], i));
        EXPECT_EQ(argmaxKeyIndex(best), std::max_element(x.begin(), x.end()) - x.begin()) << "row " << row;
    }
}

// The small GEMM's launch rules at the H200's wave (132 SMs, two CTAs of 8 warps each), for
// the shapes they were measured on (host code, so this runs without a GPU).
TEST(LlmSmallGemmPlan, RowPairsAndLeavingRoomWhereTheyWereMeasuredToPay) {
    using llm::cuda::leaveRoomFits, llm::cuda::rowPairsPay, llm::cuda::smallGemmChunks;
    const int64_t wave = 2 * 132 * 8, half_wave = wave / 2;
    EXPECT_EQ(smallGemmChunks(768, 1), 1);
    EXPECT_EQ(smallGemmChunks(3072, 1), 2);
    EXPECT_EQ(smallGemmChunks(3072, 2), 3);
    EXPECT_EQ(smallGemmChunks(2048, 2), 2);
    EXPECT_EQ(smallGemmChunks(5632, 1), 3);
    // GPT-2 (K 768 and 3072): the LM head and fc in pairs; o and down, one task per warp, not.
    EXPECT_TRUE(rowPairsPay(50257, 768, wave));
    EXPECT_TRUE(rowPairsPay(3072, 768, wave));
    EXPECT_FALSE(rowPairsPay(768, 768, wave));
    EXPECT_FALSE(rowPairsPay(768, 3072, wave));
    // Llama-1.1B: rows of 256 pieces (and 5632's 704) fill single rows' loads as well.
    EXPECT_FALSE(rowPairsPay(32000, 2048, wave));
    EXPECT_FALSE(rowPairsPay(2048, 5632, wave));
    // Leaving room. Llama's o (2048 rows, one chunk) before gate|up (46 MB against 8): yes;
    // gate|up and down (more chunks than two per warp of half the wave): no.
    const int64_t llama_o = 2048ll * 2048 * 2, llama_up = 2ll * 5632 * 2048 * 2, llama_down = 2048ll * 5632 * 2;
    EXPECT_TRUE(leaveRoomFits(2048, half_wave, llama_o, llama_up));
    EXPECT_FALSE(leaveRoomFits(5632ll * smallGemmChunks(2048, 2), half_wave, llama_up, llama_down));
    EXPECT_FALSE(leaveRoomFits(2048ll * 3, half_wave, llama_down, 2560ll * 2048 * 2));
    // GPT-2's o (768 chunks): yes; fc in pairs (1536) before down and down (1536) before
    // q|k|v, whose weights are no more than twice theirs: no (measured faster on the whole wave).
    const int64_t gpt2_fc = 3072ll * 768 * 2, gpt2_qkv = 2304ll * 768 * 2;
    EXPECT_TRUE(leaveRoomFits(768, half_wave, 768ll * 768 * 2, gpt2_fc));
    EXPECT_FALSE(leaveRoomFits(1536, half_wave, gpt2_fc, gpt2_fc));
    EXPECT_FALSE(leaveRoomFits(768ll * 2, half_wave, gpt2_fc, gpt2_qkv));
    EXPECT_TRUE(leaveRoomFits(1536, half_wave, gpt2_fc, gpt2_fc, 1));  // the old rule, KILN_LLM_GEMV_LEAVE_ROOM=1
    EXPECT_FALSE(leaveRoomFits(768, half_wave, 768ll * 768 * 2, 0));  // nothing streams next (attention, the step's end)
    EXPECT_FALSE(leaveRoomFits(768, half_wave, 768ll * 768 * 2, gpt2_fc, 0));
}

TEST(LlmCudaNoDevice, TargetCudaFailsWithOneClearError) {
    if (gpuPresent()) GTEST_SKIP() << "a GPU is present";
    const DecoderConfig c = gpuConfig(Family::Gpt2);
    try {
        makeCudaDecoderModel(c, randomWeights(c, 1));
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
    }
}

}  // namespace
