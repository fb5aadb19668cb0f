// The fast data-movement tactics (Concat, Gather) against element-by-element expectations
// computed here from coordinates, on one thread and on two (their copies are cut into
// pieces shared among threads, so piece boundaries are exercised with rows over 64 KiB).
#include <gtest/gtest.h>

#include <random>

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

INSTANTIATE_TEST_SUITE_P(Threads, FastData, ::testing::Values(1, 2));

}  // namespace
}  // namespace kiln::testing
