// The "dnnl" tactic for ConvTranspose (U-Net decoders, FCN and segmentation upsampling, GAN
// generators): f32 NCHW data (2-D or 3-D) through oneDNN's deconvolution, with the bias
// fused. oneDNN picks the weights' layout; they are reordered into it once and kept, with the
// primitive, in the node's KernelMemo for the input dims of the last run. The geometry is the
// reference kernel's (deconvGeometry), so output_padding, output_shape and auto_pad agree.
#include "backends/cpu/fast/tactics.h"

#ifdef KILN_WITH_DNNL
#include <memory>

#include "backends/cpu/fast/dnnl_util.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

struct PreparedDeconv {
    Dims x_dims, w_dims;
    const std::byte* weights = nullptr;  // the data the packed copy was made from
    int threads = 0;
    Dims out_dims;
    dnnl::deconvolution_forward prim;
    memory::desc src, dst, bias, scratchpad;
    memory packed_weights;
};

std::shared_ptr<const PreparedDeconv> prepareDeconv(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    if (ctx.memo)
        if (auto p = ctx.memo->get<PreparedDeconv>();
            p && p->x_dims == x.dims() && p->w_dims == w.dims() && p->weights == w.raw() && p->threads == cpuThreads())
            return p;
    const DeconvGeometry g = deconvGeometry(ctx, x.dims(), w.dims());
    const size_t S = g.kernel.size();
    auto p = std::make_shared<PreparedDeconv>();
    p->x_dims = x.dims(), p->w_dims = w.dims(), p->weights = w.raw(), p->threads = cpuThreads();
    p->out_dims = {x.dims()[0], g.M};
    p->out_dims.insert(p->out_dims.end(), g.out_spatial.begin(), g.out_spatial.end());
    const memory::dims src(x.dims().begin(), x.dims().end()), dst(p->out_dims.begin(), p->out_dims.end());
    // ONNX weights are [C_in, C_out / group, k...]; oneDNN's [(group,) C_out, C_in, k...] in the
    // iohw / giohw tags describe those bytes as they are.
    memory::dims wd;
    if (g.group > 1) wd = {g.group, w.dims()[1], w.dims()[0] / g.group};
    else wd = {w.dims()[1], w.dims()[0]};
    wd.insert(wd.end(), w.dims().begin() + 2, w.dims().end());
    const Tag data_tag = S == 2 ? Tag::nchw : Tag::ncdhw;
    const Tag onnx_weights = S == 2 ? (g.group > 1 ? Tag::giohw : Tag::iohw) : (g.group > 1 ? Tag::giodhw : Tag::iodhw);
    p->src = memory::desc(src, memory::data_type::f32, data_tag);
    p->dst = memory::desc(dst, memory::data_type::f32, data_tag);
    p->bias = memory::desc({g.M}, memory::data_type::f32, Tag::a);
    const memory::desc any_weights(wd, memory::data_type::f32, Tag::any);
    memory::dims strides(g.strides.begin(), g.strides.end()), dilations, pad_l(g.pad_begin.begin(), g.pad_begin.end()),
        pad_r(g.pad_end.begin(), g.pad_end.end());
    for (int64_t d : g.dilations) dilations.push_back(d - 1);
    const bool bias = ctx.hasInput(2);
    const dnnl::engine& engine = dnnlCpuEngine();
    const ScopedOmpThreads scoped(p->threads);  // oneDNN splits the work for the thread count at creation
    const auto desc = bias ? dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct, p->src,
                                                               any_weights, p->bias, p->dst, strides, dilations, pad_l, pad_r)
                           : dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct, p->src,
                                                               any_weights, p->dst, strides, dilations, pad_l, pad_r);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // a buffer per call: safe to run concurrently
    const dnnl::deconvolution_forward::primitive_desc pd(desc, attr, engine);
    p->prim = dnnl::deconvolution_forward(pd);
    p->scratchpad = pd.scratchpad_desc();
    memory given(memory::desc(wd, memory::data_type::f32, onnx_weights), engine, const_cast<std::byte*>(w.raw()));
    p->packed_weights = memory(pd.weights_desc(), engine);
    dnnl::reorder(given, p->packed_weights).execute(dnnlCpuStream(), given, p->packed_weights);
    dnnlCpuStream().wait();
    if (ctx.memo) ctx.memo->set(p);
    return p;
}

bool supportsDnnlDeconv(const Node& n, const Graph&) {
    const auto k = n.attrs.getInts("kernel_shape");
    return n.op_type == "ConvTranspose" && (k.empty() || k.size() == 2 || k.size() == 3);
}

std::vector<Tensor> dnnlDeconv(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* b = ctx.optionalInput(2);
    if (x.dtype() != DType::F32 || w.dtype() != DType::F32 || (b && (b->dtype() != DType::F32)) || (x.rank() != 4 && x.rank() != 5) || w.rank() != x.rank())
        return referenceFallback(ctx);
    std::shared_ptr<const PreparedDeconv> p;
    try {
        p = prepareDeconv(ctx);
    } catch (const dnnl::error&) {
        return referenceFallback(ctx);  // a geometry oneDNN refuses (e.g. negative end padding)
    }
    if (b) ctx.require(b->numel() == p->out_dims[1], "bias must hold one value per output channel");
    Tensor y = ctx.output(0, DType::F32, p->out_dims);
    const dnnl::engine& engine = dnnlCpuEngine();
    thread_local std::vector<std::byte> scratch;
    scratch.resize(p->scratchpad.get_size());
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, memory(p->src, engine, const_cast<std::byte*>(x.raw()))},
                                            {DNNL_ARG_WEIGHTS, p->packed_weights},
                                            {DNNL_ARG_DST, memory(p->dst, engine, y.raw())},
                                            {DNNL_ARG_SCRATCHPAD, memory(p->scratchpad, engine, scratch.data())}};
    if (b) args.emplace(DNNL_ARG_BIAS, memory(p->bias, engine, const_cast<std::byte*>(b->raw())));
    const ScopedOmpThreads threads(p->threads);
    p->prim.execute(dnnlCpuStream(), args);
    dnnlCpuStream().wait();
    return {y};
}

}  // namespace

void addDeconvTactics(std::vector<Tactic>& t) { t.push_back({"dnnl", "conv", {"ConvTranspose"}, supportsDnnlDeconv, dnnlDeconv}); }

}  // namespace kiln

#else

namespace kiln {
void addDeconvTactics(std::vector<Tactic>&) {}
}  // namespace kiln

#endif
