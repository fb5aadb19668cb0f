// The LLM runtime's CPU path: safetensors, configs, the paged KV cache, the decoder with
// paged attention (against an independent dense float64 implementation of the same
// Hugging Face formulas) and sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "llm/bpe_tokenizer.h"
#include "test_helpers.h"
#include "llm/decoder_model.h"
#include "llm/safetensors.h"
#include "llm/sampler.h"
#include "llm_test_models.h"
#include "llm/scheduler.h"

using namespace kiln;
using namespace kiln::llm;
using namespace kiln::llm::testing;
namespace fs = std::filesystem;

namespace {

// ---- Independent dense reference in float64: whole sequence, no cache. ----
using Mat = std::vector<std::vector<double>>;  // [tokens][features]

double at(const Weights& w, const std::string& name, int64_t i) { return w.at(name).scalarAt(i); }

// y = x W, with W stored [in][out] (conv1d) or [out][in] (linear).
Mat project(const Mat& x, const Weights& w, const std::string& name, bool linear, int64_t out, const std::string& bias = "") {
    const Tensor& W = w.at(name);
    const int64_t in = static_cast<int64_t>(x[0].size());
    Mat y(x.size(), std::vector<double>(out, 0.0));
    for (size_t t = 0; t < x.size(); ++t)
        for (int64_t o = 0; o < out; ++o) {
            double s = bias.empty() ? 0.0 : at(w, bias, o);
            for (int64_t i = 0; i < in; ++i) s += x[t][i] * W.scalarAt(linear ? o * in + i : i * out + o);
            y[t][o] = s;
        }
    return y;
}

Mat norm(const Mat& x, const Weights& w, const std::string& prefix, bool rms, double eps) {
    Mat y = x;
    for (auto& row : y) {
        double mean = 0, var = 0;
        if (!rms) mean = std::accumulate(row.begin(), row.end(), 0.0) / row.size();
        for (double v : row) var += (v - mean) * (v - mean);
        const double inv = 1 / std::sqrt(var / row.size() + eps);
        for (size_t i = 0; i < row.size(); ++i) row[i] = (row[i] - mean) * inv * at(w, prefix + ".weight", i) + (rms ? 0.0 : at(w, prefix + ".bias", i));
    }
    return y;
}

void ropeInPlace(Mat& m, int64_t heads, int64_t dim, double theta) {
    for (size_t pos = 0; pos < m.size(); ++pos)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < dim / 2; ++i) {
                const double f = pos * std::pow(theta, -2.0 * i / dim);
                double& a = m[pos][h * dim + i];
                double& b = m[pos][h * dim + i + dim / 2];
                const double x = a, y = b;
                a = x * std::cos(f) - y * std::sin(f);
                b = y * std::cos(f) + x * std::sin(f);
            }
}

std::vector<double> denseLastLogits(const DecoderConfig& c, const Weights& w, const std::vector<int64_t>& tokens) {
    const bool llama = c.family == Family::Llama;
    const int64_t H = c.hidden, D = c.head_dim, T = static_cast<int64_t>(tokens.size());
    Mat x(T, std::vector<double>(H));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < H; ++j)
            x[t][j] = llama ? at(w, "model.embed_tokens.weight", tokens[t] * H + j)
                            : at(w, "transformer.wte.weight", tokens[t] * H + j) + at(w, "transformer.wpe.weight", t * H + j);
    for (int64_t l = 0; l < c.layers; ++l) {
        const std::string n = (llama ? "model.layers." : "transformer.h.") + std::to_string(l) + ".";
        Mat h = norm(x, w, n + (llama ? "input_layernorm" : "ln_1"), llama, c.norm_eps);
        Mat q, k, v;
        if (llama) {
            q = project(h, w, n + "self_attn.q_proj.weight", true, c.heads * D);
            k = project(h, w, n + "self_attn.k_proj.weight", true, c.kv_heads * D);
            v = project(h, w, n + "self_attn.v_proj.weight", true, c.kv_heads * D);
            ropeInPlace(q, c.heads, D, c.rope_theta);
            ropeInPlace(k, c.kv_heads, D, c.rope_theta);
        } else {
            Mat qkv = project(h, w, n + "attn.c_attn.weight", false, 3 * H, n + "attn.c_attn.bias");
            q = k = v = Mat(T, std::vector<double>(H));
            for (int64_t t = 0; t < T; ++t)
                for (int64_t j = 0; j < H; ++j) q[t][j] = qkv[t][j], k[t][j] = qkv[t][H + j], v[t][j] = qkv[t][2 * H + j];
        }
        Mat att(T, std::vector<double>(c.heads * D, 0.0));
        const int64_t group = c.heads / c.kv_heads;
        for (int64_t hd = 0; hd < c.heads; ++hd)
            for (int64_t t = 0; t < T; ++t) {
                std::vector<double> p(t + 1);
                double mx = -1e300, sum = 0;
                for (int64_t s = 0; s <= t; ++s) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += q[t][hd * D + d] * k[s][(hd / group) * D + d];
                    p[s] = dot / std::sqrt(static_cast<double>(D));
                    mx = std::max(mx, p[s]);
                }
                for (auto& e : p) sum += (e = std::exp(e - mx));
                for (int64_t s = 0; s <= t; ++s)
                    for (int64_t d = 0; d < D; ++d) att[t][hd * D + d] += p[s] / sum * v[s][(hd / group) * D + d];
            }
        Mat o = llama ? project(att, w, n + "self_attn.o_proj.weight", true, H) : project(att, w, n + "attn.c_proj.weight", false, H, n + "attn.c_proj.bias");
        for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < H; ++j) x[t][j] += o[t][j];
        h = norm(x, w, n + (llama ? "post_attention_layernorm" : "ln_2"), llama, c.norm_eps);
        Mat m;
        if (llama) {
            Mat g = project(h, w, n + "mlp.gate_proj.weight", true, c.intermediate), u = project(h, w, n + "mlp.up_proj.weight", true, c.intermediate);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t j = 0; j < c.intermediate; ++j) u[t][j] *= g[t][j] / (1 + std::exp(-g[t][j]));
            m = project(u, w, n + "mlp.down_proj.weight", true, H);
        } else {
            Mat u = project(h, w, n + "mlp.c_fc.weight", false, c.intermediate, n + "mlp.c_fc.bias");
            for (auto& row : u)
                for (auto& e : row) e = 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)));
            m = project(u, w, n + "mlp.c_proj.weight", false, H, n + "mlp.c_proj.bias");
        }
        for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < H; ++j) x[t][j] += m[t][j];
    }
    Mat last = {x.back()};
    last = norm(last, w, llama ? "model.norm" : "transformer.ln_f", llama, c.norm_eps);
    const std::string head = llama ? "lm_head.weight" : "transformer.wte.weight";
    return project(last, w, head, true, c.vocab)[0];
}

double maxRelDiff(const std::vector<float>& got, const std::vector<double>& want) {
    double scale = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::fabs(want[i])), diff = std::max(diff, std::fabs(got[i] - want[i]));
    return diff / scale;
}


}  // namespace

class Decoder : public ::testing::TestWithParam<Family> {};

// Prefill a prompt, then decode token by token through the paged cache (block size 4, so
// the sequence spans several blocks); every step's logits match the dense float64 model.
TEST_P(Decoder, PagedDecodingMatchesDenseReference) {
    DecoderConfig c = tinyConfig(GetParam());
    c.norm_eps = GetParam() == Family::Llama ? 1e-5f : 1e-5f;
    const Weights w = randomWeights(c, 7);
    const fs::path dir = writeModel(c, w, GetParam() == Family::Llama ? "llama" : "gpt2");
    DecoderModel model = DecoderModel::load(dir);  // through config.json and safetensors
    PagedKvCache cache = model.makeCache(4, 16);
    const int64_t seq = cache.addSequence();
    std::vector<int64_t> tokens = {3, 17, 5, 29, 11, 2, 8};
    ASSERT_TRUE(cache.reserve(seq, 7));
    auto logits = model.forward(cache, seq, tokens);
    EXPECT_LT(maxRelDiff(logits, denseLastLogits(c, w, tokens)), 1e-4);
    for (int step = 0; step < 6; ++step) {
        const int64_t next = std::max_element(logits.begin(), logits.end()) - logits.begin();
        tokens.push_back(next);
        ASSERT_TRUE(cache.reserve(seq, 1));
        logits = model.forward(cache, seq, std::span<const int64_t>(&tokens.back(), 1));
        EXPECT_LT(maxRelDiff(logits, denseLastLogits(c, w, tokens)), 1e-4) << "decode step " << step;
    }
    EXPECT_EQ(cache.length(seq), 13);
    fs::remove_all(dir);
}
INSTANTIATE_TEST_SUITE_P(Families, Decoder, ::testing::Values(Family::Gpt2, Family::Llama));

TEST(PagedKvCache, SharesPromptPrefixBlocksAndFreesThem) {
    DecoderConfig c = tinyConfig(Family::Llama);
    const Weights w = randomWeights(c, 11);
    DecoderModel model(c, w);
    PagedKvCache cache = model.makeCache(4, 8);
    const std::vector<int64_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const int64_t a = cache.addSequence();
    ASSERT_TRUE(cache.reserve(a, 10));
    auto la = model.forward(cache, a, prompt);
    EXPECT_EQ(cache.stats().blocks_used, 3);
    // A second request with the same prompt reuses the two full blocks and computes the rest.
    const int64_t b = cache.addSequence();
    const int64_t reused = cache.sharePrefix(b, prompt);
    EXPECT_EQ(reused, 8);
    ASSERT_TRUE(cache.reserve(b, 2));
    auto lb = model.forward(cache, b, std::span<const int64_t>(prompt).subspan(8));
    EXPECT_EQ(cache.stats().blocks_used, 4);  // 2 shared + 1 own each
    EXPECT_EQ(cache.stats().shared_blocks, 2);
    EXPECT_LT(maxRelDiff(lb, std::vector<double>(la.begin(), la.end())), 1e-6);
    EXPECT_LT(maxRelDiff(lb, denseLastLogits(c, w, prompt)), 1e-4);
    // Out of blocks: reserve refuses without changing anything.
    EXPECT_FALSE(cache.reserve(b, 100));
    EXPECT_EQ(cache.length(b), 10);
    cache.freeSequence(a);
    EXPECT_EQ(cache.stats().blocks_used, 3);  // b still holds the shared blocks
    cache.freeSequence(b);
    EXPECT_EQ(cache.stats().blocks_used, 0);
    EXPECT_EQ(cache.freeBlocks(), 8);
    EXPECT_THROW(cache.freeSequence(b), Error);
}

TEST(PagedKvCache, UtilizationCountsPartlyFilledBlocks) {
    PagedKvCache cache(1, 1, 2, 4, 4);
    const int64_t s = cache.addSequence();
    ASSERT_TRUE(cache.reserve(s, 5));
    const std::vector<int64_t> t = {1, 2, 3, 4, 5};
    cache.append(s, t);
    EXPECT_DOUBLE_EQ(cache.stats().utilization, 5.0 / 8.0);
    EXPECT_THROW(cache.append(s, std::vector<int64_t>{1, 2, 3, 4}), Error);  // beyond the reserved blocks
}

TEST(Safetensors, RoundTripAndCorruptFilesAreRejected) {
    std::mt19937 rng(3);
    Weights w = {{"a", randomTensor({3, 5}, rng)}, {"b", Tensor::fromVector<int64_t>({2}, {7, -9})}};
    const fs::path p = fs::temp_directory_path() / ("kiln_st_" + std::to_string(::getpid()) + ".safetensors");
    writeSafetensors(p, w);
    auto back = readSafetensors(p);
    ASSERT_EQ(back.size(), 2u);
    EXPECT_EQ(back.at("a").dims(), (Dims{3, 5}));
    EXPECT_EQ(std::memcmp(back.at("a").raw(), w.at("a").raw(), w.at("a").byteSize()), 0);
    EXPECT_EQ(back.at("b").data<int64_t>()[1], -9);
    // Truncated data, a lying header and garbage are each one clear error.
    std::string bytes;
    {
        std::ifstream in(p, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    auto expectError = [&](const std::string& content, const std::string& fragment) {
        std::ofstream(p, std::ios::binary) << content;
        try {
            readSafetensors(p);
            ADD_FAILURE() << "accepted a corrupt file (" << fragment << ")";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
        }
    };
    expectError(bytes.substr(0, bytes.size() - 8), "outside the file");
    std::string lying = bytes;
    lying.replace(lying.find("[3,5]"), 5, "[3,6]");
    expectError(lying, "bytes for 18 elements");
    expectError("garbage", "too short");
    expectError(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "header length");
    fs::remove(p);
}

// A sharded checkpoint (model.safetensors.index.json and its shards, as transformers writes
// large models) loads to the same model as one file; a bad index is one clear error.
TEST(Safetensors, ShardedCheckpointsLoadAsOneAndBadIndexesAreRefused) {
    const DecoderConfig c = tinyConfig(Family::Llama);
    const Weights w = randomWeights(c, 31);
    const fs::path whole = writeModel(c, w, "shards_whole"), dir = writeModel(c, w, "shards");
    fs::remove(dir / "model.safetensors");
    Weights first, second;
    nlohmann::json map = nlohmann::json::object();
    size_t k = 0;
    for (const auto& [name, t] : w) {
        (k % 2 ? second : first)[name] = t;
        map[name] = k++ % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    writeSafetensors(dir / "model-00001-of-00002.safetensors", first);
    writeSafetensors(dir / "model-00002-of-00002.safetensors", second);
    auto writeIndex = [&](const nlohmann::json& m) { std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"metadata", {}}, {"weight_map", m}}.dump(); };
    writeIndex(map);
    const DecoderModel a = DecoderModel::load(whole), b = DecoderModel::load(dir);
    const std::vector<int64_t> prompt = {3, 1, 4, 1, 5};
    PagedKvCache ca = a.makeCache(4, 8), cb = b.makeCache(4, 8);
    const int64_t sa = ca.addSequence(), sb = cb.addSequence();
    ASSERT_TRUE(ca.reserve(sa, 5) && cb.reserve(sb, 5));
    EXPECT_EQ(a.forward(ca, sa, prompt), b.forward(cb, sb, prompt));
    auto expectError = [&](const nlohmann::json& m, const std::string& fragment) {
        writeIndex(m);
        try {
            DecoderModel::load(dir);
            ADD_FAILURE() << "accepted a bad index (" << fragment << ")";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
        }
    };
    nlohmann::json wrong = map;
    wrong[map.begin().key()] = "model-00002-of-00002.safetensors";  // not where the index says
    expectError(wrong, "is missing");
    nlohmann::json outside = map;
    outside[map.begin().key()] = "../model.safetensors";
    expectError(outside, "not a file name in the folder");
    nlohmann::json absent = map;
    absent[map.begin().key()] = "model-00003-of-00002.safetensors";
    expectError(absent, "cannot open");
    expectError(nlohmann::json::object(), "weight_map is empty");
    fs::remove(dir / "model.safetensors.index.json");
    try {
        DecoderModel::load(dir);
        ADD_FAILURE() << "loaded a folder without weights";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("neither model.safetensors nor"), std::string::npos) << e.what();
    }
    fs::remove_all(whole);
    fs::remove_all(dir);
}

TEST(DecoderConfigParse, ErrorsNameTheField) {
    EXPECT_THROW(DecoderConfig::parse(R"({"model_type": "bert"})", "c.json"), Error);
    try {
        DecoderConfig::parse(R"({"model_type": "llama", "hidden_size": 10, "num_hidden_layers": 1, "num_attention_heads": 3, "intermediate_size": 4, "vocab_size": 5})",
                             "c.json");
        ADD_FAILURE() << "accepted hidden 10 with 3 heads";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not a multiple"), std::string::npos) << e.what();
    }
    const auto c = DecoderConfig::parse(R"({"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 4, "vocab_size": 5})", "c.json");
    EXPECT_EQ(c.intermediate, 32);
    EXPECT_EQ(c.head_dim, 4);
}

TEST(Sampler, GreedyTopKTopPAndSeeds) {
    const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.f, 0.5f};
    EXPECT_EQ(Sampler({}).next(logits, {}), 1);
    SamplingParams top1{1.0f, 1, 1.f, 1.f, 5};
    for (int i = 0; i < 20; ++i) EXPECT_EQ(Sampler(top1).next(logits, {}), 1);  // top-k 1 is greedy at any temperature
    SamplingParams nucleus{1.0f, 0, 0.5f, 1.f, 9};  // the top token holds < 50%: the nucleus is tokens 1 and 2
    Sampler s(nucleus);
    std::map<int64_t, int> seen;
    for (int i = 0; i < 200; ++i) ++seen[s.next(logits, {})];
    EXPECT_EQ(seen.size(), 2u);
    EXPECT_GT(seen[1], 50);
    EXPECT_GT(seen[2], 50);
    SamplingParams hot{2.0f, 0, 1.f, 1.f, 42};
    Sampler x(hot), y(hot);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(x.next(logits, {}), y.next(logits, {}));  // same seed, same draws
    SamplingParams penal{0.f, 0, 1.f, 10.f, 0};
    const std::vector<int64_t> prev = {1};
    EXPECT_EQ(Sampler(penal).next(logits, prev), 2);  // token 1 penalized below token 2
    // Presence and frequency penalties count generated tokens only: token 1 (2.0) falls below
    // token 2 (1.9) once it was generated twice (2.0 - 0.02 - 2 * 0.05 = 1.88), not once (1.93),
    // and not for occurrences in the prompt.
    SamplingParams openai{0.f, 0, 1.f, 1.f, 0, 0.02f, 0.05f};
    const std::vector<int64_t> once = {1}, twice = {1, 3, 1}, prompt_and_once = {1, 1, 1, 1};
    EXPECT_EQ(Sampler(openai).next(logits, once, once), 1);
    EXPECT_EQ(Sampler(openai).next(logits, twice, twice), 2);
    EXPECT_EQ(Sampler(openai).next(logits, prompt_and_once, once), 1);
    EXPECT_FALSE(Sampler(openai).greedy());
    EXPECT_THROW(Sampler(SamplingParams{0.f, 0, 1.f, 1.f, 0, 2.5f}), Error);
    EXPECT_THROW(Sampler(SamplingParams{-1.f}), Error);
}

namespace {
// Batch-1 greedy generation with its own cache: the reference for the scheduler.
std::vector<int64_t> generateAlone(const DecoderModel& model, std::vector<int64_t> tokens, int64_t max_tokens) {
    PagedKvCache cache = model.makeCache(4, 64);
    const int64_t seq = cache.addSequence();
    std::vector<int64_t> out;
    EXPECT_TRUE(cache.reserve(seq, static_cast<int64_t>(tokens.size())));
    auto logits = model.forward(cache, seq, tokens);
    while (static_cast<int64_t>(out.size()) < max_tokens) {
        out.push_back(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (static_cast<int64_t>(out.size()) == max_tokens) break;
        EXPECT_TRUE(cache.reserve(seq, 1));
        logits = model.forward(cache, seq, std::span<const int64_t>(&out.back(), 1));
    }
    return out;
}
}  // namespace

// Many requests, a KV cache too small for all of them (preemption), a small token budget
// (chunked prefill) and shared prompt prefixes: every greedy output equals its batch-1 run.
TEST(Scheduler, InFlightBatchingMatchesBatchOneRuns) {
    const DecoderConfig c = tinyConfig(Family::Llama);
    const DecoderModel model(c, randomWeights(c, 5));
    SchedulerOptions o;
    o.max_batch_size = 4;
    o.max_num_tokens = 6;
    o.block_size = 4;
    o.num_blocks = 7;
    Scheduler sched(model, o);
    std::mt19937 rng(1);
    std::vector<std::pair<int64_t, Request>> requests;
    for (int i = 0; i < 10; ++i) {
        Request r;
        r.prompt = {1, 2, 3, 4, 5};  // a shared prefix
        for (int k = 0; k < 2 + i % 5; ++k) r.prompt.push_back(static_cast<int64_t>(rng() % c.vocab));
        r.max_tokens = 3 + i % 4;
        requests.emplace_back(sched.add(r), r);
    }
    int64_t preempted = 0, steps = 0;
    StepStats st;
    while (sched.step(&st)) {
        preempted += st.preempted;
        EXPECT_LE(st.prefill_tokens + st.decode_tokens, o.max_num_tokens);
        ASSERT_LT(++steps, 1000);
    }
    EXPECT_GT(preempted, 0) << "the cache was meant to run out";
    for (const auto& [id, r] : requests) {
        const RequestState& s = sched.state(id);
        EXPECT_EQ(s.finished, FinishReason::Length);
        EXPECT_EQ(s.output, generateAlone(model, r.prompt, r.max_tokens)) << "request " << id;
    }
    EXPECT_EQ(sched.cache().stats().blocks_used, 0);  // everything returned
}

TEST(Scheduler, StopTokensCancellationAndSeededSampling) {
    const DecoderConfig c = tinyConfig(Family::Gpt2);
    const DecoderModel model(c, randomWeights(c, 9));
    const std::vector<int64_t> prompt = {4, 8, 15, 16};
    const auto greedy = generateAlone(model, prompt, 6);
    Scheduler sched(model, SchedulerOptions{});
    Request stop;
    stop.prompt = prompt;
    stop.max_tokens = 6;
    stop.stop_tokens = {greedy[2]};
    const int64_t a = sched.add(stop);
    Request cancelled = stop;
    cancelled.stop_tokens = {};
    const int64_t b = sched.add(cancelled);
    Request sampled = cancelled;
    sampled.sampling = SamplingParams{0.8f, 10, 0.9f, 1.1f, 1234};
    const int64_t d = sched.add(sampled);
    std::vector<int64_t> streamed;
    sched.on_token = [&](int64_t id, int64_t token) {
        if (id == a) streamed.push_back(token);
    };
    sched.step();
    sched.cancel(b);
    sched.runToCompletion();
    EXPECT_EQ(sched.state(a).finished, FinishReason::Stop);
    EXPECT_EQ(sched.state(a).output, std::vector<int64_t>(greedy.begin(), greedy.begin() + 3));
    EXPECT_EQ(streamed, sched.state(a).output);
    EXPECT_EQ(sched.state(b).finished, FinishReason::Cancelled);
    // The same seeded request alone, in a cache small enough to force preemption, draws the same tokens.
    SchedulerOptions small;
    small.block_size = 4;
    small.num_blocks = 3;
    small.max_batch_size = 2;
    Scheduler tight(model, small);
    const int64_t d2 = tight.add(sampled);
    Request filler = cancelled;
    filler.max_tokens = 4;
    tight.add(filler);
    tight.runToCompletion();
    EXPECT_EQ(tight.state(d2).output, sched.state(d).output);
    EXPECT_EQ(sched.state(d).output.size(), 6u);
    // Bad requests are refused up front.
    EXPECT_THROW(sched.add(Request{}), Error);
    Request too_long;
    too_long.prompt.assign(c.max_positions, 1);
    EXPECT_EQ(sched.state(sched.add(too_long)).finished, FinishReason::ContextLength);
}

namespace {
// GPT-2's byte alphabet, written out independently of the tokenizer.
}  // namespace

TEST(BpeTokenizer, MergesByRankRoundTripsAndSpecialTokens) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[byteChar(b)] = b;
    const std::string G = byteChar(' ');  // "Ġ"
    const std::vector<std::string> merges = {G + " w", "o r", G + "w or", "l d", G + "wor ld", "h e", "l l", "he ll", "hell o"};
    int next = 256;
    for (const auto& m : merges) {
        const std::string merged = m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1);
        vocab[merged] = next++;
    }
    nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                        {"added_tokens", {{{"id", 300}, {"content", "<|endoftext|>"}}}}};
    const BpeTokenizer tok = BpeTokenizer::parse(j.dump(), "tokenizer.json");
    EXPECT_EQ(tok.encode("hello world"), (std::vector<int64_t>{vocab["hello"].get<int64_t>(), vocab[G + "world"].get<int64_t>()}));
    EXPECT_EQ(tok.encode("hi<|endoftext|>"), (std::vector<int64_t>{'h', 'i', 300}));
    for (const std::string text : {"hello world", "  two  spaces\tand\nlines ", "it's 2026, héllo wörld!!", "<|endoftext|>x", "", "ünïcödé 😀"})
        EXPECT_EQ(tok.decode(tok.encode(text)), text) << text;
    // GPT-2 splits "a  b" as "a", " ", " b": the space run leaves one space to the word.
    EXPECT_EQ(tok.decode({tok.encode("a  b")[1]}), " ");
    EXPECT_EQ(tok.decode({100000}), "\xEF\xBF\xBD") << "an id with no piece decodes as U+FFFD, never an exception";
    EXPECT_THROW(BpeTokenizer::parse(R"({"model": {"type": "Unigram"}})", "t.json"), Error);
}

TEST(LlmCli, GenerateAndBenchLlm) {
    const DecoderConfig c = tinyConfig(Family::Gpt2);
    const Weights w = randomWeights(c, 21);
    const fs::path dir = writeModel(c, w, "cli");
    const std::string kiln = KILN_BIN;
    std::string out;
    ASSERT_EQ(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --tokens 3,1,4,1,5 --max-tokens 5 --json", &out), 0) << out;
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    EXPECT_EQ(j["output_tokens"].get<std::vector<int64_t>>(), generateAlone(DecoderModel(c, w), {3, 1, 4, 1, 5}, 5));
    EXPECT_EQ(j["finish_reason"], "length");
    // Tensor parallel on CPU threads: the same tokens; sizes that do not divide are refused.
    ASSERT_EQ(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --tp 2 --tokens 3,1,4,1,5 --max-tokens 5 --json", &out), 0) << out;
    EXPECT_EQ(nlohmann::json::parse(out.substr(out.find('{')))["output_tokens"], j["output_tokens"]);
    EXPECT_NE(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --tp 3 --tokens 1", &out), 0);
    EXPECT_NE(out.find("--tp 3 does not divide"), std::string::npos) << out;
    EXPECT_NE(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --target cuda --tp 2 --tokens 1", &out), 0);
    EXPECT_NE(out.find("not available"), std::string::npos) << out;
    ASSERT_EQ(kiln::testing::runCommand(kiln + " bench-llm " + dir.string() + " --requests 6 --concurrency 3 --input-len 5 --output-len 3 --json", &out), 0) << out;
    const auto b = nlohmann::json::parse(out.substr(out.find('{')));
    EXPECT_GT(b["output_tokens_per_s"].get<double>(), 0);
    EXPECT_GE(b["ttft_ms"]["p99"].get<double>(), b["ttft_ms"]["median"].get<double>());
    EXPECT_GT(b["kv_cache"]["max_blocks_used"].get<int64_t>(), 0);
    // Bad input: one line, non-zero exit.
    EXPECT_NE(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --prompt hi", &out), 0);
    EXPECT_NE(out.find("no tokenizer.json"), std::string::npos) << out;
    std::ofstream(dir / "tokenizer.model") << "x";  // a corrupt SentencePiece model: an error naming it, not a misread
    EXPECT_NE(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --tokens 1", &out), 0);
    EXPECT_NE(out.find("tokenizer.model: truncated protobuf"), std::string::npos) << out;
    fs::remove(dir / "tokenizer.model");
    EXPECT_NE(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --tokens 1,x", &out), 0);
    EXPECT_NE(out.find("not a token id"), std::string::npos) << out;
    EXPECT_NE(kiln::testing::runCommand(kiln + " generate " + dir.string() + " --tokens 99", &out), 0);
    EXPECT_NE(out.find("outside the vocabulary"), std::string::npos) << out;
    EXPECT_NE(kiln::testing::runCommand(kiln + " generate /nonexistent/model --tokens 1", &out), 0);
    fs::remove_all(dir);
}


// eos_token_id from config.json (an id or a list), overridden by generation_config.json,
// ends generation like a stop token; ignore_eos runs to max_tokens.
TEST(LlmEos, ConfigAndGenerationConfigIdsStopGeneration) {
    const DecoderConfig c = tinyConfig(Family::Gpt2);
    const Weights w = randomWeights(c, 31);
    const fs::path dir = writeModel(c, w, "eos");
    const std::vector<int64_t> prompt = {3, 1, 4};
    const auto free_run = greedyThroughScheduler(DecoderModel::load(dir), SchedulerOptions{}, {prompt}, 8)[0];
    ASSERT_EQ(free_run.size(), 8u);
    const int64_t eos = free_run[2];
    size_t first = 0;  // where either end id first appears
    while (free_run[first] != eos && free_run[first] != 36) ++first;
    auto run = [&](bool ignore_eos) {
        const DecoderModel m = DecoderModel::load(dir);
        Scheduler s(m, SchedulerOptions{});
        Request r;
        r.prompt = prompt, r.max_tokens = 8, r.ignore_eos = ignore_eos;
        const int64_t id = s.add(r);
        s.runToCompletion();
        return s.state(id);
    };
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    config["eos_token_id"] = {36, eos};
    std::ofstream(dir / "config.json") << config.dump();
    EXPECT_EQ(DecoderModel::load(dir).config().eos_token_ids, (std::vector<int64_t>{36, eos}));
    const RequestState stopped = run(false);
    EXPECT_EQ(stopped.finished, FinishReason::Stop);
    EXPECT_EQ(stopped.output, std::vector<int64_t>(free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(first) + 1));
    EXPECT_EQ(run(true).output, free_run);
    // generation_config.json wins over config.json.
    std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 36})";
    EXPECT_EQ(DecoderModel::load(dir).config().eos_token_ids, (std::vector<int64_t>{36}));
    std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": "x"})";
    EXPECT_THROW(DecoderModel::load(dir), Error);
    config["eos_token_id"] = 99;  // past the vocabulary
    std::ofstream(dir / "config.json") << config.dump();
    fs::remove(dir / "generation_config.json");
    EXPECT_THROW(DecoderModel::load(dir), Error);
    fs::remove_all(dir);
}
