// The fast data-movement tactics (Concat, Gather, Slice) and reductions against element-by-element expectations
// computed here from coordinates, on one thread and on two (their copies are cut into
// pieces shared among threads, so piece boundaries are exercised with rows over 64 KiB).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/reference/kernel_util.h"

#include "fast_tactic_case.h"

namespace kiln::testing {
namespace {

KernelFn fastKernel(const std::string& op) { return kernelForTactic(node(op), "fast"); }

// Coordinates of row-major element `i` of `dims`.
Dims unravel(int64_t i, const Dims& dims) {
    Dims idx(dims.size());
    for (size_t d = dims.size(); d-- > 0;) {
        idx[d] = i % dims[d];
        i /= dims[d];
    }
    return idx;
}

int64_t ravel(const Dims& idx, const Dims& dims) {
    int64_t off = 0;
    for (size_t d = 0; d < dims.size(); ++d) off = off * dims[d] + idx[d];
    return off;
}

Tensor iotaInt64(const Dims& dims, int64_t start) {
    Tensor t(DType::I64, dims);
    int64_t v = start;
    for (auto& x : t.span<int64_t>()) x = v++ * 7;
    return t;
}

class FastData : public ::testing::TestWithParam<int> {
protected:
    void SetUp() override { setCpuThreads(GetParam()); }
    void TearDown() override { setCpuThreads(0); }
};

TEST_P(FastData, ConcatPlacesEveryElement) {
    std::mt19937 rng(5);
    struct Shape {
        std::vector<Dims> parts;
        int64_t axis;
    };
    const std::vector<Shape> shapes = {
        {{{2, 3, 100, 60}, {2, 5, 100, 60}, {2, 1, 100, 60}}, 1},  // rows of 72-120 KB: several pieces
        {{{3, 4}, {1, 4}, {2, 4}}, 0},
        {{{2, 3, 4}, {2, 3, 0}, {2, 3, 5}}, -1},  // an empty part
        {{{2, 2, 5, 5, 16}, {2, 1, 5, 5, 16}}, 1},  // channel blocks, as the blocked layout concatenates them
    };
    for (const auto& s : shapes) {
        Node n = node("Concat");
        n.attrs.set("axis", s.axis);
        std::vector<Tensor> ins;
        for (const auto& d : s.parts) ins.push_back(randomTensor(d, rng));
        std::vector<const Tensor*> ptrs;
        for (const auto& t : ins) ptrs.push_back(&t);
        const auto out = fastKernel("Concat")(KernelContext{n, ptrs, 17, nullptr});
        ASSERT_EQ(out.size(), 1u);
        const size_t axis = s.axis < 0 ? s.parts[0].size() + s.axis : s.axis;
        Dims want_dims = s.parts[0];
        want_dims[axis] = 0;
        for (const auto& d : s.parts) want_dims[axis] += d[axis];
        ASSERT_EQ(out[0].dims(), want_dims);
        int64_t base = 0;  // where part k starts along the axis
        for (const auto& t : ins) {
            for (int64_t i = 0; i < t.numel(); ++i) {
                Dims idx = unravel(i, t.dims());
                idx[axis] += base;
                ASSERT_EQ(out[0].data<float>()[ravel(idx, want_dims)], t.data<float>()[i]);
            }
            base += t.dims()[axis];
        }
    }
}

TEST_P(FastData, ConcatCopiesInt64AndChecksShapes) {
    Node n = node("Concat");
    n.attrs.set("axis", int64_t{0});
    const Tensor a = iotaInt64({2, 3}, 1), b = iotaInt64({1, 3}, 100);
    const auto out = fastKernel("Concat")(KernelContext{n, {&a, &b}, 17, nullptr});
    const std::vector<int64_t> want = {7, 14, 21, 28, 35, 42, 700, 707, 714};
    EXPECT_EQ(std::vector<int64_t>(out[0].span<int64_t>().begin(), out[0].span<int64_t>().end()), want);
    const Tensor c = iotaInt64({1, 4}, 0);
    EXPECT_THROW(fastKernel("Concat")(KernelContext{n, {&a, &c}, 17, nullptr}), Error);
}

TEST_P(FastData, GatherPicksRowsOnEveryAxis) {
    std::mt19937 rng(9);
    const Tensor table = randomTensor({6, 50, 300}, rng);  // rows of 1.2 KB along axis 1
    std::uniform_int_distribution<int64_t> pick(-50, 49);
    for (int64_t axis : {0, 1, 2, -1}) {
        const size_t ax = axis < 0 ? 2 : static_cast<size_t>(axis);
        const int64_t len = table.dims()[ax];
        Tensor ind(DType::I64, {4, 3});  // 2-D indices, negatives among them
        for (auto& v : ind.span<int64_t>()) v = pick(rng) % len;
        Node n = node("Gather");
        n.attrs.set("axis", axis);
        const auto out = fastKernel("Gather")(KernelContext{n, {&table, &ind}, 17, nullptr});
        Dims want_dims(table.dims().begin(), table.dims().begin() + ax);
        want_dims.insert(want_dims.end(), {4, 3});
        want_dims.insert(want_dims.end(), table.dims().begin() + ax + 1, table.dims().end());
        ASSERT_EQ(out[0].dims(), want_dims);
        for (int64_t i = 0; i < out[0].numel(); ++i) {
            const Dims o = unravel(i, want_dims);
            Dims src(o.begin(), o.begin() + ax);
            int64_t k = ind.data<int64_t>()[o[ax] * 3 + o[ax + 1]];
            src.push_back(k < 0 ? k + len : k);
            src.insert(src.end(), o.begin() + ax + 2, o.end());
            ASSERT_EQ(out[0].data<float>()[i], table.data<float>()[ravel(src, table.dims())]) << "axis " << axis << " element " << i;
        }
    }
}

TEST_P(FastData, GatherOfOneColumnAndBadIndices) {
    // A scalar index on axis 1 of int64 ids (a DLRM picking one sparse feature per row).
    const Tensor ids = iotaInt64({2000, 26}, 0);
    Tensor col(DType::I32, {});
    col.data<int32_t>()[0] = 3;
    Node n = node("Gather");
    n.attrs.set("axis", int64_t{1});
    const auto out = fastKernel("Gather")(KernelContext{n, {&ids, &col}, 17, nullptr});
    ASSERT_EQ(out[0].dims(), (Dims{2000}));
    for (int64_t r = 0; r < 2000; ++r) ASSERT_EQ(out[0].data<int64_t>()[r], (r * 26 + 3) * 7);
    col.data<int32_t>()[0] = 26;
    try {
        fastKernel("Gather")(KernelContext{n, {&ids, &col}, 17, nullptr});
        FAIL() << "an index past the axis must be refused";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("index 26 is out of range"), std::string::npos) << e.what();
    }
}

Tensor int64s(const std::vector<int64_t>& v) {
    Tensor t(DType::I64, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.data<int64_t>());
    return t;
}

TEST_P(FastData, SliceTakesEveryStepAndRange) {
    std::mt19937 rng(3);
    const Tensor x = randomTensor({3, 40, 30, 50}, rng);  // 6 KB rows along axis 3, 240 KB per slab
    struct Sel {
        std::vector<int64_t> starts, ends, axes, steps;
    };
    const std::vector<Sel> sels = {
        {{0}, {20}, {1}, {1}},                     // a channel half (ShuffleNet's split): one run per batch
        {{20}, {INT64_MAX}, {1}, {1}},             // the other half, end clamped
        {{1, 2}, {3, 28}, {0, 2}, {1, 1}},         // two axes with step 1
        {{0, 1}, {30, 50}, {2, 3}, {2, 2}},        // YOLO's space-to-depth slices: step 2 on the last axes
        {{-1}, {-41}, {1}, {-3}},                  // a negative step
        {{5, 0}, {5, 0}, {1, 0}, {1, 1}},          // empty
    };
    for (const auto& sel : sels) {
        const Tensor starts = int64s(sel.starts), ends = int64s(sel.ends), axes = int64s(sel.axes), steps = int64s(sel.steps);
        const Node n = node("Slice");
        const KernelContext ctx{n, {&x, &starts, &ends, &axes, &steps}, 17, nullptr};
        const auto out = fastKernel("Slice")(ctx);
        // Expected: along each sliced axis, element i of the output is input element
        // first + i * step (first and count as the ONNX text defines them).
        Dims first(4, 0), step(4, 1), dims = x.dims();
        for (size_t i = 0; i < sel.axes.size(); ++i) {
            const auto r = sliceRange(sel.starts[i], sel.ends[i], sel.steps[i], x.dims()[sel.axes[i]]);
            first[sel.axes[i]] = r.first, step[sel.axes[i]] = sel.steps[i], dims[sel.axes[i]] = r.count;
        }
        ASSERT_EQ(out[0].dims(), dims);
        for (int64_t i = 0; i < out[0].numel(); ++i) {
            Dims idx = unravel(i, dims);
            for (size_t d = 0; d < 4; ++d) idx[d] = first[d] + idx[d] * step[d];
            ASSERT_EQ(out[0].data<float>()[i], x.data<float>()[ravel(idx, x.dims())]) << "element " << i;
        }
    }
}

TEST_P(FastData, ReductionsMatchDoublePrecision) {
    std::mt19937 rng(21);
    const Tensor x = randomTensor({4, 6, 70, 9}, rng, -2.0f, 3.0f);
    const std::vector<std::vector<int64_t>> axis_sets = {{3}, {2, 3}, {1}, {1, 2}, {0}, {}, {-1, -2, -3}};
    for (const std::string op : {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceMax", "ReduceMin"})
        for (const auto& axes : axis_sets)
            for (int64_t keep : {0, 1}) {
                Node n = node(op);
                n.attrs.set("keepdims", keep);
                const Tensor axes_t = int64s(axes);
                const KernelContext ctx{n, {&x, axes.empty() ? nullptr : &axes_t}, 18, nullptr};
                const auto out = fastKernel(op)(ctx);
                std::vector<bool> reduced(4, axes.empty());
                for (int64_t a : axes) reduced[a < 0 ? a + 4 : a] = true;
                Dims kept = x.dims(), want_dims;
                for (size_t d = 0; d < 4; ++d) {
                    if (reduced[d]) kept[d] = 1;
                    if (!reduced[d] || keep) want_dims.push_back(kept[d]);
                }
                ASSERT_EQ(out[0].dims(), want_dims) << op;
                // Each output element from its own walk over the input, in double.
                std::vector<double> acc(static_cast<size_t>(numElements(kept)), op == "ReduceMax" ? -1e300 : op == "ReduceMin" ? 1e300 : 0.0);
                std::vector<int64_t> count(acc.size(), 0);
                for (int64_t i = 0; i < x.numel(); ++i) {
                    Dims idx = unravel(i, x.dims());
                    for (size_t d = 0; d < 4; ++d)
                        if (reduced[d]) idx[d] = 0;
                    const size_t g = static_cast<size_t>(ravel(idx, kept));
                    const double v = x.data<float>()[i];
                    acc[g] = op == "ReduceMax" ? std::max(acc[g], v) : op == "ReduceMin" ? std::min(acc[g], v) : acc[g] + (op == "ReduceSumSquare" ? v * v : v);
                    ++count[g];
                }
                for (size_t g = 0; g < acc.size(); ++g) {
                    const double want = op == "ReduceMean" ? acc[g] / static_cast<double>(count[g]) : acc[g];
                    ASSERT_NEAR(out[0].data<float>()[g], want, 1e-5 * std::max(1.0, std::fabs(want))) << op << " output " << g;
                }
            }
}

TEST_P(FastData, ReduceMaxKeepsNaN) {
    Tensor x(DType::F32, {2, 5});
    for (int64_t i = 0; i < 10; ++i) x.data<float>()[i] = static_cast<float>(i);
    x.data<float>()[2] = NAN;
    Node n = node("ReduceMax");
    n.attrs.set("keepdims", int64_t{0});
    const Tensor axes = int64s({1});
    const auto out = fastKernel("ReduceMax")(KernelContext{n, {&x, &axes}, 18, nullptr});
    EXPECT_TRUE(std::isnan(out[0].data<float>()[0]));
    EXPECT_EQ(out[0].data<float>()[1], 9.0f);
}

TEST_P(FastData, PadPlacesTheInputAndFillsTheBorder) {
    std::mt19937 rng(4);
    const Tensor x = randomTensor({2, 3, 60, 70}, rng);  // 280-byte rows, 50 KB per slab
    struct P {
        std::vector<int64_t> pads;
        float value;
    };
    const std::vector<P> cases = {
        {{0, 0, 1, 2, 0, 0, 3, 1}, 0.0f},   // a conv's spatial padding
        {{0, 0, 0, 0, 0, 0, 0, 0}, 0.0f},   // Swin's window padding where none is needed
        {{1, 0, 0, 0, 0, 2, 0, 0}, 1.5f},   // outer axes, a non-zero value
        {{0, 0, 0, -1, 0, 0, 0, -2}, 0.0f}, // cropping: the reference's
    };
    for (const auto& c : cases) {
        const Tensor pads = int64s(c.pads);
        Tensor value(DType::F32, {});
        value.data<float>()[0] = c.value;
        const Node n = node("Pad");
        const auto out = fastKernel("Pad")(KernelContext{n, {&x, &pads, &value}, 18, nullptr});
        Dims dims(4);
        for (size_t d = 0; d < 4; ++d) dims[d] = x.dims()[d] + c.pads[d] + c.pads[d + 4];
        ASSERT_EQ(out[0].dims(), dims);
        for (int64_t i = 0; i < out[0].numel(); ++i) {
            Dims idx = unravel(i, dims);
            bool inside = true;
            for (size_t d = 0; d < 4; ++d) {
                idx[d] -= c.pads[d];
                inside &= idx[d] >= 0 && idx[d] < x.dims()[d];
            }
            ASSERT_EQ(out[0].data<float>()[i], inside ? x.data<float>()[ravel(idx, x.dims())] : c.value) << "element " << i;
        }
    }
    // int64 with zero padding on the last axis.
    const Tensor ids = iotaInt64({2, 3}, 1), pads = int64s({0, 1, 0, 2});
    const auto out = fastKernel("Pad")(KernelContext{node("Pad"), {&ids, &pads}, 18, nullptr});
    const std::vector<int64_t> want = {0, 7, 14, 21, 0, 0, 0, 28, 35, 42, 0, 0};
    EXPECT_EQ(std::vector<int64_t>(out[0].span<int64_t>().begin(), out[0].span<int64_t>().end()), want);
}

// Reflect, edge and wrap on inner and outer axes (pads wider than the axis in wrap and
// edge), an f32 map and an int64 one, against the modes' definitions walked by hand.
TEST_P(FastData, MirrorPadModesFollowTheirDefinitions) {
    std::mt19937 rng(6);
    auto source = [](int64_t p, int64_t n, const std::string& mode) {
        if (mode == "edge") return std::clamp<int64_t>(p, 0, n - 1);
        if (mode == "wrap") {
            while (p < 0) p += n;
            return p % n;
        }
        if (n == 1) return int64_t{0};
        while (p < 0 || p >= n) p = p < 0 ? -p : 2 * (n - 1) - p;  // reflect: the edge is not repeated
        return p;
    };
    const Tensor f = randomTensor({2, 3, 40, 300}, rng), i = iotaInt64({3, 4}, 3);
    for (const std::string mode : {"reflect", "edge", "wrap"})
        for (const auto& [x, pads] : std::vector<std::pair<Tensor, std::vector<int64_t>>>{
                 {f, {0, 1, 2, 3, 0, 2, 1, 5}}, {i, {2, 5, 1, 6}}, {i, {2, 1, 1, 3}}, {i, {0, 0, 0, 3}}}) {
            bool too_wide = false;  // reflect needs pads below the axis length (ONNX Runtime's rule too)
            for (size_t d = 0; d < pads.size(); ++d) too_wide |= pads[d] >= x.dims()[d % x.rank()];
            if (mode == "reflect" && too_wide) continue;
            const Tensor pt = int64s(pads);
            Node n = node("Pad");
            n.attrs.set("mode", mode);
            const auto out = fastKernel("Pad")(KernelContext{n, {&x, &pt}, 18, nullptr});
            const size_t rank = x.rank();
            Dims dims(rank);
            for (size_t d = 0; d < rank; ++d) dims[d] = x.dims()[d] + pads[d] + pads[d + rank];
            ASSERT_EQ(out[0].dims(), dims) << mode;
            const size_t es = dtypeSize(x.dtype());
            for (int64_t e = 0; e < out[0].numel(); ++e) {
                Dims idx = unravel(e, dims);
                for (size_t d = 0; d < rank; ++d) idx[d] = source(idx[d] - pads[d], x.dims()[d], mode);
                ASSERT_EQ(std::memcmp(out[0].raw() + e * es, x.raw() + ravel(idx, x.dims()) * es, es), 0) << mode << " element " << e;
            }
        }
}

INSTANTIATE_TEST_SUITE_P(Threads, FastData, ::testing::Values(1, 2));

}  // namespace
}  // namespace kiln::testing
