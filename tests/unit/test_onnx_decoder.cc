// Decoders read off ONNX exports (llm/onnx_decoder.h): the shared GPT-2 export, made by
// PyTorch's dynamo exporter with merged initializers and dropped zero biases, and a tiny
// Llama export run through the LLM runtime's decoder and must give PyTorch's own logits;
// other graphs are refused with an error that names the file.
#include <gtest/gtest.h>

#include <filesystem>

#include "llm/decoder_model.h"
#include "llm/onnx_decoder.h"
#include "llm_test_models.h"
#include "onnx_import/tensor_proto.h"

using namespace kiln;
using namespace kiln::llm;
namespace fs = std::filesystem;

namespace {

TEST(OnnxDecoder, SharedGpt2ExportMatchesPyTorchLogits) {
    const fs::path dir = fs::path(KILN_SHARED_DIR) / "models" / "gpt2_small";
    if (!fs::exists(dir / "model.onnx")) GTEST_SKIP() << dir << " is not here: the ONNX decoder test is skipped";
    const DecoderWeights w = loadDecoderWeights(dir);  // no model.safetensors: read off model.onnx
    EXPECT_EQ(w.config.layers, 4);
    EXPECT_EQ(w.config.hidden, 256);
    EXPECT_EQ(w.config.heads, 4);
    EXPECT_EQ(w.config.vocab, 2000);
    EXPECT_EQ(w.config.intermediate, 1024);
    const DecoderModel model(w.config, w.weights);
    const Tensor ids = loadTensorFile(dir / "test_data_set_0" / "input_0.pb");
    const Tensor want = loadTensorFile(dir / "test_data_set_0" / "output_0.pb");  // [1, 64, vocab]
    ASSERT_EQ(want.numel(), ids.numel() * w.config.vocab);
    std::vector<int64_t> tokens = ids.toInt64Vector();
    PagedKvCache cache = model.makeCache(16, 8);
    const int64_t seq = cache.addSequence();
    ASSERT_TRUE(cache.reserve(seq, static_cast<int64_t>(tokens.size()) - 8));
    // The prompt in two chunks (prefill, then 8 one-token decode steps): logits of every position.
    std::vector<float> got = model.forward(cache, seq, std::span<const int64_t>(tokens).first(tokens.size() - 8), true);
    for (size_t i = tokens.size() - 8; i < tokens.size(); ++i) {
        ASSERT_TRUE(cache.reserve(seq, 1));
        const auto step = model.forward(cache, seq, std::span<const int64_t>(&tokens[i], 1));
        got.insert(got.end(), step.begin(), step.end());
    }
    const double err = kiln::llm::testing::relativeL2(got, want.span<float>());
    EXPECT_LT(err, 1e-4) << "relative L2 error against PyTorch's logits";
}

// A Llama-family export (tests/data/llama_tiny_onnx, made by scripts/export_tiny_llama_onnx.py
// with PyTorch's dynamo exporter: RMSNorm decomposed into Pow/ReduceMean/Sqrt/Reciprocal,
// RoPE from an inv_freq constant, grouped-query attention, untied head, random norm scales).
TEST(OnnxDecoder, LlamaExportMatchesPyTorchLogits) {
    const fs::path dir = fs::path(KILN_SOURCE_DIR) / "tests" / "data" / "llama_tiny_onnx";
    const DecoderWeights w = loadDecoderWeights(dir);
    EXPECT_EQ(w.config.family, Family::Llama);
    EXPECT_EQ(w.config.layers, 2);
    EXPECT_EQ(w.config.hidden, 64);
    EXPECT_EQ(w.config.heads, 4);
    EXPECT_EQ(w.config.kv_heads, 2);
    EXPECT_EQ(w.config.head_dim, 16);
    EXPECT_EQ(w.config.intermediate, 160);
    EXPECT_EQ(w.config.vocab, 211);
    EXPECT_NEAR(w.config.rope_theta, 500000.f, 5.f);
    EXPECT_FLOAT_EQ(w.config.norm_eps, 1e-5f);
    const DecoderModel model(w.config, w.weights);
    const Tensor ids = loadTensorFile(dir / "test_data_set_0" / "input_0.pb");
    const Tensor want = loadTensorFile(dir / "test_data_set_0" / "output_0.pb");  // [1, 24, vocab]
    ASSERT_EQ(want.numel(), ids.numel() * w.config.vocab);
    const std::vector<int64_t> tokens = ids.toInt64Vector();
    PagedKvCache cache = model.makeCache(16, 8);
    const int64_t seq = cache.addSequence();
    const size_t decoded = 6;  // the prompt's last tokens go one decode step at a time
    ASSERT_TRUE(cache.reserve(seq, static_cast<int64_t>(tokens.size() - decoded)));
    std::vector<float> got = model.forward(cache, seq, std::span<const int64_t>(tokens).first(tokens.size() - decoded), true);
    for (size_t i = tokens.size() - decoded; i < tokens.size(); ++i) {
        ASSERT_TRUE(cache.reserve(seq, 1));
        const auto step = model.forward(cache, seq, std::span<const int64_t>(&tokens[i], 1));
        got.insert(got.end(), step.begin(), step.end());
    }
    const double err = kiln::llm::testing::relativeL2(got, want.span<float>());
    EXPECT_LT(err, 1e-5) << "relative L2 error against PyTorch's logits";
}

TEST(OnnxDecoder, GraphsThatAreNotGpt2DecodersAreRefusedByName) {
    const fs::path mlp = fs::path(KILN_SOURCE_DIR) / "models" / "mlp" / "model.onnx";
    try {
        loadDecoderWeights(mlp);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("model.onnx"), std::string::npos) << what;
        EXPECT_NE(what.find("GPT-2"), std::string::npos) << what;
    }
}

}  // namespace
