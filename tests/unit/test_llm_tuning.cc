// The LLM runtime's parameters (llm/llm_parameters.h) and their tuner (tuner/llm_tuner.h):
// defaults equal to the runtime's own, routes checked per target, token agreement, and the
// CLI's routes, tune and --route on a tiny random-weight model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llm/decoder_model.h"
#include "llm/llm_parameters.h"
#include "llm_test_models.h"
#include "test_helpers.h"
#include "tuner/llm_tuner.h"

using namespace kiln;
using namespace kiln::llm;
using namespace kiln::llm::testing;
namespace fs = std::filesystem;

namespace {
nlohmann::json jsonOf(const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{'))); }
}  // namespace

TEST(LlmParameters, DefaultsAreTheRuntimeDefaultsAndValuesMapToOptions) {
    const LlmRuntimeOptions d = llmRuntimeOptions(BuildRoute::defaults(llmSpace()));
    const SchedulerOptions sched;
    EXPECT_EQ(d.block_size, sched.block_size);
    EXPECT_EQ(d.max_num_tokens, sched.max_num_tokens);
    const CudaDecoderOptions cuda;
    EXPECT_EQ(d.cuda.cuda_graphs, cuda.cuda_graphs);
    EXPECT_EQ(d.cuda.small_gemm, cuda.small_gemm);
    const DecoderKnobs k;
    const DecoderKnobs& got = d.cuda.knobs;
    EXPECT_EQ(std::tie(got.pdl, got.fused_argmax, got.gemv_row_pairs, got.weights_evict_first, got.gemv_red_add),
              std::tie(k.pdl, k.fused_argmax, k.gemv_row_pairs, k.weights_evict_first, k.gemv_red_add));
    EXPECT_EQ(std::tie(got.gemv_half_products, got.gemv_ctas_per_sm, got.gemv_leave_room, got.attention_splits, got.attention_keys, got.attention_min_split),
              std::tie(k.gemv_half_products, k.gemv_ctas_per_sm, k.gemv_leave_room, k.attention_splits, k.attention_keys, k.attention_min_split));
    const LlmRuntimeOptions o = llmRuntimeOptions(BuildRoute::parse(
        "llm.block_size=32;llm.max_num_tokens=256;llm.cuda.graphs=off;llm.cuda.pdl=off;llm.cuda.gemv_half_products=f32;llm.cuda.gemv_leave_room=off;"
        "llm.cuda.gemv_ctas_per_sm=2;llm.cuda.attention_keys=8;llm.cuda.attention_splits=4;llm.cuda.attention_min_split=64",
        llmSpace()));
    EXPECT_EQ(o.block_size, 32);
    EXPECT_EQ(o.max_num_tokens, 256);
    EXPECT_FALSE(o.cuda.cuda_graphs);
    EXPECT_FALSE(o.cuda.knobs.pdl);
    EXPECT_EQ(o.cuda.knobs.gemv_half_products, 0);
    EXPECT_EQ(o.cuda.knobs.gemv_leave_room, 0);
    EXPECT_EQ(o.cuda.knobs.gemv_ctas_per_sm, 2);
    EXPECT_EQ(o.cuda.knobs.attention_keys, 8);
    EXPECT_EQ(o.cuda.knobs.attention_splits, 4);
    EXPECT_EQ(o.cuda.knobs.attention_min_split, 64);
}

TEST(LlmParameters, GpuParametersAreRefusedOnTheCpu) {
    EXPECT_NO_THROW(parseLlmRoute("llm.cuda.pdl=off", "cuda"));
    EXPECT_NO_THROW(parseLlmRoute("llm.block_size=32", "cpu"));
    try {
        parseLlmRoute("llm.cuda.pdl=off", "cpu");
        ADD_FAILURE() << "a GPU parameter was accepted for the CPU";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("llm.cuda.pdl applies to --target cuda only"), std::string::npos) << e.what();
    }
    EXPECT_THROW(parseLlmRoute("llm.block_size=24", "cpu"), Error);  // not an allowed value
}

TEST(LlmTuning, TokenAgreementCountsTheMatchingPrefix) {
    EXPECT_DOUBLE_EQ(tokenAgreement({{1, 2, 3}, {4, 5}}, {{1, 2, 3}, {4, 5}}), 1.0);
    EXPECT_DOUBLE_EQ(tokenAgreement({{1, 2, 3, 4}}, {{1, 9, 3, 4}}), 0.25);  // greedy diverges for good after one change
    EXPECT_DOUBLE_EQ(tokenAgreement({{1, 2}, {3, 4}}, {{1, 2}}), 0.5);
}

TEST(LlmTuning, WorkloadRunsEveryRequestToItsLengthWithTheSchedulersTokens) {
    const DecoderConfig c = tinyConfig(Family::Llama);
    const DecoderModel m(c, randomWeights(c, 5));
    LlmWorkload w;
    w.requests = 5, w.concurrency = 2, w.input_len = 6, w.output_len = 4, w.seed = 3;
    const LlmRun a = runLlmWorkload(m, SchedulerOptions{}, w);
    ASSERT_EQ(a.tokens.size(), 5u);
    for (const auto& t : a.tokens) EXPECT_EQ(t.size(), 4u);
    EXPECT_EQ(a.ttft_ms.size(), 5u);
    EXPECT_EQ(a.tpot_ms.size(), 5u);
    EXPECT_GT(a.ms_per_output_token, 0);
    // Scheduler settings change the batching, not the greedy tokens of the f32 decoder.
    SchedulerOptions small;
    small.block_size = 8, small.max_num_tokens = 16;
    EXPECT_EQ(runLlmWorkload(m, small, w).tokens, a.tokens);
}

TEST(LlmTuning, CliListsRoutesAndTunesTheSchedulerOnTheCpu) {
    const DecoderConfig c = tinyConfig(Family::Gpt2);
    const fs::path dir = writeModel(c, randomWeights(c, 8), "tune");
    const std::string kiln = std::string(KILN_BIN) + " ", model = dir.string();
    std::string out;
    ASSERT_EQ(kiln::testing::runCommand(kiln + "routes " + model + " --json", &out), 0) << out;
    std::map<std::string, std::vector<std::string>> targets;
    const auto listed = jsonOf(out);
    for (const auto& p : listed["parameters"]) targets[p["name"].get<std::string>()] = p["targets"].get<std::vector<std::string>>();
    EXPECT_EQ(targets["llm.block_size"], (std::vector<std::string>{"cpu", "cuda"}));
    EXPECT_EQ(targets["llm.cuda.pdl"], (std::vector<std::string>{"cuda"}));
    EXPECT_GE(targets.size(), 15u);

    const std::string tune = kiln + "tune " + model + " --expr 'llm.block_size=[8,16] llm.max_num_tokens=[16,64]' --rounds 2 --requests 4 --concurrency 2 --input-len 6 --output-len 4";
    ASSERT_EQ(kiln::testing::runCommand(tune + " --dry-run --json", &out), 0) << out;
    EXPECT_EQ(jsonOf(out)["routes"].size(), 4u);
    ASSERT_EQ(kiln::testing::runCommand(tune + " --json", &out), 0) << out;
    const auto j = jsonOf(out);
    ASSERT_EQ(j["candidates"].size(), 4u);
    EXPECT_EQ(j["candidates"][0]["changes"], "default");
    for (const auto& cand : j["candidates"]) {
        EXPECT_DOUBLE_EQ(cand["token_agreement"].get<double>(), 1.0) << cand.dump();
        EXPECT_GT(cand["median_ms"].get<double>(), 0) << cand.dump();
        EXPECT_FALSE(cand.contains("rejected")) << cand.dump();
    }
    EXPECT_EQ(j["objective"], "tpot");
    // The winner is a candidate, and the default unless the win is significant.
    const std::string best = j["best_changes"];
    if (!j["significant"].get<bool>()) EXPECT_EQ(best, "default");

    // Bad input: one line each, non-zero exit.
    EXPECT_NE(kiln::testing::runCommand(kiln + "tune " + model + " --expr llm.cuda.pdl=off --dry-run", &out), 0);
    EXPECT_NE(out.find("llm.cuda.pdl applies to --target cuda only"), std::string::npos) << out;
    EXPECT_NE(kiln::testing::runCommand(kiln + "tune " + model + " --objective geomean --dry-run", &out), 0);
    EXPECT_NE(kiln::testing::runCommand(kiln + "tune " + model + " --target reference --dry-run", &out), 0);
    EXPECT_NE(out.find("an LLM runs on cpu or cuda"), std::string::npos) << out;

    // --route on the LLM commands: the same greedy tokens; a flag and the route setting one thing is refused.
    ASSERT_EQ(kiln::testing::runCommand(kiln + "generate " + model + " --tokens 3,1,4 --max-tokens 4 --json", &out), 0) << out;
    const auto plain = jsonOf(out)["output_tokens"];
    ASSERT_EQ(kiln::testing::runCommand(kiln + "generate " + model + " --tokens 3,1,4 --max-tokens 4 --json --route 'llm.block_size=8;llm.max_num_tokens=16'", &out), 0) << out;
    EXPECT_EQ(jsonOf(out)["output_tokens"], plain);
    EXPECT_NE(kiln::testing::runCommand(kiln + "bench-llm " + model + " --requests 2 --block-size 32 --route llm.block_size=8", &out), 0);
    EXPECT_NE(out.find("--block-size and --route llm.block_size both set it"), std::string::npos) << out;
    EXPECT_NE(kiln::testing::runCommand(kiln + "generate " + model + " --tokens 1 --route llm.cuda.graphs=off", &out), 0);
    EXPECT_NE(out.find("applies to --target cuda only"), std::string::npos) << out;
    fs::remove_all(dir);
}
