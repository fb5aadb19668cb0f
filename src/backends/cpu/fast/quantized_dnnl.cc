// The "dnnl" tactics of QLinearConv and QLinearMatMul (what qdq_fusion makes of a QDQ model's
// convs and matmuls): oneDNN's int8 kernels (VNNI / AMX where the CPU has them), with the
// requantization y = round((acc + bias) x_scale w_scale / y_scale) + y_zp fused as output
// scales and zero points. oneDNN 2.x adds an int8 conv's bias to the int32 accumulator before
// the scales, as QLinearConv defines it. They take 8-bit activations with scalar parameters
// and constant symmetric int8 weights (zero points 0: oneDNN's, and TensorRT's, form), per
// tensor or per output channel; other nodes take the reference kernel. The int8 convs want
// channels-last data: the kiln QLinearConvNhwc (passes/quantized_layout.cc) has it; a plain
// QLinearConv reorders its NCHW input and output. Without oneDNN the tactics do not exist.
#include "backends/cpu/fast/tactics.h"

#ifdef KILN_WITH_DNNL
#include <cmath>
#include <memory>
#include <unordered_map>

#include "backends/cpu/fast/dnnl_util.h"

namespace kiln {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

memory::data_type dnnlType(DType t) { return t == DType::U8 ? memory::data_type::u8 : memory::data_type::s8; }
const Tensor* constant(const Graph& g, const Node& n, size_t i) {
    if (!n.hasInput(i)) return nullptr;
    auto it = g.initializers.find(n.inputs[i]);
    return it == g.initializers.end() ? nullptr : &it->second;
}

bool allZero(const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i)
        if (t.scalarAt(i) != 0.0) return false;
    return true;
}

// The parameters both ops share: x/a at input 0, its scale and zero point (1, 2), the weights
// and theirs (3, 4, 5), y's (6, 7). Constant, scalar for the activations, 8-bit.
bool supportedParameters(const Node& n, const Graph& g, int64_t channels) {
    const Tensor *xs = constant(g, n, 1), *xz = constant(g, n, 2), *w = constant(g, n, 3), *ws = constant(g, n, 4), *wz = constant(g, n, 5);
    const Tensor *ys = constant(g, n, 6), *yz = constant(g, n, 7);
    if (!xs || !xz || !w || !ws || !wz || !ys || !yz) return false;
    return xs->numel() == 1 && xz->numel() == 1 && isEightBitInteger(xz->dtype()) && w->dtype() == DType::I8 && allZero(*wz) &&
           (ws->numel() == 1 || ws->numel() == channels) && ys->numel() == 1 && yz->numel() == 1 && isEightBitInteger(yz->dtype());
}

bool supportsQConv(const Node& n, const Graph& g) {
    const Tensor* w = constant(g, n, 3);
    if (!w || w->rank() != 4 || !supportedParameters(n, g, w->dims()[0])) return false;
    if (n.hasInput(8) && (!constant(g, n, 8) || constant(g, n, 8)->dtype() != DType::I32)) return false;
    const std::string pad = n.attrs.getString("auto_pad", "NOTSET");
    return pad == "NOTSET" || pad == "VALID";
}

bool supportsQMatMul(const Node& n, const Graph& g) {
    const Tensor* b = constant(g, n, 3);
    return b && b->rank() == 2 && supportedParameters(n, g, b->dims()[1]);
}

// x_scale w_scale[c] / y_scale per output channel (or one value): oneDNN's output scales.
std::vector<float> outputScales(const KernelContext& ctx) {
    const Tensor& ws = ctx.input(4);
    std::vector<float> s(static_cast<size_t>(ws.numel()));
    for (int64_t c = 0; c < ws.numel(); ++c) s[static_cast<size_t>(c)] = static_cast<float>(ctx.input(1).scalarAt(0) * ws.scalarAt(c) / ctx.input(6).scalarAt(0));
    return s;
}

dnnl::primitive_attr requantizeAttr(const KernelContext& ctx, int channel_mask) {
    dnnl::primitive_attr attr;
    const std::vector<float> scales = outputScales(ctx);
    attr.set_output_scales(scales.size() == 1 ? 0 : channel_mask, scales);
    if (const auto zx = static_cast<int32_t>(ctx.input(2).scalarAt(0))) attr.set_zero_points(DNNL_ARG_SRC, 0, {zx});
    if (const auto zy = static_cast<int32_t>(ctx.input(7).scalarAt(0))) attr.set_zero_points(DNNL_ARG_DST, 0, {zy});
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
}

// Integer products of fewer operations than this run on one thread (cf. conv_dnnl.cc).
constexpr double kSharedOps = 4e6;

// One node's primitive for its inputs' dims, the weights reordered into its layout, and the
// reorders of the activations (kept in the executor's KernelMemo).
struct QuantizedPlan {
    Dims x_dims;
    int pool_threads = 0, threads = 1;
    bool usable = false;  // oneDNN has a kernel that is not its reference one
    dnnl::primitive product;
    memory::desc src_user, src, weights, bias, dst_user, dst, scratchpad;
    dnnl::reorder src_in, dst_out;
    std::vector<std::byte> weights_data;
    Dims y_dims;
    DType y_type = DType::U8;
};

template <typename Desc>
void finishPlan(QuantizedPlan& p, const Desc& pd, const Tensor& w, const memory::desc& w_user) {
    const dnnl::engine& e = dnnlCpuEngine();
    p.usable = !dnnlReferenceImplementation(pd.impl_info_str());
    p.src = pd.src_desc(), p.weights = pd.weights_desc(), p.dst = pd.dst_desc(), p.scratchpad = pd.scratchpad_desc();
    if (p.src != p.src_user) p.src_in = dnnl::reorder(dnnl::reorder::primitive_desc(e, p.src_user, e, p.src));
    if (p.dst != p.dst_user) p.dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(e, p.dst, e, p.dst_user));
    p.weights_data.resize(p.weights.get_size());
    memory user(w_user, e, const_cast<std::byte*>(w.raw())), packed(p.weights, e, p.weights_data.data());
    dnnl::reorder(user, packed).execute(dnnlCpuStream(), user, packed);
    dnnlCpuStream().wait();
}

QuantizedPlan convPlan(const KernelContext& ctx) {
    const Tensor &x = ctx.input(0), &w = ctx.input(3);
    const Attributes& a = ctx.attrs();
    const bool nhwc = ctx.node.op_type == "QLinearConvNhwc";
    const Dims& xd = x.dims();
    const int64_t group = a.getInt("group", 1), N = xd[0], C = nhwc ? xd[3] : xd[1], H = nhwc ? xd[1] : xd[2], W = nhwc ? xd[2] : xd[3];
    const int64_t O = w.dims()[0], KH = w.dims()[2], KW = w.dims()[3];
    ctx.require(C == w.dims()[1] * group && O % group == 0, [&] { return "input channels " + std::to_string(C) + " do not match weights " + dimsToString(w.dims()); });
    const auto strides = a.getInts("strides", {1, 1}), dilations = a.getInts("dilations", {1, 1});
    const auto pads = a.getString("auto_pad", "NOTSET") == "VALID" ? std::vector<int64_t>{0, 0, 0, 0} : a.getInts("pads", {0, 0, 0, 0});
    ctx.require(strides.size() == 2 && dilations.size() == 2 && pads.size() == 4, "2-D conv needs 2 strides, 2 dilations and 4 pads");
    const int64_t OH = (H + pads[0] + pads[2] - ((KH - 1) * dilations[0] + 1)) / strides[0] + 1;
    const int64_t OW = (W + pads[1] + pads[3] - ((KW - 1) * dilations[1] + 1)) / strides[1] + 1;
    ctx.require(OH > 0 && OW > 0, [&] { return "the conv's output would be empty for input " + dimsToString(x.dims()); });
    QuantizedPlan p;
    p.x_dims = x.dims(), p.pool_threads = cpuThreads(), p.y_type = ctx.input(7).dtype();
    p.y_dims = nhwc ? Dims{N, OH, OW, O} : Dims{N, O, OH, OW};
    p.threads = 2.0 * N * O * OH * OW * (C / group) * KH * KW < kSharedOps ? 1 : cpuThreads();
    const memory::dims src{N, C, H, W}, dst{N, O, OH, OW};
    const memory::dims wdims = group == 1 ? memory::dims{O, C, KH, KW} : memory::dims{group, O / group, C / group, KH, KW};
    p.src_user = memory::desc(src, dnnlType(x.dtype()), nhwc ? Tag::nhwc : Tag::nchw);
    p.dst_user = memory::desc(dst, dnnlType(p.y_type), nhwc ? Tag::nhwc : Tag::nchw);
    const memory::desc w_user(wdims, memory::data_type::s8, group == 1 ? Tag::oihw : Tag::goihw);
    p.bias = memory::desc({O}, memory::data_type::s32, Tag::a);
    const memory::desc any_src(src, dnnlType(x.dtype()), Tag::any), any_dst(dst, dnnlType(p.y_type), Tag::any), any_w(wdims, memory::data_type::s8, Tag::any);
    const memory::dims s{strides[0], strides[1]}, d{dilations[0] - 1, dilations[1] - 1}, pl{pads[0], pads[1]}, pr{pads[2], pads[3]};
    using Conv = dnnl::convolution_forward;
    const auto desc = ctx.hasInput(8) ? Conv::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_src, any_w, p.bias, any_dst, s, d, pl, pr)
                                      : Conv::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_src, any_w, any_dst, s, d, pl, pr);
    const ScopedOmpThreads threads(p.threads);  // oneDNN splits the work for the thread count at creation
    const Conv::primitive_desc pd(desc, requantizeAttr(ctx, 1 << 1), dnnlCpuEngine());
    p.product = Conv(pd);
    finishPlan(p, pd, w, w_user);
    return p;
}

QuantizedPlan matmulPlan(const KernelContext& ctx) {
    const Tensor &a = ctx.input(0), &b = ctx.input(3);
    ctx.require(a.rank() >= 2 && a.dims().back() == b.dims()[0], [&] { return "A " + dimsToString(a.dims()) + " does not match B " + dimsToString(b.dims()); });
    const int64_t K = b.dims()[0], N = b.dims()[1], M = a.numel() / K;  // leading dims of A flattened into rows
    QuantizedPlan p;
    p.x_dims = a.dims(), p.pool_threads = cpuThreads(), p.y_type = ctx.input(7).dtype();
    p.y_dims = a.dims();
    p.y_dims.back() = N;
    p.threads = 2.0 * M * N * K < kSharedOps ? 1 : cpuThreads();
    p.src_user = memory::desc({M, K}, dnnlType(a.dtype()), Tag::ab);
    p.dst_user = memory::desc({M, N}, dnnlType(p.y_type), Tag::ab);
    const memory::desc w_user({K, N}, memory::data_type::s8, Tag::ab), any_w({K, N}, memory::data_type::s8, Tag::any);
    const ScopedOmpThreads threads(p.threads);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.src_user, any_w, p.dst_user), requantizeAttr(ctx, 1 << 1), dnnlCpuEngine());
    p.product = dnnl::matmul(pd);
    finishPlan(p, pd, b, w_user);
    return p;
}

std::vector<Tensor> runPlanned(const KernelContext& ctx, QuantizedPlan (*plan)(const KernelContext&)) {
    const Tensor& x = ctx.input(0);
    if (!isEightBitInteger(x.dtype()) || x.dtype() != ctx.input(2).dtype()) return referenceFallback(ctx);
    std::shared_ptr<const QuantizedPlan> p = ctx.memo ? ctx.memo->get<QuantizedPlan>() : nullptr;
    if (!p || p->x_dims != x.dims() || p->pool_threads != cpuThreads()) {
        try {
            p = std::make_shared<const QuantizedPlan>(plan(ctx));
        } catch (const dnnl::error& e) {
            ctx.fail(std::string("oneDNN cannot build this int8 product: ") + e.what());
        }
        if (ctx.memo) ctx.memo->set(p);
    }
    if (!p->usable) return referenceFallback(ctx);
    const dnnl::engine& e = dnnlCpuEngine();
    Tensor y = ctx.output(0, p->y_type, p->y_dims);
    thread_local std::vector<std::byte> scratch, src_buffer, dst_buffer;
    scratch.resize(p->scratchpad.get_size());
    memory src_user(p->src_user, e, const_cast<std::byte*>(x.raw())), dst_user(p->dst_user, e, y.raw());
    memory src = src_user, dst = dst_user;
    dnnl::stream& stream = dnnlCpuStream();
    const ScopedOmpThreads threads(p->threads);
    if (p->src_in) {
        src_buffer.resize(p->src.get_size());
        src = memory(p->src, e, src_buffer.data());
        p->src_in.execute(stream, src_user, src);
    }
    if (p->dst_out) {
        dst_buffer.resize(p->dst.get_size());
        dst = memory(p->dst, e, dst_buffer.data());
    }
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src},
                                            {DNNL_ARG_WEIGHTS, memory(p->weights, e, const_cast<std::byte*>(p->weights_data.data()))},
                                            {DNNL_ARG_DST, dst},
                                            {DNNL_ARG_SCRATCHPAD, memory(p->scratchpad, e, scratch.data())}};
    if (ctx.node.op_type != "QLinearMatMul" && ctx.hasInput(8)) args.emplace(DNNL_ARG_BIAS, memory(p->bias, e, const_cast<std::byte*>(ctx.input(8).raw())));
    p->product.execute(stream, args);
    if (p->dst_out) p->dst_out.execute(stream, dst, dst_user);
    stream.wait();
    return {y};
}

std::vector<Tensor> dnnlQConv(const KernelContext& ctx) {
    if (ctx.input(0).rank() != 4) return referenceFallback(ctx);
    return runPlanned(ctx, convPlan);
}

std::vector<Tensor> dnnlQMatMul(const KernelContext& ctx) { return runPlanned(ctx, matmulPlan); }

}  // namespace

void addQuantizedDnnlTactics(std::vector<Tactic>& t) {
    t.push_back({"dnnl", "conv", {"QLinearConv", "QLinearConvNhwc"}, supportsQConv, dnnlQConv});
    t.push_back({"dnnl", "gemm", {"QLinearMatMul"}, supportsQMatMul, dnnlQMatMul});
}

}  // namespace kiln

#else

namespace kiln {
void addQuantizedDnnlTactics(std::vector<Tactic>&) {}
}  // namespace kiln

#endif
