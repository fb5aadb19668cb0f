#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "backends/cpu/reference/kernel.h"
#include "backends/cpu/reference/kernel_util.h"
#include "onnx_import/importer.h"
#include "runtime/accuracy.h"
#include "backends/cpu/graph_executor.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
Graph singleNodeGraph(const std::string& op, std::vector<ValueInfo> inputs, Attributes attrs = {}) {
    Graph g;
    g.opset = 17;
    g.inputs = std::move(inputs);
    g.outputs = {{"y", DType::Undefined, {}}};
    Node n{"n", op, "", {}, {"y"}, std::move(attrs)};
    for (const auto& i : g.inputs) n.inputs.push_back(i.name);
    g.nodes = {n};
    return g;
}

std::string runError(const Graph& g, const TensorMap& inputs) {
    try {
        GraphExecutor(g).run(inputs);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}
}  // namespace

TEST(OpSupport, EveryImportableOpHasACpuKernel) {
    for (const auto& op : supportedOps()) EXPECT_NE(referenceKernels().find(op.op_type), nullptr) << op.op_type;
}

// One range helper serves the CPU and CUDA Slice kernels; these pin it against the ONNX
// Slice text, including the clamps for negative steps that numpy-style slicing treats
// differently (a start below -dim reads element 0 rather than nothing).
TEST(Executor, SliceRangesFollowTheOnnxClamps) {
    auto r = [](int64_t s, int64_t e, int64_t st, int64_t d) {
        const SliceRange x = sliceRange(s, e, st, d);
        return std::pair<int64_t, int64_t>{x.first, x.count};
    };
    EXPECT_EQ(r(1, 4, 1, 5), std::make_pair(int64_t{1}, int64_t{3}));
    EXPECT_EQ(r(0, 100, 2, 5), std::make_pair(int64_t{0}, int64_t{3}));            // end clamped to dim
    EXPECT_EQ(r(-2, INT64_MAX, 1, 5), std::make_pair(int64_t{3}, int64_t{2}));
    EXPECT_EQ(r(-1, INT64_MIN, -1, 5), std::make_pair(int64_t{4}, int64_t{5}));     // full reverse
    EXPECT_EQ(r(10, 1, -2, 5), std::make_pair(int64_t{4}, int64_t{2}));             // start clamped to dim-1: 4, 2
    EXPECT_EQ(r(-10, -100, -1, 4), std::make_pair(int64_t{0}, int64_t{1}));         // start below -dim: element 0
    EXPECT_EQ(r(3, 3, 1, 5).second, 0);
    EXPECT_EQ(r(0, 5, -1, 5).second, 0);
    EXPECT_EQ(r(0, -1, -1, 0).second, 0);  // empty axis
}

// Walking a broadcast in runs reaches each input element at the index numpy's rules give
// (computed here from each output index independently), for random shapes of rank 0-5 with
// random broadcast dims, including empty outputs; a shape that does not broadcast throws.
TEST(Executor, BroadcastRunsFollowNumpyIndexing) {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 300; ++trial) {
        const size_t rank = rng() % 6;
        Dims out(rank);
        for (auto& d : out) d = rng() % 4 + (trial % 50 == 0 ? 0 : 1);
        std::vector<Dims> ins(1 + rng() % 3);
        for (auto& in : ins) {
            in.assign(out.end() - static_cast<int64_t>(rng() % (rank + 1)), out.end());
            for (auto& d : in)
                if (rng() % 3 == 0) d = 1;
        }
        const BroadcastRuns runs(out, ins);
        std::vector<std::vector<int64_t>> seen(ins.size(), std::vector<int64_t>(static_cast<size_t>(numElements(out)), -1));
        runs.forEach([&](int64_t o, const int64_t* in) {
            for (int64_t j = 0; j < runs.length(); ++j)
                for (size_t k = 0; k < ins.size(); ++k) seen[k][static_cast<size_t>(o + j)] = in[k] + j * runs.step(k);
        });
        for (int64_t i = 0; i < numElements(out); ++i) {
            Dims idx(rank);
            for (int64_t d = static_cast<int64_t>(rank) - 1, rest = i; d >= 0; --d) idx[d] = rest % out[d], rest /= out[d];
            for (size_t k = 0; k < ins.size(); ++k) {
                int64_t expect = 0;
                for (size_t d = 0; d < ins[k].size(); ++d)
                    expect = expect * ins[k][d] + (ins[k][d] == 1 ? 0 : idx[rank - ins[k].size() + d]);
                ASSERT_EQ(seen[k][static_cast<size_t>(i)], expect) << dimsToString(out) << " <- " << dimsToString(ins[k]) << " element " << i;
            }
        }
    }
    EXPECT_THROW(BroadcastRuns({2, 3}, {{2}}), Error);
}

TEST(Executor, BatchedMatMulMatchesDoublePrecisionLoops) {
    std::mt19937 rng(11);
    Tensor a = randomTensor({2, 1, 3, 5}, rng), b = randomTensor({4, 5, 6}, rng);
    Graph g = singleNodeGraph("MatMul", {{"a", DType::F32, Shape::fromDims({2, 1, 3, 5})}, {"b", DType::F32, Shape::fromDims({4, 5, 6})}});
    Tensor y = GraphExecutor(g).run({{"a", a}, {"b", b}})[0];
    ASSERT_EQ(y.dims(), (Dims{2, 4, 3, 6}));
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int r = 0; r < 3; ++r)
                for (int c = 0; c < 6; ++c) {
                    double acc = 0;
                    for (int k = 0; k < 5; ++k) acc += double(a.data<float>()[(i * 3 + r) * 5 + k]) * b.data<float>()[(j * 5 + k) * 6 + c];
                    EXPECT_NEAR(y.data<float>()[((i * 4 + j) * 3 + r) * 6 + c], acc, 1e-5);
                }
}

TEST(Executor, ConvMatchesDirectSummation) {
    std::mt19937 rng(5);
    Tensor x = randomTensor({1, 2, 5, 5}, rng), w = randomTensor({3, 2, 3, 3}, rng);
    Attributes attrs;
    attrs.set("strides", std::vector<int64_t>{2, 2});
    attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    Graph g = singleNodeGraph("Conv", {{"x", DType::F32, Shape::fromDims({1, 2, 5, 5})}, {"w", DType::F32, Shape::fromDims({3, 2, 3, 3})}}, attrs);
    Tensor y = GraphExecutor(g).run({{"x", x}, {"w", w}})[0];
    ASSERT_EQ(y.dims(), (Dims{1, 3, 3, 3}));
    for (int m = 0; m < 3; ++m)
        for (int oh = 0; oh < 3; ++oh)
            for (int ow = 0; ow < 3; ++ow) {
                double acc = 0;
                for (int c = 0; c < 2; ++c)
                    for (int kh = 0; kh < 3; ++kh)
                        for (int kw = 0; kw < 3; ++kw) {
                            int ih = oh * 2 - 1 + kh, iw = ow * 2 - 1 + kw;
                            if (ih < 0 || iw < 0 || ih >= 5 || iw >= 5) continue;
                            acc += double(x.data<float>()[(c * 5 + ih) * 5 + iw]) * w.data<float>()[((m * 2 + c) * 3 + kh) * 3 + kw];
                        }
                EXPECT_NEAR(y.data<float>()[(m * 3 + oh) * 3 + ow], acc, 1e-5);
            }
}

// Values resolve by name to the inputs, the computed values, then the graph's constants
// (read in place, not copied per run); a graph output may be any of them, and a value read
// last by a node is freed without touching outputs or constants, run after run.
TEST(Executor, ConstantsInputsAndOutputsResolveByName) {
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims({3})}};
    std::mt19937 rng(5);
    const Tensor w = randomTensor({3}, rng);
    g.initializers["w"] = w;
    g.nodes = {Node{"add", "Add", "", {"x", "w"}, {"s"}, {}}, Node{"mul", "Mul", "", {"s", "w"}, {"y"}, {}}};
    g.outputs = {{"y", DType::Undefined, {}}, {"w", DType::Undefined, {}}, {"x", DType::Undefined, {}}};
    const GraphExecutor exec(g);
    for (int run = 0; run < 3; ++run) {
        const Tensor x = randomTensor({3}, rng);
        const auto out = exec.run({{"x", x}});
        ASSERT_EQ(out.size(), 3u);
        for (int i = 0; i < 3; ++i) {
            const double xi = x.data<float>()[i], wi = w.data<float>()[i];
            EXPECT_NEAR(out[0].data<float>()[i], (xi + wi) * wi, 1e-5) << "run " << run;
            EXPECT_EQ(out[1].data<float>()[i], w.data<float>()[i]);
            EXPECT_EQ(out[2].data<float>()[i], x.data<float>()[i]);
        }
    }
}

TEST(Executor, InputMismatchesAreClearErrors) {
    Shape s;
    s.rank_known = true;
    s.dims = {Dim{-1, "batch"}, Dim{4, {}}};
    Graph g = singleNodeGraph("Add", {{"a", DType::F32, s}, {"b", DType::F32, s}});
    std::mt19937 rng(1);
    Tensor ok = randomTensor({2, 4}, rng);
    EXPECT_NE(runError(g, {{"a", ok}, {"b", randomTensor({2, 5}, rng)}}).find("input 'b' has shape [2,5], the model expects [batch,4]"), std::string::npos);
    EXPECT_NE(runError(g, {{"a", ok}, {"b", randomTensor({3, 4}, rng)}}).find("dim 'batch'"), std::string::npos);
    EXPECT_NE(runError(g, {{"a", ok}}).find("missing input 'b'"), std::string::npos);
    EXPECT_NE(runError(g, {{"a", ok}, {"b", ok}, {"c", ok}}).find("unknown input 'c'"), std::string::npos);
    EXPECT_NE(runError(g, {{"a", ok}, {"b", Tensor(DType::I64, {2, 4})}}).find("element type i64"), std::string::npos);
    EXPECT_EQ(runError(g, {{"a", ok}, {"b", ok}}), "");
}

TEST(Executor, KernelErrorsNameTheNode) {
    Graph g = singleNodeGraph("Reshape", {{"x", DType::F32, Shape::fromDims({6})}, {"s", DType::I64, Shape::fromDims({1})}});
    std::mt19937 rng(1);
    std::string err = runError(g, {{"x", randomTensor({6}, rng)}, {"s", Tensor::fromVector<int64_t>({1}, {4})}});
    EXPECT_NE(err.find("node 'n' (Reshape)"), std::string::npos) << err;
    EXPECT_NE(err.find("cannot reshape"), std::string::npos) << err;
}

TEST(Accuracy, MetricsMatchHandComputedValues) {
    Tensor want = Tensor::fromVector<float>({4}, {1, 2, 3, 4});
    Tensor got = Tensor::fromVector<float>({4}, {1, 2, 3, 5});
    ErrorStats s = compareOutputs(got, want, "y");
    EXPECT_DOUBLE_EQ(s.max_abs, 1.0);
    EXPECT_NEAR(s.rel_l2, 1.0 / std::sqrt(30.0), 1e-12);
    EXPECT_NEAR(s.cosine, 34.0 / std::sqrt(30.0 * 39.0), 1e-12);
    EXPECT_THROW(compareOutputs(Tensor::fromVector<float>({2}, {1, 2}), want, "y"), Error);
}

// Exporters (torchvision's nms) pass INT64_MAX as max_output_boxes_per_class: no limit.
TEST(Executor, NonMaxSuppressionTakesInt64MaxAsNoLimit) {
    Node n{"nms", "NonMaxSuppression", "", {}, {"y"}, {}};
    // Three boxes: the second overlaps the first (IoU 0.81), the third is apart.
    const Tensor boxes = Tensor::fromVector<float>({1, 3, 4}, {0, 0, 10, 10, 0, 1, 10, 10, 20, 20, 30, 30});
    const Tensor scores = Tensor::fromVector<float>({1, 1, 3}, {0.9f, 0.8f, 0.7f});
    const Tensor iou = Tensor::scalar<float>(0.5f);
    for (int64_t limit : {std::numeric_limits<int64_t>::max(), int64_t{1}}) {
        const Tensor max_out = Tensor::fromVector<int64_t>({1}, {limit});
        const auto out = referenceKernels().find("NonMaxSuppression")(KernelContext{n, {&boxes, &scores, &max_out, &iou}, 17, nullptr});
        const std::vector<int64_t> want = limit == 1 ? std::vector<int64_t>{0, 0, 0} : std::vector<int64_t>{0, 0, 0, 0, 0, 2};
        EXPECT_EQ(out[0].toInt64Vector(), want) << "limit " << limit;
    }
}

// Empty tensors keep their other dims: a detector with no boxes left flattens [0, 1, 4] to
// [0, 4] (a Split along axis 1 follows), and normalizations over an empty batch run.
TEST(Executor, EmptyTensorsKeepTheirOtherDims) {
    Node flat{"f", "Flatten", "", {}, {"y"}, {}};
    const Tensor boxes(DType::F32, {0, 1, 4});
    for (int64_t axis : {1, 2}) {
        flat.attrs.set("axis", axis);
        const auto out = referenceKernels().find("Flatten")(KernelContext{flat, {&boxes}, 17, nullptr});
        EXPECT_EQ(out[0].dims(), (Dims{0, 4})) << "axis " << axis;  // [0] x [1, 4] and [0, 1] x [4]
    }
    flat.attrs.set("axis", int64_t{0});
    EXPECT_EQ(referenceKernels().find("Flatten")(KernelContext{flat, {&boxes}, 17, nullptr})[0].dims(), (Dims{1, 0}));
    const Tensor x(DType::F32, {0, 3, 2, 2}), c = Tensor::fromVector<float>({3}, {1, 2, 3});
    Node bn{"bn", "BatchNormalization", "", {}, {"y"}, {}};
    EXPECT_EQ(referenceKernels().find("BatchNormalization")(KernelContext{bn, {&x, &c, &c, &c, &c}, 17, nullptr})[0].dims(), x.dims());
    Node in{"in", "InstanceNormalization", "", {}, {"y"}, {}};
    EXPECT_EQ(referenceKernels().find("InstanceNormalization")(KernelContext{in, {&x, &c, &c}, 17, nullptr})[0].dims(), x.dims());
}
