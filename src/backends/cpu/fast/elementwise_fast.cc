// Fast f32 elementwise kernels: binary ops (Add, Sub, Mul, Div, Pow, Max, Min) and fused
// ElementwiseChain nodes, under any numpy broadcast. The output's dims are coalesced with
// every operand's (BroadcastRuns), so that each operand is walked as runs whose elements are
// contiguous or one repeated value: a per-channel scale [N,C,1,1] on [N,C,H,W] becomes runs
// of H*W with one value each, a blocked-layout bias runs of 16 contiguous values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/kernel_util.h"
#include "ir/error.h"

namespace kiln {

namespace {

enum class BinOp { Add, Sub, Mul, Div, Pow, Max, Min };

bool binOpNamed(const std::string& name, BinOp* op) {
    static const std::pair<const char*, BinOp> ops[] = {{"Add", BinOp::Add}, {"Sub", BinOp::Sub}, {"Mul", BinOp::Mul}, {"Div", BinOp::Div},
                                                        {"Pow", BinOp::Pow}, {"Max", BinOp::Max}, {"Min", BinOp::Min}};
    for (const auto& [text, o] : ops)
        if (name == text) {
            *op = o;
            return true;
        }
    return false;
}

// v[i] = v[i] op o[i] (or o[0] when scalar), operands swapped when `swapped`.
__attribute__((target_clones("avx512f", "avx2", "default"))) void chainBinary(float* v, int64_t n, const float* o, bool scalar, BinOp op, bool swapped) {
    // Inlined: a lambda is a function of its own, which the target clones would not cover.
    auto apply = [&](auto f) __attribute__((always_inline)) {
        if (scalar) {
            const float c = o[0];
            if (swapped)
                for (int64_t i = 0; i < n; ++i) v[i] = f(c, v[i]);
            else
                for (int64_t i = 0; i < n; ++i) v[i] = f(v[i], c);
        } else if (swapped) {
            for (int64_t i = 0; i < n; ++i) v[i] = f(o[i], v[i]);
        } else {
            for (int64_t i = 0; i < n; ++i) v[i] = f(v[i], o[i]);
        }
    };
    if (op == BinOp::Pow && scalar && !swapped && o[0] == 2.0f) {  // squares (STFT magnitudes, variances): powf(x, 2) is x * x exactly
        for (int64_t i = 0; i < n; ++i) v[i] *= v[i];
        return;
    }
    switch (op) {
        case BinOp::Add: return apply([](float l, float r) { return l + r; });
        case BinOp::Sub: return apply([](float l, float r) { return l - r; });
        case BinOp::Mul: return apply([](float l, float r) { return l * r; });
        case BinOp::Div: return apply([](float l, float r) { return l / r; });
        case BinOp::Pow: return apply([](float l, float r) { return std::pow(l, r); });
        // std::max/min: the reference kernel's operation (and NaN handling).
        case BinOp::Max: return apply([](float l, float r) { return std::max(l, r); });
        case BinOp::Min: return apply([](float l, float r) { return std::min(l, r); });
    }
}

// v[r * len + j] = v[r * len + j] op o[j] for `runs` runs of `len`: one operand run applied to
// many (a blocked per-channel constant over a channel block's pixels), in one loop nest
// rather than one call per run of 8 or 16 values.
__attribute__((target_clones("avx512f", "avx2", "default"))) void chainPeriodic(float* v, int64_t runs, int64_t len, const float* o, BinOp op, bool swapped) {
    // Inlined: a lambda is a function of its own, which the target clones would not cover.
    auto apply = [&](auto f) __attribute__((always_inline)) {
        auto rows = [&](auto run_len) __attribute__((always_inline)) {
            const int64_t l = run_len;
            for (int64_t r = 0; r < runs; ++r) {
                float* w = v + r * l;
                // simd: w and o may alias as far as the compiler knows, and a 16-wide run
                // was unrolled into scalar code (DenseNet's blocked BatchNorm chains ran at
                // 1 ns an element).
                if (swapped) {
#pragma omp simd
                    for (int64_t j = 0; j < l; ++j) w[j] = f(o[j], w[j]);
                } else {
#pragma omp simd
                    for (int64_t j = 0; j < l; ++j) w[j] = f(w[j], o[j]);
                }
            }
        };
        if (len == 16) rows(std::integral_constant<int64_t, 16>{});
        else if (len == 8) rows(std::integral_constant<int64_t, 8>{});
        else rows(len);
    };
    switch (op) {
        case BinOp::Add: return apply([](float l, float r) { return l + r; });
        case BinOp::Sub: return apply([](float l, float r) { return l - r; });
        case BinOp::Mul: return apply([](float l, float r) { return l * r; });
        case BinOp::Div: return apply([](float l, float r) { return l / r; });
        case BinOp::Pow: return apply([](float l, float r) { return std::pow(l, r); });
        case BinOp::Max: return apply([](float l, float r) { return std::max(l, r); });
        case BinOp::Min: return apply([](float l, float r) { return std::min(l, r); });
    }
}

constexpr int64_t kBlock = 1024;  // elements per step: stays in L1 across a chain's steps

// Runs body(run, offsets, begin, len) over the broadcast runs in pieces of at most kBlock
// (offsets: each input's at the run's start), on the team when the output is large. Short
// runs go in groups of consecutive runs, stepping the offsets from run to run.
template <typename Body>
void forEachPiece(const BroadcastRuns& p, Body&& body) {
    const int64_t len = p.length(), runs = p.runs();
    const bool shared = runs * len > 32768;
    if (len < kBlock) {
        const int64_t group = std::max<int64_t>(1, kBlock / std::max<int64_t>(len, 1)), groups = (runs + group - 1) / group;
        parallelFor(groups, shared, [&](int64_t g) {
            p.forRuns(g * group, std::min(group, runs - g * group), [&](int64_t run, const int64_t* offsets) { body(run, offsets, 0, len); });
        });
        return;
    }
    const int64_t per_run = (len + kBlock - 1) / kBlock;
    parallelFor(runs * per_run, shared, [&](int64_t item) {
        const int64_t run = item / per_run, begin = (item % per_run) * kBlock;
        p.forRuns(run, 1, [&](int64_t, const int64_t* offsets) { body(run, offsets, begin, std::min(kBlock, len - begin)); });
    });
}

// How an input spans a tile of consecutive runs: contiguous across them, the same run
// repeated (periodic), or one value repeated.
enum class Span { Contiguous, Periodic, Repeated };

// The inputs' spans when short runs can go in tiles (each input contiguous across a row's
// runs or repeating one run); empty when some input does neither.
std::vector<Span> tileSpans(const BroadcastRuns& p, size_t inputs) {
    std::vector<Span> spans;
    for (size_t k = 0; k < inputs; ++k) {
        const int64_t stride = p.runStride(k), step = p.step(k);
        if (stride == 0) spans.push_back(step ? Span::Periodic : Span::Repeated);
        else if (step == 1 && stride == p.length()) spans.push_back(Span::Contiguous);
        else return {};
    }
    return spans;
}

// Runs body(first_run, offsets, runs) over tiles of up to kBlock elements, each a stretch of
// consecutive runs within one row of the last outer dim (where tileSpans holds).
template <typename Body>
void forEachTile(const BroadcastRuns& p, Body&& body) {
    const int64_t len = std::max<int64_t>(p.length(), 1), row = p.rowRuns();
    const int64_t per_tile = std::max<int64_t>(1, kBlock / len), tiles_per_row = (row + per_tile - 1) / per_tile;
    const int64_t rows = p.runs() / row;
    parallelFor(rows * tiles_per_row, p.runs() * len > 32768, [&](int64_t item) {
        const int64_t in_row = (item % tiles_per_row) * per_tile, first = (item / tiles_per_row) * row + in_row;
        p.forRuns(first, 1, [&](int64_t, const int64_t* offsets) { body(first, offsets, std::min(per_tile, row - in_row)); });
    });
}

// v[0, runs * len) = a tile of an input, as its span says.
inline void loadTile(float* v, const float* src, Span span, int64_t runs, int64_t len) {
    if (span == Span::Contiguous) std::memcpy(v, src, static_cast<size_t>(runs * len) * sizeof(float));
    else if (span == Span::Repeated) std::fill(v, v + runs * len, src[0]);
    else
        for (int64_t r = 0; r < runs; ++r) std::memcpy(v + r * len, src, static_cast<size_t>(len) * sizeof(float));
}

// v op= a tile of an operand.
inline void applyTile(float* v, const float* o, Span span, int64_t runs, int64_t len, BinOp op, bool swapped) {
    if (span == Span::Periodic) chainPeriodic(v, runs, len, o, op, swapped);
    else chainBinary(v, runs * len, o, span == Span::Repeated, op, swapped);
}

// v[0, len) = a run of the first operand: contiguous (step 1) or one repeated value (step 0).
inline void loadRun(float* v, const float* src, int64_t step, int64_t len) {
    if (step)
        std::memcpy(v, src, static_cast<size_t>(len) * sizeof(float));
    else
        std::fill(v, v + len, src[0]);
}

std::vector<Tensor> fastBinary(const KernelContext& ctx) {
    BinOp op;
    if (ctx.numInputs() != 2 || ctx.numOutputs() != 1 || !binOpNamed(ctx.node.op_type, &op)) return referenceFallback(ctx);
    const Tensor& a = ctx.input(0);
    if (a.dtype() != DType::F32 || ctx.input(1).dtype() != DType::F32) return referenceFallback(ctx);
    const Tensor b = legacyBroadcastOperand(a, ctx.input(1), ctx);
    const Dims out = broadcastDims(a.dims(), b.dims(), [&] { return ctx.node.describe(); });
    const BroadcastRuns runs(out, {a.dims(), b.dims()});
    Tensor y = ctx.output(0, DType::F32, out);
    const float *pa = a.data<float>(), *pb = b.data<float>();
    float* py = y.data<float>();
    const int64_t sa = runs.step(0), sb = runs.step(1), len = runs.length();
    if (const auto spans = tileSpans(runs, 2); len < kBlock && !spans.empty()) {
        forEachTile(runs, [&](int64_t first, const int64_t* offsets, int64_t count) {
            float* v = py + first * len;
            loadTile(v, pa + offsets[0], spans[0], count, len);
            applyTile(v, pb + offsets[1], spans[1], count, len, op, false);
        });
        return {y};
    }
    forEachPiece(runs, [&](int64_t run, const int64_t* offsets, int64_t begin, int64_t len) {
        float* v = py + run * runs.length() + begin;
        loadRun(v, pa + offsets[0] + begin * sa, sa, len);
        chainBinary(v, len, pb + offsets[1] + begin * sb, sb == 0, op, false);
    });
    return {y};
}

// ElementwiseChain over f32: its first input flows through the steps; each binary step reads
// one extra operand, broadcast to the output.
std::vector<Tensor> fastChain(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const auto operand = ctx.attrs().getInts("operand");
    const auto swapped = ctx.attrs().getInts("swapped");
    const auto params = ctx.attrs().getFloats("params");
    const auto& names = std::get<std::vector<std::string>>(ctx.attrs().all().at("ops"));
    if (x.dtype() != DType::F32) return referenceFallback(ctx);
    std::vector<Dims> dims{x.dims()};
    Dims out = x.dims();  // every input broadcasts to it (the flowing one too: a per-channel scale times a map)
    for (size_t i = 1; i < ctx.numInputs(); ++i) {
        if (ctx.input(i).dtype() != DType::F32) return referenceFallback(ctx);
        dims.push_back(ctx.input(i).dims());
        out = broadcastDims(out, ctx.input(i).dims(), [&] { return ctx.node.describe(); });
    }
    const BroadcastRuns runs(out, dims);
    struct Step {
        bool unary;
        Activation act;
        BinOp op;
        size_t input;
        bool swapped;
    };
    std::vector<Step> steps;
    for (size_t s = 0; s < names.size(); ++s) {
        Step st{operand[s] < 0, {}, BinOp::Add, 0, swapped[s] != 0};
        if (st.unary) {
            Node probe;
            probe.attrs.set("activation", names[s]);
            probe.attrs.set("activation_params", std::vector<float>{params[2 * s], params[2 * s + 1]});
            try {
                st.act = Activation::fromNode(probe);
            } catch (const Error&) {
                return referenceFallback(ctx);  // activations without a fast form stay on the reference
            }
        } else {
            if (!binOpNamed(names[s], &st.op)) return referenceFallback(ctx);
            st.input = static_cast<size_t>(operand[s]);
        }
        steps.push_back(st);
    }
    Tensor y = ctx.output(0, DType::F32, out);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    const int64_t sx = runs.step(0), len = runs.length();
    if (const auto spans = tileSpans(runs, ctx.numInputs()); len < kBlock && !spans.empty()) {
        forEachTile(runs, [&](int64_t first, const int64_t* offsets, int64_t count) {
            float* v = py + first * len;
            loadTile(v, px + offsets[0], spans[0], count, len);
            for (const Step& st : steps) {
                if (st.unary) applyEpilogueSerial(v, 1, count * len, nullptr, false, nullptr, st.act);
                else applyTile(v, ctx.input(st.input).data<float>() + offsets[st.input], spans[st.input], count, len, st.op, st.swapped);
            }
        });
        return {y};
    }
    // Step by step over pieces that stay in L1, each step one vectorizable loop (an
    // interpreter per element ran BERT's 32K-element embedding sum at 10 ns an element).
    forEachPiece(runs, [&](int64_t run, const int64_t* offsets, int64_t begin, int64_t len) {
        float* v = py + run * runs.length() + begin;
        loadRun(v, px + offsets[0] + begin * sx, sx, len);
        for (const Step& st : steps) {
            if (st.unary) {
                applyEpilogueSerial(v, 1, len, nullptr, false, nullptr, st.act);
                continue;
            }
            const int64_t step = runs.step(st.input);
            const float* o = ctx.input(st.input).data<float>() + offsets[st.input] + begin * step;
            chainBinary(v, len, o, step == 0, st.op, st.swapped);
        }
    });
    return {y};
}

}  // namespace

void addElementwiseTactics(std::vector<Tactic>& t) {
    t.push_back({"fast", "elementwise", {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}, supportsAnyNode, fastBinary});
    t.push_back({"fast", "elementwise", {"ElementwiseChain"}, supportsAnyNode, fastChain});
}

}  // namespace kiln
