// Kernels of the fused ops passes create (kiln domain): FusedConv, FusedMatMul,
// Attention and ElementwiseChain, and the layout changes BlockChannels / UnblockChannels. Each is defined as the composition it replaces, so the
// reference stays the specification the fast backends must match.
#include <cmath>

#include "backends/cpu/reference/channel_blocks.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

// y = act(y + z), in y's dtype, with z broadcast; z may be null.
Tensor epilogue(const KernelContext& ctx, const Tensor& y, const Tensor* z) {
    auto params = ctx.attrs().getFloats("activation_params");
    params.resize(2, 0.0f);
    auto act = unaryFunction(ctx.attrs().getString("activation", "none"), params[0], params[1], ctx);
    return dispatchFloat(y.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (!z) return mapElements<T>(y, act);
        ctx.require(z->dtype() == y.dtype(), "residual input type differs from the output");
        return broadcastBinary<T, T, T>(y, *z, ctx, [&](T a, T b) { return static_cast<T>(act(static_cast<double>(a) + static_cast<double>(b))); });
    });
}

// data_layout NCHW (default), NHWC, or NCHW8c / NCHW16c: blocked activations
// (channel_blocks.h) with packed weights, unpacked here so that the plain reference conv
// defines the result.
std::vector<Tensor> fusedConv(const KernelContext& ctx) {
    const std::string layout = ctx.attrs().getString("data_layout", "NCHW");
    const int64_t block = blockedDataLayoutBlock(layout);
    const bool nhwc = layout == "NHWC", blocked = block > 0;
    ctx.require(nhwc || blocked || layout == "NCHW", [&] { return "unknown data_layout '" + layout + "'"; });
    Tensor x = ctx.input(0), w = ctx.input(1), z;
    if (ctx.hasInput(3)) z = ctx.input(3);
    if (nhwc) x = transposeTensor(x, {0, 3, 1, 2});
    if (blocked) {
        const auto dims = ctx.attrs().getInts("weight_dims");
        ctx.require(dims.size() == 4 && dims[0] > 0 && dims[1] > 0, [&] { return layout + " conv needs weight_dims [O, I, KH, KW]"; });
        const std::string weight_layout = ctx.attrs().getString("weight_layout", "");
        ctx.require(packedConvWeightBlock(weight_layout) == block, [&] { return layout + " conv needs weights packed in blocks of " + std::to_string(block) + ", got '" + weight_layout + "'"; });
        const int64_t out_channels = dims[0], in_channels = dims[1] * ctx.attrs().getInt("group", 1);
        const bool blocked_src = ctx.attrs().getString("src_layout", layout) != "NCHW";
        if (blocked_src) ctx.require(x.rank() == 5 && x.dims()[4] == block, [&] { return layout + " conv needs a blocked input, got " + dimsToString(x.dims()); });
        if (z.defined()) ctx.require(z.rank() == 5 && z.dims()[4] == block, [&] { return layout + " conv needs a blocked residual, got " + dimsToString(z.dims()); });
        try {  // the layout helpers' errors, prefixed with the node once
            if (blocked_src) x = unblockChannels(x, in_channels);
            w = unpackConvWeights(w, weight_layout, dims);
            if (z.defined()) z = unblockChannels(z, out_channels);
        } catch (const Error& e) {
            ctx.fail(e.what());
        }
    }
    KernelContext conv_ctx{ctx.node, {&x, &w, ctx.optionalInput(2)}, ctx.opset, nullptr};
    Tensor y = convKernel(conv_ctx)[0];
    if (nhwc) y = transposeTensor(y, {0, 2, 3, 1});
    y = epilogue(ctx, y, z.defined() ? &z : nullptr);
    return {blocked ? blockChannels(y, block) : y};
}

// The layout changes at the ends of a channel-blocked conv chain.
std::vector<Tensor> blockChannelsKernel(const KernelContext& ctx) {
    ctx.require(ctx.input(0).rank() == 4, [&] { return "BlockChannels needs a 4-D NCHW input, got " + dimsToString(ctx.input(0).dims()); });
    const int64_t block = ctx.attrs().getInt("block", kChannelBlock);
    ctx.require(isChannelBlock(block), [&] { return "BlockChannels: blocks of " + std::to_string(block) + " channels (8 or 16 are defined)"; });
    return {blockChannels(ctx.input(0), block)};
}

std::vector<Tensor> unblockChannelsKernel(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t channels = ctx.attrs().getInt("channels", 0);
    ctx.require(x.rank() == 5 && isChannelBlock(x.dims()[4]) && channels > 0 && channelBlocks(channels, x.dims()[4]) == x.dims()[1],
                [&] { return ctx.node.op_type + " of " + std::to_string(channels) + " channels needs a [N, C/b, H, W, b] input (b 8 or 16), got " +
                    dimsToString(x.dims()); });
    return {unblockChannels(x, channels)};
}

std::vector<Tensor> fusedMatMul(const KernelContext& ctx) {
    Tensor b = ctx.input(1);
    if (ctx.attrs().getInt("trans_b", 0) != 0) {
        ctx.require(b.rank() == 2, "trans_b needs a 2-D B");
        b = transposeTensor(b, {1, 0});
    }
    KernelContext mm{ctx.node, {ctx.inputs.at(0), &b}, ctx.opset, nullptr};
    Tensor y = matmulKernel(mm)[0];
    // act(A B + bias + residual): input 3, the residual, as in FusedConv.
    const Tensor* bias = ctx.optionalInput(2);
    const Tensor* residual = ctx.optionalInput(3);
    if (residual && bias) {
        ctx.require(bias->dtype() == y.dtype(), "bias type differs from the output");
        y = dispatchFloat(y.dtype(), ctx.node.describe(), [&](auto tag) {
            using T = typename decltype(tag)::type;
            return broadcastBinary<T, T, T>(y, *bias, ctx, [](T p, T q) { return static_cast<T>(static_cast<double>(p) + static_cast<double>(q)); });
        });
    }
    return {epilogue(ctx, y, residual ? residual : bias)};
}

std::vector<Tensor> attention(const KernelContext& ctx) {
    const std::string layout = ctx.attrs().getString("layout", "");
    if (layout == "bshd") {  // the transposes the layout stands for, around the canonical form
        for (size_t i = 0; i < 3; ++i) ctx.require(ctx.input(i).rank() == 4, "layout bshd needs rank-4 q, k and v");
        const Tensor q = transposeTensor(ctx.input(0), {0, 2, 1, 3}), kt = transposeTensor(ctx.input(1), {0, 2, 3, 1}),
                     v = transposeTensor(ctx.input(2), {0, 2, 1, 3});
        Node canonical = ctx.node;
        canonical.attrs.set("layout", std::string());
        KernelContext c{canonical, {&q, &kt, &v, ctx.optionalInput(3)}, ctx.opset, nullptr};
        return {transposeTensor(attention(c)[0], {0, 2, 1, 3})};
    }
    ctx.require(layout.empty(), [&] { return "unknown attention layout '" + layout + "'"; });
    KernelContext qk{ctx.node, {ctx.inputs.at(0), ctx.inputs.at(1)}, ctx.opset, nullptr};
    Tensor s = matmulKernel(qk)[0];
    const double scale = ctx.attrs().getFloat("scale", 1.0f);
    const Tensor* mask = ctx.optionalInput(3);
    Tensor p = dispatchFloat(s.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor scores = mask ? broadcastBinary<T, T, T>(s, *mask, ctx, [&](T a, T m) { return static_cast<T>(static_cast<double>(a) * scale + static_cast<double>(m)); })
                             : mapElements<T>(s, [&](double a) { return a * scale; });
        const int64_t len = scores.dims().back();
        const int64_t rows = len ? scores.numel() / len : 0;
        T* ps = scores.template data<T>();
        for (int64_t r = 0; r < rows; ++r) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < len; ++j) mx = std::max(mx, static_cast<double>(ps[r * len + j]));
            for (int64_t j = 0; j < len; ++j) sum += std::exp(static_cast<double>(ps[r * len + j]) - mx);
            for (int64_t j = 0; j < len; ++j) ps[r * len + j] = static_cast<T>(std::exp(static_cast<double>(ps[r * len + j]) - mx) / sum);
        }
        return scores;
    });
    KernelContext pv{ctx.node, {&p, ctx.inputs.at(2)}, ctx.opset, nullptr};
    return {matmulKernel(pv)[0]};
}

std::vector<Tensor> elementwiseChain(const KernelContext& ctx) {
    const auto ops = ctx.attrs().getInts("operand");
    const auto swapped = ctx.attrs().getInts("swapped");
    const auto params = ctx.attrs().getFloats("params");
    const auto& attr = ctx.attrs().all().at("ops");
    const auto& names = std::get<std::vector<std::string>>(attr);
    ctx.require(ops.size() == names.size() && swapped.size() == names.size() && params.size() == 2 * names.size(), "malformed chain attributes");
    const Tensor& x = ctx.input(0);
    Dims out_dims = x.dims();
    for (size_t i = 1; i < ctx.numInputs(); ++i) out_dims = broadcastDims(out_dims, ctx.input(i).dims(), [&] { return ctx.node.describe(); });
    std::vector<std::vector<int64_t>> offsets;
    for (size_t i = 0; i < ctx.numInputs(); ++i) offsets.push_back(broadcastOffsets(out_dims, ctx.input(i).dims()));
    std::vector<std::function<double(double)>> unary(names.size());
    for (size_t s = 0; s < names.size(); ++s)
        if (ops[s] < 0) unary[s] = unaryFunction(names[s], params[2 * s], params[2 * s + 1], ctx);
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        for (int64_t i = 0; i < out.numel(); ++i) {
            double v = static_cast<double>(x.data<T>()[offsets[0][i]]);
            for (size_t s = 0; s < names.size(); ++s) {
                if (ops[s] < 0) {
                    v = unary[s](v);
                    continue;
                }
                double o = static_cast<double>(ctx.input(ops[s]).template data<T>()[offsets[ops[s]][i]]);
                double l = swapped[s] ? o : v, r = swapped[s] ? v : o;
                const std::string& op = names[s];
                if (op == "Add") v = l + r;
                else if (op == "Sub") v = l - r;
                else if (op == "Mul") v = l * r;
                else if (op == "Div") v = l / r;
                else if (op == "Pow") v = std::pow(l, r);
                else if (op == "Max") v = std::max(l, r);
                else if (op == "Min") v = std::min(l, r);
                else ctx.fail("unknown binary step '" + op + "'");
                // Round like the unfused graph, which stores every intermediate in T.
                v = static_cast<double>(static_cast<T>(v));
            }
            out.data<T>()[i] = static_cast<T>(v);
        }
        return out;
    })};
}

// A pooling node inside a blocked chain: the plain pool ("pool") on the unblocked input.
std::vector<Tensor> blockedPool(const KernelContext& ctx) {
    const std::string pool = ctx.attrs().getString("pool", "");
    ctx.require(pool == "MaxPool" || pool == "AveragePool" || pool == "GlobalAveragePool" || pool == "GlobalMaxPool", [&] { return "unknown blocked pool '" + pool + "'"; });
    const Tensor plain = unblockChannelsKernel(ctx)[0];
    Node inner = ctx.node;
    inner.op_type = pool;
    inner.domain.clear();
    KernelContext c{inner, {&plain}, ctx.opset, nullptr};
    return {blockChannels(referenceKernels().find(pool)(c).at(0), ctx.input(0).dims()[4])};
}

}  // namespace

void registerFusedKernels(KernelRegistry& r) {
    r.add("FusedConv", fusedConv);
    r.add("BlockChannels", blockChannelsKernel);
    r.add("UnblockChannels", unblockChannelsKernel);
    r.add("BlockedPool", blockedPool);
    r.add("FusedMatMul", fusedMatMul);
    r.add("Attention", attention);
    r.add("ElementwiseChain", elementwiseChain);
}

}  // namespace kiln
