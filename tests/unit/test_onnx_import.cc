#include <gtest/gtest.h>

#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "backends/cpu/graph_executor.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
std::string importError(const std::filesystem::path& p) {
    try {
        importOnnxModel(p);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

onnx::ModelProto reluModel() {
    auto m = makeModel({2, 3});
    addNode(m, "Relu", {"x"}, {"y"});
    return m;
}
}  // namespace

TEST(OnnxImport, ImportsAndInfersShapes) {
    TempDir dir;
    auto m = makeModel({2, 3});
    addNode(m, "Relu", {"x"}, {"h"});
    addNode(m, "Neg", {"h"}, {"y"});
    saveModel(m, dir / "m.onnx");
    Graph g = importOnnxModel(dir / "m.onnx");
    ASSERT_EQ(g.nodes.size(), 2u);
    EXPECT_EQ(g.opset, 17);
    const ValueInfo* h = g.findValueInfo("h");
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->dtype, DType::F32);
    EXPECT_EQ(h->shape.toString(), "[2,3]");
}

TEST(OnnxImport, CorruptTruncatedAndEmptyFilesAreClearErrors) {
    TempDir dir;
    saveModel(reluModel(), dir / "good.onnx");
    std::string bytes = readFile(dir / "good.onnx");
    writeFile(dir / "truncated.onnx", bytes.substr(0, bytes.size() / 2));
    std::string garbage(bytes.size(), '\xff');
    writeFile(dir / "garbage.onnx", garbage);
    writeFile(dir / "empty.onnx", "");
    EXPECT_NE(importError(dir / "truncated.onnx").find("not a valid ONNX model"), std::string::npos) << importError(dir / "truncated.onnx");
    EXPECT_NE(importError(dir / "garbage.onnx").find("not a valid ONNX model"), std::string::npos);
    EXPECT_NE(importError(dir / "empty.onnx").find("empty"), std::string::npos);
    EXPECT_NE(importError(dir / "missing.onnx").find("no such file"), std::string::npos);
}

TEST(OnnxImport, UnknownOpsAreAllReportedWithNodeNames) {
    TempDir dir;
    auto m = makeModel({2});
    addNode(m, "FancyOp", {"x"}, {"h"})->set_name("first_bad");
    addNode(m, "Relu", {"h"}, {"h2"});
    addNode(m, "OtherOp", {"h2"}, {"y"})->set_name("second_bad");
    saveModel(m, dir / "m.onnx");
    std::string err = importError(dir / "m.onnx");
    EXPECT_NE(err.find("2 unsupported node(s)"), std::string::npos) << err;
    EXPECT_NE(err.find("'first_bad' (FancyOp)"), std::string::npos) << err;
    EXPECT_NE(err.find("'second_bad' (OtherOp)"), std::string::npos) << err;
}

TEST(OnnxImport, UnsupportedOpsetIsRefused) {
    TempDir dir;
    auto m = makeModel({2}, kMaxOpset + 1);
    addNode(m, "Relu", {"x"}, {"y"});
    saveModel(m, dir / "m.onnx");
    EXPECT_NE(importError(dir / "m.onnx").find("opset " + std::to_string(kMaxOpset + 1) + " is not supported"), std::string::npos);
}

// Opset 18 moved the Reduce ops' axes to an input: such nodes import (the arity check's
// schemas stop at opset 17) and reduce over the axes given, not over all of them.
TEST(OnnxImport, Opset18ReduceAxesInput) {
    TempDir dir;
    auto m = makeModel({2, 3, 4}, 18);
    auto* axes = m.mutable_graph()->add_initializer();
    axes->set_name("axes"), axes->set_data_type(onnx::TensorProto::INT64), axes->add_dims(1), axes->add_int64_data(1);
    addNode(m, "ReduceMean", {"x", "axes"}, {"y"});
    saveModel(m, dir / "m.onnx");
    Graph g = importOnnxModel(dir / "m.onnx");
    std::mt19937 rng(5);
    const Tensor x = randomTensor({2, 3, 4}, rng);
    const Tensor y = GraphExecutor(g).run({{"x", x}})[0];
    ASSERT_EQ(y.dims(), (Dims{2, 1, 4}));
    for (int64_t a = 0; a < 2; ++a)
        for (int64_t c = 0; c < 4; ++c) {
            double mean = 0;
            for (int64_t b = 0; b < 3; ++b) mean += x.data<float>()[(a * 3 + b) * 4 + c] / 3.0;
            EXPECT_NEAR(y.data<float>()[a * 4 + c], mean, 1e-6);
        }
}

TEST(OnnxImport, ExternalDataIsReadAndEscapesAreRefused) {
    TempDir dir;
    auto m = makeModel({4});
    addNode(m, "Add", {"x", "w"}, {"y"});
    auto* w = m.mutable_graph()->add_initializer();
    w->set_name("w");
    w->set_data_type(onnx::TensorProto::FLOAT);
    w->add_dims(4);
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto set_location = [&](const std::string& loc) {
        w->clear_external_data();
        auto* kv = w->add_external_data();
        kv->set_key("location");
        kv->set_value(loc);
    };
    float values[4] = {1, 2, 3, 4};
    writeFile(dir / "weights.bin", std::string(reinterpret_cast<char*>(values), sizeof values));
    set_location("weights.bin");
    saveModel(m, dir / "m.onnx");
    Graph g = importOnnxModel(dir / "m.onnx");
    EXPECT_EQ(g.initializers.at("w").data<float>()[3], 4.0f);

    set_location("absent.bin");
    saveModel(m, dir / "m.onnx");
    EXPECT_NE(importError(dir / "m.onnx").find("cannot open external data file"), std::string::npos) << importError(dir / "m.onnx");

    set_location("../weights.bin");
    saveModel(m, dir / "m.onnx");
    EXPECT_NE(importError(dir / "m.onnx").find("escapes the model's folder"), std::string::npos);

    set_location("/etc/passwd");
    saveModel(m, dir / "m.onnx");
    EXPECT_NE(importError(dir / "m.onnx").find("must be a relative path"), std::string::npos);

    writeFile(dir / "short.bin", std::string(8, '\0'));
    set_location("short.bin");
    saveModel(m, dir / "m.onnx");
    EXPECT_NE(importError(dir / "m.onnx").find("too short"), std::string::npos);
}

TEST(TensorFiles, PbAndNpyRoundTrip) {
    TempDir dir;
    std::mt19937 rng(3);
    Tensor t = randomTensor({2, 3, 4}, rng);
    for (const char* name : {"t.pb", "t.npy"}) {
        saveTensorFile(t, "out", dir / name);
        std::string n;
        Tensor back = loadTensorFile(dir / name, &n);
        EXPECT_EQ(back.dims(), t.dims());
        for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(back.data<float>()[i], t.data<float>()[i]);
    }
    Tensor ints = Tensor::fromVector<int64_t>({3}, {-1, 5, 7});
    saveTensorFile(ints, "i", dir / "i.npy");
    EXPECT_EQ(loadTensorFile(dir / "i.npy").toInt64Vector(), (std::vector<int64_t>{-1, 5, 7}));
    writeFile(dir / "bad.npy", "\x93NUMPY garbage");
    EXPECT_THROW(loadTensorFile(dir / "bad.npy"), Error);
    writeFile(dir / "bad.pb", std::string(100, '\xff'));
    EXPECT_THROW(loadTensorFile(dir / "bad.pb"), Error);
}
