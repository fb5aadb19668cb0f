// Fast data movement: Concat, Gather, Slice and Pad of any element type, written into the planned output
// slot and shared among the threads. The reference kernels copy on one thread into a freshly
// allocated (page-faulting) tensor: SqueezeNet's eight channel Concats at batch 32 took 69% of
// its run that way, and a DLRM's 53 Gathers 83%.
#include <algorithm>
#include <cstring>

#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

// Below this many bytes in all, copies stay on the calling thread.
constexpr int64_t kShareBytes = 256 * 1024;
// Long rows are cut into pieces of this size, so that a few big rows still fill the team.
constexpr int64_t kPieceBytes = 64 * 1024;

// Copies `bytes` from src to dst: element-sized copies of 4 or 8 bytes as plain loads and
// stores (Gather of one index per row moves one element at a time).
inline void copyBytes(std::byte* dst, const std::byte* src, int64_t bytes) {
    if (bytes == 4) std::memcpy(dst, src, 4);
    else if (bytes == 8) std::memcpy(dst, src, 8);
    else std::memcpy(dst, src, static_cast<size_t>(bytes));
}

std::vector<Tensor> fastConcat(const KernelContext& ctx) {
    const Tensor& first = ctx.input(0);
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis"), static_cast<int64_t>(first.rank()), ctx);
    const Dims out_dims = concatDims(ctx, axis);
    Tensor out = ctx.output(0, first.dtype(), out_dims);
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= out_dims[d];
    if (outer == 0 || out.byteSize() == 0) return {out};
    const int64_t out_row = static_cast<int64_t>(out.byteSize()) / outer;
    // Row o of input i lands at column col[i] of output row o; each (row, input) pair is cut
    // into pieces of at most kPieceBytes, and the pieces are the parallel items.
    struct Part {
        const std::byte* src;
        int64_t row, col, pieces;
    };
    std::vector<Part> parts;
    int64_t col = 0, pieces_per_row = 0;
    for (size_t i = 0; i < ctx.numInputs(); ++i) {
        const Tensor& t = ctx.input(i);
        const int64_t row = static_cast<int64_t>(t.byteSize()) / outer;
        if (row == 0) continue;
        const int64_t pieces = (row + kPieceBytes - 1) / kPieceBytes;
        parts.push_back({t.raw(), row, col, pieces});
        col += row;
        pieces_per_row += pieces;
    }
    std::byte* dst = out.raw();
    // Item k: output row k / pieces_per_row, and piece k % pieces_per_row of that row.
    parallelFor(outer * pieces_per_row, static_cast<int64_t>(out.byteSize()) > kShareBytes, [&](int64_t k) {
        const int64_t o = k / pieces_per_row;
        int64_t piece = k % pieces_per_row;
        size_t p = 0;
        while (piece >= parts[p].pieces) piece -= parts[p++].pieces;
        const Part& part = parts[p];
        const int64_t begin = piece * kPieceBytes, len = std::min(kPieceBytes, part.row - begin);
        copyBytes(dst + o * out_row + part.col + begin, part.src + o * part.row + begin, len);
    });
    return {out};
}

std::vector<Tensor> fastGather(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", 0), static_cast<int64_t>(x.rank()), ctx);
    const int64_t len = x.dims()[axis];
    std::vector<int64_t> indices = ind.toInt64Vector();
    for (auto& idx : indices) {  // checked and made non-negative once, before the copies
        const int64_t i = idx < 0 ? idx + len : idx;
        ctx.require(i >= 0 && i < len, [&] { return "index " + std::to_string(idx) + " is out of range for a dimension of size " + std::to_string(len); });
        idx = i;
    }
    Dims out_dims(x.dims().begin(), x.dims().begin() + axis);
    out_dims.insert(out_dims.end(), ind.dims().begin(), ind.dims().end());
    out_dims.insert(out_dims.end(), x.dims().begin() + axis + 1, x.dims().end());
    Tensor out = ctx.output(0, x.dtype(), out_dims);
    int64_t outer = 1, inner = static_cast<int64_t>(dtypeSize(x.dtype()));
    for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < x.rank(); ++d) inner *= x.dims()[d];
    const int64_t n = static_cast<int64_t>(indices.size()), rows = outer * n;
    if (rows == 0 || inner == 0) return {out};
    const std::byte* src = x.raw();
    std::byte* dst = out.raw();
    // Rows in chunks of about kPieceBytes of output, so that one-element rows are not one
    // parallel item each.
    const int64_t per_chunk = std::max<int64_t>(1, kPieceBytes / inner), chunks = (rows + per_chunk - 1) / per_chunk;
    parallelFor(chunks, rows * inner > kShareBytes, [&](int64_t c) {
        for (int64_t r = c * per_chunk, end = std::min(rows, r + per_chunk); r < end; ++r) {
            const int64_t o = r / n, j = r % n;
            copyBytes(dst + r * inner, src + (o * len + indices[static_cast<size_t>(j)]) * inner, inner);
        }
    });
    return {out};
}

// Slice as copies of contiguous runs: the innermost dims taken whole merge into one run, the
// next one in with step 1 contributes its range; the dims outside are walked row by row.
std::vector<Tensor> fastSlice(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const SlicePlan plan = slicePlan(ctx);
    Tensor out = ctx.output(0, x.dtype(), plan.out_dims);
    if (out.numel() == 0) return {out};
    const Dims in_strides = stridesOf(x.dims());
    const int64_t es = static_cast<int64_t>(dtypeSize(x.dtype()));
    int64_t k = static_cast<int64_t>(x.rank()) - 1, run = es, base = 0;
    while (k >= 0 && plan.step[k] == 1 && plan.begin[k] == 0 && plan.out_dims[k] == x.dims()[k]) run *= x.dims()[k--];
    if (k >= 0 && plan.step[k] == 1) {
        run *= plan.out_dims[k];
        base += plan.begin[k] * in_strides[k];
        --k;
    }
    // Rows: the output's dims [0, k], each from begin + index * step of its input dim.
    const size_t outer_rank = static_cast<size_t>(k + 1);
    const int64_t rows = out.numel() * es / run;
    const int64_t per_chunk = std::max<int64_t>(1, kPieceBytes / run), chunks = (rows + per_chunk - 1) / per_chunk;
    const std::byte* src = x.raw();
    std::byte* dst = out.raw();
    parallelFor(chunks, static_cast<int64_t>(out.byteSize()) > kShareBytes, [&](int64_t c) {
        const int64_t first = c * per_chunk, end = std::min(rows, first + per_chunk);
        Dims idx(outer_rank);
        int64_t off = base;  // in elements
        for (int64_t rest = first, d = k; d >= 0; --d) {
            idx[d] = rest % plan.out_dims[d];
            rest /= plan.out_dims[d];
        }
        for (size_t d = 0; d < outer_rank; ++d) off += (plan.begin[d] + idx[d] * plan.step[d]) * in_strides[d];
        for (int64_t r = first; r < end; ++r) {
            copyBytes(dst + r * run, src + off * es, run);
            for (int64_t d = k; d >= 0; --d) {  // odometer over the row dims
                if (++idx[d] < plan.out_dims[d]) {
                    off += plan.step[d] * in_strides[d];
                    break;
                }
                off -= plan.step[d] * in_strides[d] * (plan.out_dims[d] - 1);
                idx[d] = 0;
            }
        }
    });
    return {out};
}

// Reflect, edge and wrap Pad (no cropping, no empty padded axis): each output row along the
// last axis copies its source row (outer coordinates mapped by the mode) into its middle and
// maps its few border elements one by one.
std::vector<Tensor> mirrorPad(const KernelContext& ctx, const PadPlan& plan) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    for (int64_t d = 0; d < rank; ++d)
        if ((plan.begin[d] > 0 || plan.end[d] > 0) && x.dims()[d] == 0) return referenceFallback(ctx);
    Tensor out = ctx.output(0, x.dtype(), plan.out_dims);
    const int64_t last = plan.out_dims[rank - 1], n = x.dims()[rank - 1], before = plan.begin[rank - 1];
    if (out.numel() == 0) return {out};
    const char mode = plan.mode[0];
    const Dims xs = stridesOf(x.dims());
    const size_t es = dtypeSize(x.dtype());
    const int64_t rows = out.numel() / last, row_bytes = last * static_cast<int64_t>(es);
    const int64_t per_chunk = std::max<int64_t>(1, kPieceBytes / std::max<int64_t>(row_bytes, 1)), chunks = (rows + per_chunk - 1) / per_chunk;
    parallelFor(chunks, static_cast<int64_t>(out.byteSize()) > kShareBytes, [&](int64_t c) {
        for (int64_t r = c * per_chunk, end = std::min(rows, (c + 1) * per_chunk); r < end; ++r) {
            int64_t src = 0;
            for (int64_t rest = r, d = rank - 2; d >= 0; --d) {
                src += padSourceIndex(rest % plan.out_dims[d] - plan.begin[d], x.dims()[d], mode) * xs[d];
                rest /= plan.out_dims[d];
            }
            std::byte* o = out.raw() + r * row_bytes;
            const std::byte* s = x.raw() + src * static_cast<int64_t>(es);
            std::memcpy(o + before * static_cast<int64_t>(es), s, static_cast<size_t>(n) * es);
            auto border = [&](int64_t j) { std::memcpy(o + j * static_cast<int64_t>(es), s + padSourceIndex(j - before, n, mode) * static_cast<int64_t>(es), es); };
            for (int64_t j = 0; j < before; ++j) border(j);
            for (int64_t j = before + n; j < last; ++j) border(j);
        }
    });
    return {out};
}

// Constant Pad (no cropping) as a fill of the border and copies of the input's rows into
// the output: the innermost dims without padding merge into one run. Zero values fill any
// dtype; other values f32 only. Reflect, edge and wrap go to mirrorPad; cropping to the
// reference.
std::vector<Tensor> fastPad(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const PadPlan plan = padPlan(ctx);
    bool padded = false, cropped = false;
    for (size_t d = 0; d < x.rank(); ++d) {
        padded |= plan.begin[d] > 0 || plan.end[d] > 0;
        cropped |= plan.begin[d] < 0 || plan.end[d] < 0;
    }
    if (cropped || x.rank() == 0) return referenceFallback(ctx);
    if (plan.mode != "constant") return mirrorPad(ctx, plan);
    if (padded && plan.value != 0 && x.dtype() != DType::F32) return referenceFallback(ctx);
    Tensor out = ctx.output(0, x.dtype(), plan.out_dims);
    const bool share = static_cast<int64_t>(out.byteSize()) > kShareBytes;
    if (padded) {
        const int64_t chunks = (static_cast<int64_t>(out.byteSize()) + kPieceBytes - 1) / kPieceBytes;
        parallelFor(chunks, share, [&](int64_t c) {
            const int64_t first = c * kPieceBytes, len = std::min<int64_t>(kPieceBytes, static_cast<int64_t>(out.byteSize()) - first);
            if (plan.value == 0) std::memset(out.raw() + first, 0, static_cast<size_t>(len));
            else std::fill_n(reinterpret_cast<float*>(out.raw() + first), len / 4, static_cast<float>(plan.value));
        });
    }
    if (x.numel() == 0) return {out};
    const Dims out_strides = stridesOf(plan.out_dims);
    const int64_t es = static_cast<int64_t>(dtypeSize(x.dtype()));
    int64_t k = static_cast<int64_t>(x.rank()) - 1, run = es, base = 0;
    while (k >= 0 && plan.begin[k] == 0 && plan.end[k] == 0) run *= x.dims()[k--];
    if (k >= 0) {
        run *= x.dims()[k];
        base = plan.begin[k] * out_strides[k];
        --k;
    }
    const int64_t rows = x.numel() * es / run;
    const int64_t per_chunk = std::max<int64_t>(1, kPieceBytes / run), chunks = (rows + per_chunk - 1) / per_chunk;
    parallelFor(chunks, share, [&](int64_t c) {
        const int64_t first = c * per_chunk, end = std::min(rows, first + per_chunk);
        for (int64_t r = first; r < end; ++r) {
            int64_t off = base;  // the row's place in the output, in elements
            for (int64_t rest = r, d = k; d >= 0; --d) {
                off += (rest % x.dims()[d] + plan.begin[d]) * out_strides[d];
                rest /= x.dims()[d];
            }
            copyBytes(out.raw() + off * es, x.raw() + r * run, run);
        }
    });
    return {out};
}

}  // namespace

void addDataTactics(std::vector<Tactic>& t) {
    t.push_back({"fast", "data", {"Concat"}, supportsAnyNode, fastConcat});
    t.push_back({"fast", "data", {"Gather"}, supportsAnyNode, fastGather});
    t.push_back({"fast", "data", {"Slice"}, supportsAnyNode, fastSlice});
    t.push_back({"fast", "data", {"Pad"}, supportsAnyNode, fastPad});
}

}  // namespace kiln
