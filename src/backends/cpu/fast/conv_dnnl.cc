// The "dnnl" conv tactic: channel-blocked (NCHW8c or NCHW16c) FusedConv nodes, which the
// layout pass made with weights packed in oneDNN's AVX2 or AVX-512 formats (blocks of 8 or
// 16 channels), through oneDNN's JIT convolutions with
// the bias, the residual (a sum post-op) and the activation fused. oneDNN reads and writes
// the blocked tensors and the packed weights in place: no reorder runs per call.
// Primitives are cached per geometry, since building one costs 10-20 us (a MobileNetV2
// inference has 52 convs). Without oneDNN the tactic does not exist and the reference
// kernel runs these nodes.
#include "backends/cpu/fast/tactics.h"

#ifdef KILN_WITH_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "backends/cpu/fast/dnnl_util.h"
#include "backends/cpu/reference/channel_blocks.h"

namespace kiln {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

bool blockedConvNode(const Node& n) {
    const int64_t block = blockedDataLayoutBlock(n.attrs.getString("data_layout", "NCHW"));
    return n.op_type == "FusedConv" && block > 0 && packedConvWeightBlock(n.attrs.getString("weight_layout", "")) == block &&
           n.attrs.getInts("weight_dims").size() == 4;
}

// The node's activation as a oneDNN eltwise post-op (algorithm, alpha, beta); nullopt for one
// oneDNN 2.6 does not compute as ONNX defines it (those nodes take the reference kernel).
struct Eltwise {
    dnnl::algorithm algorithm;
    float alpha = 0.f, beta = 0.f;
    bool then_clip01 = false;  // a second post-op, clip to [0, 1] (HardSigmoid = linear, then clip)
};
std::optional<std::optional<Eltwise>> postOpActivation(const Node& n) {
    const std::string act = n.attrs.getString("activation", "none");
    auto p = n.attrs.getFloats("activation_params");
    p.resize(2, 0.f);
    using A = dnnl::algorithm;
    if (act == "none") return std::optional<Eltwise>{};
    if (act == "Relu") return Eltwise{A::eltwise_relu};
    if (act == "LeakyRelu") return Eltwise{A::eltwise_relu, p[0]};
    if (act == "Clip") return Eltwise{A::eltwise_clip, p[0], p[1]};
    if (act == "Sigmoid") return Eltwise{A::eltwise_logistic};
    if (act == "Silu") return Eltwise{A::eltwise_swish, 1.f};  // x * sigmoid(alpha x)
    if (act == "Tanh") return Eltwise{A::eltwise_tanh};
    if (act == "Gelu") return Eltwise{A::eltwise_gelu_erf};
    if (act == "GeluTanh") return Eltwise{A::eltwise_gelu_tanh};
    if (act == "HardSwish") return Eltwise{A::eltwise_hardswish};  // x * relu6(x + 3) / 6
    if (act == "Softplus") return Eltwise{A::eltwise_soft_relu};   // log(1 + e^x)
    // oneDNN 2.6 has no hardsigmoid; linear is only ever made here, so the key's algorithm
    // tells it apart.
    if (act == "HardSigmoid") return Eltwise{A::eltwise_linear, p.empty() ? 0.2f : p[0], p.size() < 2 ? 0.5f : p[1], true};
    return std::nullopt;
}

bool supportsBlockedConv(const Node& n, const Graph&) { return blockedConvNode(n) && postOpActivation(n).has_value(); }

// One conv's geometry, read from the node and its input at run time.
struct BlockedConv {
    int64_t N, C, H, W, O, KH, KW, OH, OW, group, block;
    std::vector<int64_t> strides, dilations, pads;  // pads: top, left, bottom, right
    bool plain_src, bias, residual;
    std::string weight_layout;

    // What a primitive depends on, as numbers (cheap to build and compare on every call):
    // the geometry, the layouts, the fused inputs, the activation and the thread count.
    using Key = std::array<int64_t, 24>;
    Key key(const Node& node, int threads) const {
        const auto act = postOpActivation(node);
        const Eltwise e = act && *act ? **act : Eltwise{dnnl::algorithm::undef};
        float ab[2] = {e.alpha, e.beta};
        int64_t bits = 0;
        std::memcpy(&bits, ab, sizeof(bits));
        const int64_t layout = static_cast<int64_t>(packedConvWeightKind(weight_layout));
        return {N, C, H, W, O, KH, KW, group, strides[0], strides[1], dilations[0], dilations[1], pads[0], pads[1], pads[2], pads[3],
                layout, plain_src, bias, residual, static_cast<int64_t>(e.algorithm), bits, threads, block};
    }
};

BlockedConv geometry(const KernelContext& ctx) {
    const Attributes& a = ctx.attrs();
    const auto wd = a.getInts("weight_dims");
    BlockedConv g{};
    g.group = a.getInt("group", 1);
    g.O = wd[0], g.C = wd[1] * g.group, g.KH = wd[2], g.KW = wd[3];
    const std::string layout = a.getString("data_layout", "");
    g.block = blockedDataLayoutBlock(layout);
    g.plain_src = a.getString("src_layout", layout) == "NCHW";
    g.weight_layout = a.getString("weight_layout", "");
    const Tensor& x = ctx.input(0);
    const Dims want =
        g.plain_src ? Dims{x.rank() ? x.dims()[0] : 0, g.C, -1, -1} : Dims{x.rank() ? x.dims()[0] : 0, channelBlocks(g.C, g.block), -1, -1, g.block};
    bool ok = x.rank() == want.size();
    for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || x.dims()[i] == want[i];
    ctx.require(ok, [&] { return "input of " + (g.plain_src ? std::string("NCHW") : layout) + " conv over " + std::to_string(g.C) + " channels has dims " + dimsToString(x.dims()); });
    g.N = x.dims()[0], g.H = x.dims()[2], g.W = x.dims()[3];
    g.strides = a.getInts("strides", {1, 1});
    g.dilations = a.getInts("dilations", {1, 1});
    g.pads = a.getString("auto_pad", "NOTSET") == "VALID" ? std::vector<int64_t>{0, 0, 0, 0} : a.getInts("pads", {0, 0, 0, 0});
    ctx.require(g.strides.size() == 2 && g.dilations.size() == 2 && g.pads.size() == 4, "2-D conv needs 2 strides, 2 dilations and 4 pads");
    g.OH = (g.H + g.pads[0] + g.pads[2] - ((g.KH - 1) * g.dilations[0] + 1)) / g.strides[0] + 1;
    g.OW = (g.W + g.pads[1] + g.pads[3] - ((g.KW - 1) * g.dilations[1] + 1)) / g.strides[1] + 1;
    ctx.require(g.OH > 0 && g.OW > 0, [&] { return "the conv's output would be empty for input " + dimsToString(x.dims()); });
    g.bias = ctx.hasInput(2);
    g.residual = ctx.hasInput(3);
    if (g.bias) ctx.require(ctx.input(2).numel() == g.O && ctx.input(2).dtype() == DType::F32, [&] { return "bias must hold " + std::to_string(g.O) + " f32 values"; });
    if (g.residual)
        ctx.require(ctx.input(3).dims() == Dims{g.N, channelBlocks(g.O, g.block), g.OH, g.OW, g.block} && ctx.input(3).dtype() == DType::F32,
                    [&] { return "residual must be the blocked output's shape, got " + dimsToString(ctx.input(3).dims()); });
    return g;
}

const dnnl::engine& cpuEngine() { return dnnlCpuEngine(); }
dnnl::stream& cpuStream() { return dnnlCpuStream(); }

// src, weights and dst are the blocked layouts the node's tensors have. When oneDNN has only
// its reference kernel for those (a 1 x 128 kernel with 64 pads, wav2vec2's positional conv:
// 1.2 s there, 9 ms in brgconv's own layouts), the conv runs in the layouts oneDNN picks
// (native_*), through reorders in and out: cheap next to the conv they rescue.
struct CachedPrimitive {
    dnnl::convolution_forward conv;
    memory::desc src, weights, bias, dst, scratchpad;
    bool via_native = false;
    memory::desc native_src, native_weights, native_dst;
    dnnl::reorder src_in, weights_in, dst_in, dst_out;  // dst_in: the residual, for the sum post-op
};

bool referenceImplementation(const dnnl::convolution_forward::primitive_desc& pd) { return dnnlReferenceImplementation(pd.impl_info_str()); }

CachedPrimitive buildPrimitive(const BlockedConv& g, const Node& node) {
    const memory::dims src{g.N, g.C, g.H, g.W}, dst{g.N, g.O, g.OH, g.OW};
    const PackedConvWeights kind = packedConvWeightKind(g.weight_layout);
    const bool wide = g.block == kWideChannelBlock;
    const memory::dims weights = kind == PackedConvWeights::Goihwg    ? memory::dims{g.group, 1, 1, g.KH, g.KW}
                                 : kind == PackedConvWeights::GOIhwIO || kind == PackedConvWeights::Goihw ? memory::dims{g.group, g.O / g.group, g.C / g.group, g.KH, g.KW}
                                                                      : memory::dims{g.O, g.C, g.KH, g.KW};
    const Tag weight_tag = kind == PackedConvWeights::Goihwg    ? (wide ? Tag::Goihw16g : Tag::Goihw8g)
                           : kind == PackedConvWeights::GOIhwIO ? (wide ? Tag::gOIhw16i16o : Tag::gOIhw8i8o)
                           : kind == PackedConvWeights::Goihw   ? Tag::goihw
                           : kind == PackedConvWeights::Ohwio ? (wide ? Tag::Ohwi16o : Tag::Ohwi8o)
                                                              : (wide ? Tag::OIhw16i16o : Tag::OIhw8i8o);
    const Tag blocked_tag = wide ? Tag::nChw16c : Tag::nChw8c;
    CachedPrimitive c;
    c.src = memory::desc(src, memory::data_type::f32, g.plain_src ? Tag::nchw : blocked_tag);
    c.weights = memory::desc(weights, memory::data_type::f32, weight_tag);
    c.bias = memory::desc({g.O}, memory::data_type::f32, Tag::a);
    c.dst = memory::desc(dst, memory::data_type::f32, blocked_tag);
    const memory::dims strides{g.strides[0], g.strides[1]}, dilations{g.dilations[0] - 1, g.dilations[1] - 1};
    const memory::dims pad_l{g.pads[0], g.pads[1]}, pad_r{g.pads[2], g.pads[3]};
    const auto desc = g.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, c.src, c.weights,
                                                               c.bias, c.dst, strides, dilations, pad_l, pad_r)
                             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, c.src, c.weights,
                                                               c.dst, strides, dilations, pad_l, pad_r);
    dnnl::post_ops ops;
    if (g.residual) ops.append_sum(1.f);  // act(conv + bias + residual), as FusedConv defines
    if (const auto act = *postOpActivation(node)) {
        ops.append_eltwise(1.f, act->algorithm, act->alpha, act->beta);
        if (act->then_clip01) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, 0.f, 1.f);
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // a buffer per call: safe to run concurrently
    dnnl::convolution_forward::primitive_desc pd(desc, attr, cpuEngine());
    if (referenceImplementation(pd)) {
        const memory::desc any_src(src, memory::data_type::f32, Tag::any), any_weights(weights, memory::data_type::f32, Tag::any),
            any_dst(dst, memory::data_type::f32, Tag::any);
        const auto native = g.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_src,
                                                                     any_weights, c.bias, any_dst, strides, dilations, pad_l, pad_r)
                                   : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_src,
                                                                     any_weights, any_dst, strides, dilations, pad_l, pad_r);
        dnnl::convolution_forward::primitive_desc native_pd(native, attr, cpuEngine());
        if (!referenceImplementation(native_pd)) {
            const dnnl::engine& e = cpuEngine();
            c.via_native = true;
            c.native_src = native_pd.src_desc(), c.native_weights = native_pd.weights_desc(), c.native_dst = native_pd.dst_desc();
            c.src_in = dnnl::reorder(dnnl::reorder::primitive_desc(e, c.src, e, c.native_src));
            c.weights_in = dnnl::reorder(dnnl::reorder::primitive_desc(e, c.weights, e, c.native_weights));
            c.dst_in = dnnl::reorder(dnnl::reorder::primitive_desc(e, c.dst, e, c.native_dst));
            c.dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(e, c.native_dst, e, c.dst));
            pd = native_pd;
        }
    }
    c.conv = dnnl::convolution_forward(pd);
    c.scratchpad = pd.scratchpad_desc();
    return c;
}

// Shared, so that a primitive outlives the cache starting over while a run or a memo holds it.
std::shared_ptr<const CachedPrimitive> cachedPrimitive(const BlockedConv& g, const Node& node, int threads) {
    static std::mutex mutex;
    static std::map<BlockedConv::Key, std::shared_ptr<const CachedPrimitive>> cache;
    const BlockedConv::Key key = g.key(node, threads);
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (cache.size() >= 4096) cache.clear();  // many geometries (dynamic shapes): start over
    // oneDNN splits the work for the thread count at creation (and runs it at execution).
    const ScopedOmpThreads scoped(threads);
    return cache.emplace(key, std::make_shared<const CachedPrimitive>(buildPrimitive(g, node))).first->second;
}

// Dense convolutions of fewer floating-point operations run on one thread: sharing them
// costs more than it gains. On the 2-core VM of 2026-12-03, small_cnn's batch-2 first conv
// (1.8 MFLOP) took 13 us in the model on one thread and 17 on two, and the MaxPool after it
// 3 us instead of 9 (its input no longer split between the cores' caches); the second conv
// (4.7 MFLOP) gained from two (26 -> 20 us). Depthwise convs (few FLOPs for their bytes)
// keep sharing: MobileNetV2 was 3% slower with its small ones on one thread. (Timing each
// node alone, as tactic.cpu.conv=auto does, picks two threads: what it costs shows in the
// nodes around.)
constexpr double kSharedConvFlops = 2e6;
// Grouped and depthwise convs share down to fewer FLOPs (they are memory-bound), but not the
// tiniest: Silero's depthwise convs took 1 us alone and 6 us on two threads of the 2-core VM.
constexpr double kSharedGroupedConvFlops = 2e5;

// A node's geometry and primitive for the inputs' dims of its last run (the executor's
// KernelMemo): reading the attributes and finding the primitive took 2-3 us a call, a
// fifth of a small conv.
struct PreparedConv {
    std::vector<Dims> input_dims;  // Dims{} for an omitted input
    int pool_threads;              // cpuThreads() when prepared
    int threads;                   // the conv's: 1 for small ones
    BlockedConv g;
    std::shared_ptr<const CachedPrimitive> prim;
    std::vector<std::byte> native_weights;  // the packed weights reordered for a via_native primitive

    static std::vector<Dims> inputDims(const KernelContext& ctx) {
        std::vector<Dims> d(ctx.numInputs());
        for (size_t i = 0; i < d.size(); ++i)
            if (ctx.hasInput(i)) d[i] = ctx.input(i).dims();
        return d;
    }
    bool matches(const KernelContext& ctx) const {
        if (pool_threads != cpuThreads() || input_dims.size() != ctx.numInputs()) return false;
        for (size_t i = 0; i < input_dims.size(); ++i)
            if (ctx.hasInput(i) ? ctx.input(i).dims() != input_dims[i] : !input_dims[i].empty()) return false;
        return true;
    }
};

std::shared_ptr<const PreparedConv> prepareConv(const KernelContext& ctx) {
    if (ctx.memo)
        if (auto p = ctx.memo->get<PreparedConv>(); p && p->matches(ctx)) return p;
    auto p = std::make_shared<PreparedConv>(PreparedConv{PreparedConv::inputDims(ctx), cpuThreads(), cpuThreads(), geometry(ctx), nullptr, {}});
    const BlockedConv& g = p->g;
    const double flops = 2.0 * g.N * g.O * g.OH * g.OW * (g.C / g.group) * g.KH * g.KW;
    if (flops < (g.group == 1 ? kSharedConvFlops : kSharedGroupedConvFlops)) p->threads = 1;
    try {
        p->prim = cachedPrimitive(p->g, ctx.node, p->threads);
    } catch (const dnnl::error& e) {
        ctx.fail(std::string("oneDNN cannot build this convolution: ") + e.what());
    }
    const Tensor& w = ctx.input(1);
    ctx.require(p->prim->weights.get_size() == w.byteSize(),
                [&] { return "packed weights of " + dimsToString(w.dims()) + " do not match " + p->g.weight_layout; });
    if (p->prim->via_native) {
        const dnnl::engine& e = cpuEngine();
        p->native_weights.resize(p->prim->native_weights.get_size());
        memory packed(p->prim->weights, e, const_cast<std::byte*>(w.raw())), native(p->prim->native_weights, e, p->native_weights.data());
        const ScopedOmpThreads threads(p->threads);
        p->prim->weights_in.execute(cpuStream(), packed, native);
        cpuStream().wait();
    }
    if (ctx.memo) ctx.memo->set(p);
    return p;
}

// This thread's oneDNN memory objects for a primitive's arguments, made once and pointed at
// each call's buffers: making them per call took 0.25 us each, 2 us of small_cnn's 40-us
// batch-2 run. Keyed by the primitive's address and checked through a weak pointer, so that
// a new primitive at a dead one's address gets its own.
std::unordered_map<int, memory>& threadArguments(const std::shared_ptr<const CachedPrimitive>& prim, bool bias) {
    struct Entry {
        std::weak_ptr<const CachedPrimitive> owner;
        std::unordered_map<int, memory> args;
    };
    thread_local std::unordered_map<const CachedPrimitive*, Entry> entries;
    Entry& e = entries[prim.get()];
    if (e.owner.expired()) {  // new, or made for a dead primitive (bias or not is part of a primitive's key)
        if (entries.size() > 4096) {  // dead primitives' entries pile up with many geometries: start over
            entries.clear();
            return threadArguments(prim, bias);
        }
        const dnnl::engine& engine = cpuEngine();
        e.owner = prim;
        e.args = {{DNNL_ARG_SRC, memory(prim->src, engine, nullptr)},
                  {DNNL_ARG_WEIGHTS, memory(prim->weights, engine, nullptr)},
                  {DNNL_ARG_DST, memory(prim->dst, engine, nullptr)},
                  {DNNL_ARG_SCRATCHPAD, memory(prim->scratchpad, engine, nullptr)}};
        if (bias) e.args.emplace(DNNL_ARG_BIAS, memory(prim->bias, engine, nullptr));
    }
    return e.args;
}

// A conv in oneDNN's own layouts: the blocked input (and the residual in y) reordered in,
// the output reordered back into y. Rare and slow-kernel-rescuing, so its memory objects are
// made per call.
void runViaNative(const KernelContext& ctx, const PreparedConv& prepared, std::vector<std::byte>& scratch, Tensor& y) {
    const CachedPrimitive& prim = *prepared.prim;
    const dnnl::engine& e = cpuEngine();
    thread_local std::vector<std::byte> src_buffer, dst_buffer;
    src_buffer.resize(prim.native_src.get_size());
    dst_buffer.resize(prim.native_dst.get_size());
    memory blocked_src(prim.src, e, const_cast<std::byte*>(ctx.input(0).raw())), native_src(prim.native_src, e, src_buffer.data());
    memory blocked_dst(prim.dst, e, y.raw()), native_dst(prim.native_dst, e, dst_buffer.data());
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, native_src},
                                            {DNNL_ARG_WEIGHTS, memory(prim.native_weights, e, const_cast<std::byte*>(prepared.native_weights.data()))},
                                            {DNNL_ARG_DST, native_dst},
                                            {DNNL_ARG_SCRATCHPAD, memory(prim.scratchpad, e, scratch.data())}};
    if (prepared.g.bias) args.emplace(DNNL_ARG_BIAS, memory(prim.bias, e, const_cast<std::byte*>(ctx.input(2).raw())));
    dnnl::stream& stream = cpuStream();
    const ScopedOmpThreads threads(prepared.threads);
    prim.src_in.execute(stream, blocked_src, native_src);
    if (prepared.g.residual) prim.dst_in.execute(stream, blocked_dst, native_dst);
    prim.conv.execute(stream, args);
    prim.dst_out.execute(stream, native_dst, blocked_dst);
    stream.wait();
}

std::vector<Tensor> blockedConv(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    if (x.dtype() != DType::F32 || w.dtype() != DType::F32) return referenceFallback(ctx);
    const auto prepared = prepareConv(ctx);
    const BlockedConv& g = prepared->g;
    const CachedPrimitive* prim = prepared->prim.get();
    Tensor y = ctx.output(0, DType::F32, {g.N, channelBlocks(g.O, g.block), g.OH, g.OW, g.block});
    if (g.residual) std::memcpy(y.raw(), ctx.input(3).raw(), y.byteSize());  // the sum post-op adds what dst holds
    thread_local std::vector<std::byte> scratch;
    scratch.resize(prim->scratchpad.get_size());
    if (prim->via_native) {
        runViaNative(ctx, *prepared, scratch, y);
        return {y};
    }
    std::unordered_map<int, memory>& args = threadArguments(prepared->prim, g.bias);
    args.at(DNNL_ARG_SRC).set_data_handle(const_cast<std::byte*>(x.raw()));
    args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<std::byte*>(w.raw()));
    args.at(DNNL_ARG_DST).set_data_handle(y.raw());
    args.at(DNNL_ARG_SCRATCHPAD).set_data_handle(scratch.data());
    if (g.bias) args.at(DNNL_ARG_BIAS).set_data_handle(const_cast<std::byte*>(ctx.input(2).raw()));
    const ScopedOmpThreads threads(prepared->threads);
    prim->conv.execute(cpuStream(), args);
    cpuStream().wait();
    return {y};
}

}  // namespace

void addBlockedConvTactics(std::vector<Tactic>& t) { t.push_back({"dnnl", "conv", {"FusedConv"}, supportsBlockedConv, blockedConv}); }

}  // namespace kiln

#else

namespace kiln {
void addBlockedConvTactics(std::vector<Tactic>&) {}
}  // namespace kiln

#endif
