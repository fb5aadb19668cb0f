// Shape manipulation and data movement: Reshape, Transpose, (Un)Squeeze, Flatten, Concat,
// Split, Slice, Expand, Tile, Shape, Size, Identity, Dropout, Cast(Like), Depth/SpaceToDepth,
// Trilu, Compress, NonZero. Kernels copy bytes, so they work for every dtype.
#include <cstring>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

std::vector<Tensor> identity(const KernelContext& ctx) { return {ctx.input(0)}; }

std::vector<Tensor> dropout(const KernelContext& ctx) {
    // Inference: identity; the optional mask is all true.
    std::vector<Tensor> outs = {ctx.input(0)};
    if (ctx.numOutputs() > 1) {
        Tensor mask(DType::Bool, ctx.input(0).dims());
        std::memset(mask.raw(), 1, mask.byteSize());
        outs.push_back(mask);
    }
    return outs;
}

std::vector<Tensor> reshape(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    std::vector<int64_t> shape = ctx.opset < 5 ? ctx.attrs().getInts("shape") : ctx.input(1).toInt64Vector();
    const bool allowzero = ctx.attrs().getInt("allowzero", 0) != 0;
    int64_t infer = -1, known = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == 0 && !allowzero) {
            ctx.require(i < x.rank(), [&] { return "shape has 0 at position " + std::to_string(i) + " beyond the input rank"; });
            shape[i] = x.dims()[i];
        }
        if (shape[i] == -1) {
            ctx.require(infer < 0, "shape has more than one -1");
            infer = static_cast<int64_t>(i);
        } else {
            ctx.require(shape[i] >= 0, [&] { return "invalid target dimension " + std::to_string(shape[i]); });
            known *= shape[i];
        }
    }
    if (infer >= 0) {
        ctx.require(known != 0 && x.numel() % known == 0, [&] { return "cannot infer -1 reshaping " + x.summary() + " to " + dimsToString(shape); });
        shape[infer] = x.numel() / known;
    }
    ctx.require(numElements(shape) == x.numel(), [&] { return "cannot reshape " + x.summary() + " to " + dimsToString(shape); });
    return {x.reshaped(shape)};
}

}  // namespace

Tensor transposeTensor(const Tensor& x, const std::vector<int64_t>& perm) {
    const size_t rank = x.rank();
    Dims out_dims(rank);
    for (size_t i = 0; i < rank; ++i) out_dims[i] = x.dims()[perm[i]];
    Tensor out(x.dtype(), out_dims);
    const Dims in_strides = stridesOf(x.dims());
    Dims src_strides(rank);
    for (size_t i = 0; i < rank; ++i) src_strides[i] = in_strides[perm[i]];
    const size_t es = dtypeSize(x.dtype());
    Dims idx(rank, 0);
    int64_t off = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
        std::memcpy(out.raw() + i * es, x.raw() + off * es, es);
        for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
            if (++idx[d] < out_dims[d]) {
                off += src_strides[d];
                break;
            }
            off -= src_strides[d] * (out_dims[d] - 1);
            idx[d] = 0;
        }
    }
    return out;
}

namespace {

std::vector<Tensor> transpose(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    std::vector<int64_t> perm = ctx.attrs().getInts("perm");
    if (perm.empty())
        for (int64_t i = static_cast<int64_t>(x.rank()) - 1; i >= 0; --i) perm.push_back(i);
    ctx.require(perm.size() == x.rank(), [&] { return "perm has " + std::to_string(perm.size()) + " entries for input " + x.summary(); });
    std::vector<bool> seen(x.rank(), false);
    for (auto& p : perm) {
        p = normalizeAxis(p, static_cast<int64_t>(x.rank()), ctx);
        ctx.require(!seen[p], [&] { return "perm repeats axis " + std::to_string(p); });
        seen[p] = true;
    }
    return {transposeTensor(x, perm)};
}

std::vector<Tensor> squeeze(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    auto axes = intsFromInputOrAttr(ctx, 1, "axes");
    std::vector<bool> drop(x.rank(), false);
    if (axes.empty()) {
        for (size_t i = 0; i < x.rank(); ++i) drop[i] = x.dims()[i] == 1;
    }
    for (int64_t a : axes) {
        int64_t ax = normalizeAxis(a, static_cast<int64_t>(x.rank()), ctx);
        ctx.require(x.dims()[ax] == 1, [&] { return "cannot squeeze axis " + std::to_string(a) + " of size " + std::to_string(x.dims()[ax]); });
        drop[ax] = true;
    }
    Dims out;
    for (size_t i = 0; i < x.rank(); ++i)
        if (!drop[i]) out.push_back(x.dims()[i]);
    return {x.reshaped(out)};
}

std::vector<Tensor> unsqueeze(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    auto axes = intsFromInputOrAttr(ctx, 1, "axes");
    const int64_t out_rank = static_cast<int64_t>(x.rank() + axes.size());
    std::vector<bool> inserted(static_cast<size_t>(out_rank), false);
    for (int64_t a : axes) {
        int64_t ax = normalizeAxis(a, out_rank, ctx);
        ctx.require(!inserted[ax], [&] { return "axes repeat " + std::to_string(a); });
        inserted[ax] = true;
    }
    Dims out;
    size_t src = 0;
    for (int64_t i = 0; i < out_rank; ++i) out.push_back(inserted[i] ? 1 : x.dims()[src++]);
    return {x.reshaped(out)};
}

std::vector<Tensor> flatten(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    int64_t axis = ctx.attrs().getInt("axis", 1);
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis <= rank, "axis out of range");
    // Both products from the dims: with an empty outer part, numel / outer loses the inner
    // one ([0, 1, 4] flattens to [0, 4], not [0, 0]).
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < rank; ++i) (i < axis ? outer : inner) *= x.dims()[i];
    return {x.reshaped({outer, inner})};
}

std::vector<Tensor> concat(const KernelContext& ctx) {
    const Tensor& first = ctx.input(0);
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis"), static_cast<int64_t>(first.rank()), ctx);
    const Dims out_dims = concatDims(ctx, axis);
    Tensor out(first.dtype(), out_dims);
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= out_dims[d];
    const size_t es = dtypeSize(first.dtype());
    const int64_t out_row = out.numel() / std::max<int64_t>(outer, 1) * static_cast<int64_t>(es);
    int64_t col = 0;
    for (size_t i = 0; i < ctx.numInputs(); ++i) {
        const Tensor& t = ctx.input(i);
        const int64_t row = outer ? static_cast<int64_t>(t.byteSize()) / outer : 0;
        for (int64_t o = 0; o < outer; ++o) std::memcpy(out.raw() + o * out_row + col, t.raw() + o * row, static_cast<size_t>(row));
        col += row;
    }
    return {out};
}

// Copies the slab [start, start+len) along `axis` of x.
Tensor sliceAxis(const Tensor& x, int64_t axis, int64_t start, int64_t len) {
    Dims out_dims = x.dims();
    out_dims[axis] = len;
    Tensor out(x.dtype(), out_dims);
    int64_t outer = 1, inner = static_cast<int64_t>(dtypeSize(x.dtype()));
    for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < x.rank(); ++d) inner *= x.dims()[d];
    for (int64_t o = 0; o < outer; ++o)
        std::memcpy(out.raw() + o * len * inner, x.raw() + (o * x.dims()[axis] + start) * inner, static_cast<size_t>(len * inner));
    return out;
}

std::vector<Tensor> split(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", 0), static_cast<int64_t>(x.rank()), ctx);
    std::vector<int64_t> sizes = intsFromInputOrAttr(ctx, 1, "split");
    const int64_t n = static_cast<int64_t>(ctx.numOutputs());
    const int64_t len = x.dims()[axis];
    if (sizes.empty()) {
        const int64_t chunk = (len + n - 1) / n;  // opset 18 allows a smaller last chunk
        for (int64_t i = 0; i < n; ++i) sizes.push_back(std::min(chunk, len - i * chunk));
    }
    ctx.require(static_cast<int64_t>(sizes.size()) == n, [&] { return "split has " + std::to_string(sizes.size()) + " sizes for " + std::to_string(n) + " outputs"; });
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    ctx.require(total == len, [&] { return "split sizes add up to " + std::to_string(total) + ", axis has " + std::to_string(len); });
    std::vector<Tensor> outs;
    int64_t start = 0;
    for (int64_t s : sizes) {
        outs.push_back(sliceAxis(x, axis, start, s));
        start += s;
    }
    return outs;
}

std::vector<Tensor> slice(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const SlicePlan plan = slicePlan(ctx);
    const Dims &begin = plan.begin, &step = plan.step, &out_dims = plan.out_dims;
    Tensor out(x.dtype(), out_dims);
    const Dims in_strides = stridesOf(x.dims());
    const size_t es = dtypeSize(x.dtype());
    Dims idx(rank, 0);
    for (int64_t i = 0; i < out.numel(); ++i) {
        int64_t off = 0;
        for (int64_t d = 0; d < rank; ++d) off += (begin[d] + idx[d] * step[d]) * in_strides[d];
        std::memcpy(out.raw() + i * es, x.raw() + off * es, es);
        for (int64_t d = rank - 1; d >= 0; --d) {
            if (++idx[d] < out_dims[d]) break;
            idx[d] = 0;
        }
    }
    return {out};
}

// Gathers elements of x at broadcast offsets into a tensor of out_dims (dtype-agnostic).
Tensor gatherOffsets(const Tensor& x, const Dims& out_dims, const std::vector<int64_t>& offsets) {
    Tensor out(x.dtype(), out_dims);
    const size_t es = dtypeSize(x.dtype());
    for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(out.raw() + i * es, x.raw() + offsets[i] * es, es);
    return out;
}

std::vector<Tensor> expand(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    Dims out_dims = broadcastDims(x.dims(), ctx.input(1).toInt64Vector(), [&] { return ctx.node.describe(); });
    Tensor out(x.dtype(), out_dims);
    const BroadcastRuns runs(out_dims, {x.dims()});
    const size_t es = dtypeSize(x.dtype());
    const int64_t len = runs.length();
    const bool whole = runs.step(0) == 1;  // runs copy a row of x, else repeat one element
    runs.forEach([&](int64_t o, const int64_t* in) {
        std::byte* dst = out.raw() + o * es;
        const std::byte* src = x.raw() + in[0] * es;
        if (whole) std::memcpy(dst, src, static_cast<size_t>(len) * es);
        else
            for (int64_t j = 0; j < len; ++j) std::memcpy(dst + j * es, src, es);
    });
    return {out};
}

std::vector<Tensor> tile(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    auto repeats = ctx.input(1).toInt64Vector();
    ctx.require(repeats.size() == x.rank(), "repeats must have one value per input dim");
    for (int64_t r : repeats) ctx.require(r >= 0, "repeats must not be negative");
    Dims out_dims = x.dims();
    for (size_t i = 0; i < x.rank(); ++i) out_dims[i] *= repeats[i];
    const Dims in_strides = stridesOf(x.dims());
    std::vector<int64_t> offsets(static_cast<size_t>(numElements(out_dims)));
    Dims idx(x.rank(), 0);
    for (auto& off : offsets) {
        off = 0;
        for (size_t d = 0; d < x.rank(); ++d) off += (idx[d] % x.dims()[d]) * in_strides[d];
        for (int64_t d = static_cast<int64_t>(x.rank()) - 1; d >= 0; --d) {
            if (++idx[d] < out_dims[d]) break;
            idx[d] = 0;
        }
    }
    return {gatherOffsets(x, out_dims, offsets)};
}

std::vector<Tensor> shape(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    int64_t start = ctx.attrs().getInt("start", 0), end = ctx.attrs().getInt("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, 0, rank);
    std::vector<int64_t> dims(x.dims().begin() + start, x.dims().begin() + std::max(start, end));
    return {Tensor::fromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims)};
}

std::vector<Tensor> size(const KernelContext& ctx) { return {Tensor::scalar<int64_t>(ctx.input(0).numel())}; }

template <typename D, typename S>
D convertElement(S v) {
    if constexpr (std::is_same_v<D, bool>) return static_cast<double>(v) != 0;
    else if constexpr (std::is_integral_v<D> && std::is_integral_v<S>) return static_cast<D>(v);
    else if constexpr (std::is_integral_v<D>) {
        double d = static_cast<double>(v);
        return std::isfinite(d) ? static_cast<D>(d) : D(0);
    } else return static_cast<D>(static_cast<double>(v));
}

Tensor castTensor(const Tensor& x, DType to, const KernelContext& ctx) {
    if (x.dtype() == to) return x;
    Tensor out(to, x.dims());
    dispatchDType(x.dtype(), ctx.node.describe(), [&](auto st) {
        using S = typename decltype(st)::type;
        dispatchDType(to, ctx.node.describe(), [&](auto dt) {
            using D = typename decltype(dt)::type;
            const S* ps = x.data<S>();
            D* pd = out.data<D>();
            for (int64_t i = 0; i < x.numel(); ++i) pd[i] = convertElement<D>(ps[i]);
        });
    });
    return out;
}

// The importer rewrites Cast's ONNX type number into a Kiln dtype name.
std::vector<Tensor> cast(const KernelContext& ctx) {
    return {castTensor(ctx.input(0), parseDType(ctx.attrs().getString("to", "")), ctx)};
}
std::vector<Tensor> castLike(const KernelContext& ctx) { return {castTensor(ctx.input(0), ctx.input(1).dtype(), ctx)}; }

std::vector<Tensor> depthToSpace(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() == 4, "input must be 4-D");
    const int64_t b = ctx.attrs().getInt("blocksize");
    const int64_t N = x.dims()[0], C = x.dims()[1], H = x.dims()[2], W = x.dims()[3];
    ctx.require(b > 0 && C % (b * b) == 0, "channels must be divisible by blocksize^2");
    const bool crd = ctx.attrs().getString("mode", "DCR") == "CRD";
    Tensor tmp = crd ? x.reshaped({N, C / (b * b), b, b, H, W}) : x.reshaped({N, b, b, C / (b * b), H, W});
    Tensor t = crd ? transposeTensor(tmp, {0, 1, 4, 2, 5, 3}) : transposeTensor(tmp, {0, 3, 4, 1, 5, 2});
    return {t.reshaped({N, C / (b * b), H * b, W * b})};
}

std::vector<Tensor> spaceToDepth(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() == 4, "input must be 4-D");
    const int64_t b = ctx.attrs().getInt("blocksize");
    const int64_t N = x.dims()[0], C = x.dims()[1], H = x.dims()[2], W = x.dims()[3];
    ctx.require(b > 0 && H % b == 0 && W % b == 0, "spatial dims must be divisible by blocksize");
    Tensor t = transposeTensor(x.reshaped({N, C, H / b, b, W / b, b}), {0, 3, 5, 1, 2, 4});
    return {t.reshaped({N, C * b * b, H / b, W / b})};
}

std::vector<Tensor> trilu(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() >= 2, "input must have rank >= 2");
    const int64_t k = ctx.hasInput(1) ? ctx.input(1).toInt64Vector().at(0) : 0;
    const bool upper = ctx.attrs().getInt("upper", 1) != 0;
    const int64_t R = x.dims()[x.rank() - 2], C = x.dims()[x.rank() - 1];
    Tensor out = x.clone();
    const size_t es = dtypeSize(x.dtype());
    for (int64_t i = 0; i < x.numel(); ++i) {
        const int64_t c = i % C, r = (i / C) % R;
        const bool keep = upper ? c - r >= k : c - r <= k;
        if (!keep) std::memset(out.raw() + i * es, 0, es);
    }
    return {out};
}

std::vector<Tensor> compress(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& cond = ctx.input(1);
    ctx.require(cond.dtype() == DType::Bool, "condition must be bool");
    const bool has_axis = ctx.attrs().has("axis");
    Tensor src = has_axis ? x : x.reshaped({x.numel()});
    const int64_t axis = has_axis ? normalizeAxis(ctx.attrs().getInt("axis"), static_cast<int64_t>(x.rank()), ctx) : 0;
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < std::min(cond.numel(), src.dims()[axis]); ++i)
        if (cond.data<bool>()[i]) parts.push_back(sliceAxis(src, axis, i, 1));
    Dims out_dims = src.dims();
    out_dims[axis] = static_cast<int64_t>(parts.size());
    Tensor out(x.dtype(), out_dims);
    int64_t outer = 1, inner = static_cast<int64_t>(dtypeSize(x.dtype()));
    for (int64_t d = 0; d < axis; ++d) outer *= src.dims()[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < src.rank(); ++d) inner *= src.dims()[d];
    for (size_t p = 0; p < parts.size(); ++p)
        for (int64_t o = 0; o < outer; ++o)
            std::memcpy(out.raw() + (o * static_cast<int64_t>(parts.size()) + static_cast<int64_t>(p)) * inner, parts[p].raw() + o * inner, static_cast<size_t>(inner));
    return {out};
}

std::vector<Tensor> nonZero(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    std::vector<int64_t> hits;
    for (int64_t i = 0; i < x.numel(); ++i)
        if (x.scalarAt(i) != 0) hits.push_back(i);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const Dims strides = stridesOf(x.dims());
    Tensor out(DType::I64, {rank, static_cast<int64_t>(hits.size())});
    for (size_t h = 0; h < hits.size(); ++h)
        for (int64_t d = 0; d < rank; ++d) out.data<int64_t>()[d * static_cast<int64_t>(hits.size()) + static_cast<int64_t>(h)] = (hits[h] / strides[d]) % x.dims()[d];
    return {out};
}

}  // namespace

void registerShapeKernels(KernelRegistry& r) {
    r.add("Identity", identity);
    r.add("Dropout", dropout);
    r.add("Reshape", reshape);
    r.add("Transpose", transpose);
    r.add("Squeeze", squeeze);
    r.add("Unsqueeze", unsqueeze);
    r.add("Flatten", flatten);
    r.add("Concat", concat);
    r.add("Split", split);
    r.add("Slice", slice);
    r.add("Expand", expand);
    r.add("Tile", tile);
    r.add("Shape", shape);
    r.add("Size", size);
    r.add("Cast", cast);
    r.add("CastLike", castLike);
    r.add("DepthToSpace", depthToSpace);
    r.add("SpaceToDepth", spaceToDepth);
    r.add("Trilu", trilu);
    r.add("Compress", compress);
    r.add("NonZero", nonZero);
}

}  // namespace kiln
