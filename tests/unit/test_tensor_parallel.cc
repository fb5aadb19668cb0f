// Tensor parallelism's split math on CPU threads: sharded weights plus two all-reduces per
// layer must reproduce the unsharded decoder (logits to float rounding, greedy tokens
// exactly), through the scheduler too.
#include <gtest/gtest.h>

#include <cmath>

#include "ir/error.h"
#include "llm/scheduler.h"
#include "llm/tensor_parallel.h"
#include "llm_test_models.h"

using namespace kiln;
using namespace kiln::llm;
using namespace kiln::llm::testing;

namespace {

DecoderConfig tpConfig(Family f) {
    DecoderConfig c = tinyConfig(f);
    c.heads = 4, c.kv_heads = f == Family::Llama ? 2 : 4, c.intermediate = 24;
    return c;
}

std::vector<float> runChunks(const LanguageModel& m, const std::vector<std::vector<int64_t>>& steps_tokens) {
    PagedKvCache cache = m.makeCache(4, 32);
    const int64_t seq = cache.addSequence();
    std::vector<float> all;
    for (const auto& t : steps_tokens) {
        EXPECT_TRUE(cache.reserve(seq, static_cast<int64_t>(t.size())));
        const SequenceChunk c{seq, t};
        auto l = m.forwardBatch(cache, std::span<const SequenceChunk>(&c, 1));
        all.insert(all.end(), l.begin(), l.end());
    }
    return all;
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<Family, int>> {};

TEST_P(TensorParallel, ShardsReproduceTheFullModel) {
    const auto [family, world] = GetParam();
    const DecoderConfig c = tpConfig(family);
    const auto w = randomWeights(c, 17);
    const DecoderModel full(c, w);
    const TensorParallelCpuModel tp(c, w, world);
    const std::vector<std::vector<int64_t>> steps = {{3, 1, 4, 1, 5, 9, 2}, {6}, {5}, {3, 5}};
    const auto want = runChunks(full, steps), got = runChunks(tp, steps);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
    EXPECT_LT(relativeL2(got, want), 1e-5) << "max abs difference " << worst;
    // Through the scheduler (batching, chunked prefill): greedy tokens identical.
    SchedulerOptions o;
    o.max_batch_size = 3, o.max_num_tokens = 8, o.block_size = 4, o.num_blocks = 48;
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t r = 0; r < 4; ++r) prompts.push_back({r + 1, 7, 2 * r + 3, 11, 5});
    EXPECT_EQ(greedyThroughScheduler(tp, o, prompts, 6), greedyThroughScheduler(full, o, prompts, 6));
}

INSTANTIATE_TEST_SUITE_P(SplitMath, TensorParallel,
                         ::testing::Values(std::make_tuple(Family::Gpt2, 2), std::make_tuple(Family::Gpt2, 4), std::make_tuple(Family::Llama, 2)),
                         [](const auto& info) {
                             return std::string(std::get<0>(info.param) == Family::Gpt2 ? "Gpt2" : "Llama") + "Tp" + std::to_string(std::get<1>(info.param));
                         });

TEST(TensorParallelErrors, SizesThatDoNotDivideAreRefused) {
    const DecoderConfig c = tpConfig(Family::Llama);  // 4 heads, 2 kv heads
    try {
        shardConfig(c, 4);
        FAIL() << "tp 4 over 2 kv heads was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--tp 4 does not divide"), std::string::npos) << e.what();
    }
    EXPECT_THROW(shardConfig(c, 0), Error);
}

}  // namespace
