// Bad input gets a clean Error, never a signal or a silent wrong size (issue: reliability):
// size arithmetic, attribute ranges, integer division, engine re-validation, file writes
// and config values.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <fstream>

#include "engine/builder.h"
#include "engine/engine.h"
#include "ir/file_write.h"
#include "llm/decoder_config.h"
#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "runtime/context.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kHuge = (int64_t(1) << 62) + 1;

std::string importError(const onnx::ModelProto& m) {
    TempDir dir;
    saveModel(m, dir / "m.onnx");
    try {
        importOnnxModel(dir / "m.onnx");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Sets the limit for the test's lifetime and puts the old one back.
struct TensorLimit {
    size_t old = maxTensorBytes();
    explicit TensorLimit(size_t bytes) { setMaxTensorBytes(bytes); }
    ~TensorLimit() { setMaxTensorBytes(old); }
};

}  // namespace

TEST(Reliability, ElementCountsRefuseOverflow) {
    EXPECT_EQ(numElements({3, 4, 5}), 60);
    EXPECT_EQ(numElements({kHuge, 0}), 0) << "a zero dim makes the count 0 even past an overflow";
    EXPECT_THROW(numElements({kHuge, 4}), Error);  // wraps to 4 unchecked
    EXPECT_THROW(numElements({int64_t(1) << 32, int64_t(1) << 32}), Error);
    EXPECT_THROW(numElements({2, -3}), Error);
    EXPECT_THROW(Tensor(DType::F32, {kHuge, 4}), Error);
    EXPECT_THROW(tensorBytes(DType::F64, {int64_t(1) << 61}, "t"), Error) << "elements fit int64, bytes do not";
}

TEST(Reliability, OneTensorLimitBeforeAnyAllocation) {
    TensorLimit limit(1 << 20);
    EXPECT_NO_THROW(Tensor(DType::F32, {256, 1024}));
    try {
        Tensor(DType::F32, {257, 1024});
        FAIL() << "over the limit";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--max-tensor-bytes"), std::string::npos) << e.what();
    }
    // An initializer that claims more than the limit is refused before its data is read.
    onnx::ModelProto m = makeModel({2});
    auto* w = m.mutable_graph()->add_initializer();
    w->set_name("w");
    w->set_data_type(onnx::TensorProto::FLOAT);
    w->add_dims(1 << 20);
    addNode(m, "Add", {"x", "w"}, {"y"});
    EXPECT_NE(importError(m).find("tensor 'w'"), std::string::npos) << importError(m);
}

TEST(Reliability, HugeDimsInModelsAndInputFilesAreRefused) {
    onnx::ModelProto m = makeModel({2, 4});
    auto* w = m.mutable_graph()->add_initializer();
    w->set_name("w");
    w->set_data_type(onnx::TensorProto::FLOAT);
    w->add_dims(kHuge);
    w->add_dims(4);
    w->set_raw_data(std::string(64, '\0'));  // what [2^62 + 1, 4] wraps to: 4 elements
    addNode(m, "Add", {"x", "w"}, {"y"});
    EXPECT_NE(importError(m).find("more than 2^63 elements"), std::string::npos) << importError(m);
    // Declared input dims of that size: refused when `kiln run` makes the input.
    TempDir dir;
    onnx::ModelProto relu = makeModel({kHuge, 4});
    addNode(relu, "Relu", {"x"}, {"y"});
    saveModel(relu, dir / "relu.onnx");
    std::string out;
    EXPECT_EQ(runCommand(std::string(KILN_BIN) + " run " + (dir / "relu.onnx").string(), &out), 1) << out;
    EXPECT_NE(out.find("kiln: error:"), std::string::npos) << out;
    // A .npy input file with such a shape.
    Tensor t(DType::F32, {1, 64});
    saveTensorFile(t, "x", dir / "x.npy");
    std::string bytes = readFile(dir / "x.npy");
    const size_t at = bytes.find("(1, 64)");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 7, "(4611686018427387905, 64)");
    writeFile(dir / "big.npy", bytes);
    EXPECT_THROW(loadTensorFile(dir / "big.npy"), Error);
    bytes.replace(bytes.find("(4611686018427387905, 64)"), 25, "(99999999999999999999999, 64)");
    writeFile(dir / "bigger.npy", bytes);
    EXPECT_THROW(loadTensorFile(dir / "bigger.npy"), Error);
}

TEST(Reliability, WindowAttributesAreCheckedAtImport) {
    auto pool = [](const char* op, const std::vector<int64_t>& strides) {
        onnx::ModelProto m = makeModel({1, 1, 8, 8});
        auto* n = addNode(m, op, {"x"}, {"y"});
        auto* k = n->add_attribute();
        k->set_name("kernel_shape"), k->set_type(onnx::AttributeProto::INTS), k->add_ints(2), k->add_ints(2);
        auto* s = n->add_attribute();
        s->set_name("strides"), s->set_type(onnx::AttributeProto::INTS);
        for (int64_t v : strides) s->add_ints(v);
        return m;
    };
    for (const char* op : {"MaxPool", "AveragePool", "LpPool"}) {
        EXPECT_NE(importError(pool(op, {})).find("attribute 'strides' is empty"), std::string::npos) << op << ": " << importError(pool(op, {}));
        EXPECT_NE(importError(pool(op, {1})).find("spatial dims"), std::string::npos) << op;
        EXPECT_EQ(importError(pool(op, {2, 2})), "") << op;
    }
    onnx::ModelProto conv = makeModel({1, 1, 8, 8});
    auto* w = conv.mutable_graph()->add_initializer();
    w->set_name("w"), w->set_data_type(onnx::TensorProto::FLOAT);
    for (int d : {1, 1, 3, 3}) w->add_dims(d);
    w->set_raw_data(std::string(36, '\0'));
    auto* n = addNode(conv, "Conv", {"x", "w"}, {"y"});
    auto* pads = n->add_attribute();
    pads->set_name("pads"), pads->set_type(onnx::AttributeProto::INTS);
    for (int i = 0; i < 4; ++i) pads->add_ints(int64_t(1) << 62);
    const std::string e = importError(conv);
    EXPECT_NE(e.find("'pads'"), std::string::npos) << e;
    EXPECT_NE(e.find(n->name()), std::string::npos) << "names the node: " << e;
}

TEST(Reliability, IntegerDivisionOfTheMinimumByMinusOneWraps) {
    Graph g;
    g.opset = 17;
    for (const char* name : {"a", "b"}) g.inputs.push_back({name, DType::I64, Shape::fromDims({3})});
    for (const char* op : {"Div", "Mod"}) {
        Node n;
        n.name = op, n.op_type = op, n.inputs = {"a", "b"}, n.outputs = {std::string(op) + "_out"};
        g.nodes.push_back(n);
        g.outputs.push_back({n.outputs[0], DType::I64, Shape::fromDims({3})});
    }
    Builder b(g, "div");
    const Engine e = b.build();
    ExecutionContext ctx(e);  // holds the engine by reference
    const auto out = ctx.run({{"a", Tensor::fromVector<int64_t>({3}, {INT64_MIN, 7, -7})}, {"b", Tensor::fromVector<int64_t>({3}, {-1, -1, 2})}});
    EXPECT_EQ(out[0].toInt64Vector(), (std::vector<int64_t>{INT64_MIN, -7, -3}));  // numpy: MIN // -1 wraps to MIN
    EXPECT_EQ(out[1].toInt64Vector(), (std::vector<int64_t>{0, 0, 1}));            // Mod takes the divisor's sign
    EXPECT_THROW(ctx.run({{"a", Tensor::fromVector<int64_t>({3}, {1, 2, 3})}, {"b", Tensor::fromVector<int64_t>({3}, {1, 0, 1})}}), Error);
}

// An engine whose Conv was corrupted and whose checksum was then recomputed: the loader's
// own checks refuse it.
TEST(Reliability, EngineLoaderRevalidatesBehindTheChecksum) {
    Graph g;
    g.opset = 17;
    g.inputs.push_back({"x", DType::F32, Shape::fromDims({1, 2, 6, 6})});
    g.initializers["w"] = Tensor(DType::F32, {2, 1, 3, 3});
    Node n;
    n.name = "conv", n.op_type = "Conv", n.inputs = {"x", "w"}, n.outputs = {"y"};
    n.attrs.set("group", int64_t(2));
    g.nodes.push_back(n);
    g.outputs.push_back({"y", DType::F32, {}});
    Builder b(g, "conv");
    Engine e = b.build();
    for (const auto& [attr, value] : std::vector<std::pair<const char*, Attribute>>{{"group", int64_t(0)}, {"strides", std::vector<int64_t>{}}, {"pads", std::vector<int64_t>{-1, 0, 0, 0}}}) {
        Engine bad = e;
        for (auto& node : bad.graph.nodes) node.attrs.set(attr, value);
        std::string bytes = serializeEngine(bad);
        resealEngineBytes(bytes);
        EXPECT_THROW(deserializeEngine(bytes, "bad.engine"), Error) << attr;
    }
}

TEST(Reliability, ExternalDataThatIsAFifoIsRefusedNotWaitedOn) {
    TempDir dir;
    ASSERT_EQ(mkfifo((dir / "w.bin").c_str(), 0644), 0);
    onnx::ModelProto m = makeModel({4});
    auto* w = m.mutable_graph()->add_initializer();
    w->set_name("w"), w->set_data_type(onnx::TensorProto::FLOAT), w->add_dims(4);
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* loc = w->add_external_data();
    loc->set_key("location"), loc->set_value("w.bin");
    addNode(m, "Add", {"x", "w"}, {"y"});
    saveModel(m, dir / "m.onnx");
    try {
        importOnnxModel(dir / "m.onnx");
        FAIL() << "a FIFO was read as weights";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
}

TEST(Reliability, FailedWritesAreReportedAndLeaveNoPartialFile) {
    TempDir dir;
    writeFileAtomically(dir / "ok.bin", "hello");
    EXPECT_EQ(readFile(dir / "ok.bin"), "hello");
    EXPECT_THROW(writeFileAtomically(dir / "missing" / "x.bin", "x"), Error);
    // A full disk, simulated by a file-size limit in a child: `kiln run --outputs-dir` must
    // fail naming the file, and must not leave an empty or partial output behind.
    onnx::ModelProto m = makeModel({64, 64});
    addNode(m, "Relu", {"x"}, {"y"});
    saveModel(m, dir / "m.onnx");
    const pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG, as on a full disk
        rlimit small{4096, 4096};
        setrlimit(RLIMIT_FSIZE, &small);
        const std::string cmd = std::string(KILN_BIN) + " run " + (dir / "m.onnx").string() + " --outputs-dir " + (dir / "out").string() + " > " +
                                (dir / "log.txt").string() + " 2>&1";
        execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    const std::string log = readFile(dir / "log.txt");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << log;
    EXPECT_NE(log.find("output_0.pb"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(dir / "out" / "output_0.pb")) << "a partial output was left";
}

TEST(Reliability, ConfigValuesAreValidatedAndTypeErrorsNameTheFile) {
    const std::string base = R"({"model_type": "llama", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 24, "vocab_size": 37)";
    EXPECT_NO_THROW(llm::DecoderConfig::parse(base + "}", "config.json"));
    for (const std::string bad : {R"(, "rms_norm_eps": -1})", R"(, "rope_theta": 0})", R"(, "rope_theta": 1e300})", R"(, "hidden_size": 9223372036854775807})",
                                  R"(, "tie_word_embeddings": "yes"})", R"(, "rope_parameters": {"rope_theta": 1e4, "rope_type": 3}})"}) {
        try {
            llm::DecoderConfig::parse(base + bad, "dir/config.json");
            ADD_FAILURE() << "accepted " << bad;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("dir/config.json"), std::string::npos) << e.what();
        }
    }
    EXPECT_THROW(llm::DecoderConfig::parse(R"({"model_type": 5})", "config.json"), Error);
}
