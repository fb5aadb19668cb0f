// Control flow: If, Loop and Scan. Their subgraphs run through the caller's subgraph runner
// when it gives one (the executor), else node by node on the reference kernels (constant
// folding, tactic timing, a CUDA host fallback). Outer values a subgraph reads arrive as the
// node's inputs after the formal ones, named inside the subgraph by attribute "captures"
// (liftCaptures in ir/graph.h).
#include <cstring>
#include <limits>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

using Scope = std::map<std::string, Tensor>;

const Tensor* lookup(const Graph& g, const Scope& values, const std::string& name) {
    if (auto it = values.find(name); it != values.end()) return &it->second;
    if (auto it = g.initializers.find(name); it != g.initializers.end()) return &it->second;
    return nullptr;
}

// A subgraph interpreter over the reference kernels, for callers that give no runner.
std::vector<Tensor> runOnReferenceKernels(const Graph& g, const Scope& scope) {
    Scope values = scope;
    for (const Node& node : g.nodes) {
        KernelFn fn = referenceKernels().find(node.op_type);
        check(fn != nullptr, [&] { return node.describe() + ": no CPU kernel"; });
        std::vector<const Tensor*> in;
        for (const auto& name : node.inputs) {
            if (name.empty()) {
                in.push_back(nullptr);
                continue;
            }
            const Tensor* t = lookup(g, values, name);
            check(t != nullptr, [&] { return node.describe() + ": input '" + name + "' has no value"; });
            in.push_back(t);
        }
        std::vector<Tensor> outs = fn(KernelContext{node, in, g.opset, runOnReferenceKernels});
        for (size_t k = 0; k < node.outputs.size() && k < outs.size(); ++k)
            if (!node.outputs[k].empty()) values[node.outputs[k]] = std::move(outs[k]);
    }
    std::vector<Tensor> result;
    for (const auto& o : g.outputs) {
        const Tensor* t = lookup(g, values, o.name);
        check(t != nullptr, [&] { return "subgraph '" + g.name + "': output '" + o.name + "' was not computed"; });
        result.push_back(*t);
    }
    return result;
}

// The scope a subgraph starts with: the captured outer values, under their inner names.
Scope capturedScope(const KernelContext& ctx) {
    const std::vector<std::string> names = ctx.attrs().getStrings("captures");
    const size_t formal = formalInputCount(ctx.node);
    Scope scope;
    for (size_t k = 0; k < names.size(); ++k) scope[names[k]] = ctx.input(formal + k);
    return scope;
}

std::vector<Tensor> runBody(const KernelContext& ctx, const Graph& g, const Scope& scope) {
    std::vector<Tensor> outs = ctx.run_subgraph ? ctx.run_subgraph(g, scope) : runOnReferenceKernels(g, scope);
    ctx.require(outs.size() == g.outputs.size(), [&] { return "subgraph '" + g.name + "' returned the wrong number of outputs"; });
    return outs;
}

bool truth(const KernelContext& ctx, const Tensor& t, const char* what) {
    ctx.require(t.numel() == 1, [&] { return std::string(what) + " must hold one element, it has shape " + dimsToString(t.dims()); });
    return t.scalarAt(0) != 0;
}

std::vector<Tensor> ifKernel(const KernelContext& ctx) {
    const bool cond = truth(ctx, ctx.input(0), "the condition");
    const auto branch = ctx.attrs().getGraph(cond ? "then_branch" : "else_branch");
    std::vector<Tensor> outs = runBody(ctx, *branch, capturedScope(ctx));
    ctx.require(outs.size() == ctx.numOutputs(), [&] {
        return std::string(cond ? "then" : "else") + " branch has " + std::to_string(outs.size()) + " outputs, the node " + std::to_string(ctx.numOutputs());
    });
    return outs;
}

// Stacks equally shaped tensors along a new axis `axis` (0 <= axis <= rank); `reverse`
// stacks them last first. With no parts, the shape comes from `declared` (dims unknown: 0).
Tensor stack(const KernelContext& ctx, const std::vector<Tensor>& parts, int64_t axis, bool reverse, const ValueInfo& declared) {
    if (parts.empty()) {
        Dims dims;
        if (declared.shape.rank_known)
            for (const auto& d : declared.shape.dims) dims.push_back(d.known() ? d.size : 0);
        dims.insert(dims.begin() + std::min<int64_t>(axis, static_cast<int64_t>(dims.size())), 0);
        return Tensor(declared.dtype == DType::Undefined ? DType::F32 : declared.dtype, dims);
    }
    const Tensor& first = parts[0];
    for (const auto& p : parts)
        ctx.require(p.dims() == first.dims() && p.dtype() == first.dtype(),
                    [&] { return "scan output parts differ: " + first.summary() + " and " + p.summary(); });
    Dims dims = first.dims();
    ctx.require(axis >= 0 && axis <= static_cast<int64_t>(dims.size()), "scan output axis out of range");
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= dims[static_cast<size_t>(d)];
    const size_t inner = outer ? first.byteSize() / static_cast<size_t>(outer) : 0;
    dims.insert(dims.begin() + axis, static_cast<int64_t>(parts.size()));
    tensorBytes(first.dtype(), dims, ctx.node.describe() + " scan output");
    Tensor out = Tensor::uninitialized(first.dtype(), dims);
    const size_t n = parts.size();
    for (size_t k = 0; k < n; ++k) {
        const Tensor& p = parts[reverse ? n - 1 - k : k];
        for (int64_t o = 0; o < outer; ++o)
            std::memcpy(out.raw() + (static_cast<size_t>(o) * n + k) * inner, p.raw() + static_cast<size_t>(o) * inner, inner);
    }
    return out;
}

// Slice `index` of `t` along `axis`, the axis removed.
Tensor sliceAt(const Tensor& t, int64_t axis, int64_t index) {
    Dims dims = t.dims();
    const int64_t len = dims[static_cast<size_t>(axis)];
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= dims[static_cast<size_t>(d)];
    dims.erase(dims.begin() + axis);
    Tensor out = Tensor::uninitialized(t.dtype(), dims);
    const size_t inner = out.byteSize() / static_cast<size_t>(std::max<int64_t>(outer, 1));
    for (int64_t o = 0; o < outer; ++o)
        std::memcpy(out.raw() + static_cast<size_t>(o) * inner, t.raw() + (static_cast<size_t>(o * len + index)) * inner, inner);
    return out;
}

std::vector<Tensor> loopKernel(const KernelContext& ctx) {
    const auto body = ctx.attrs().getGraph("body");
    const size_t formal = formalInputCount(ctx.node);
    ctx.require(formal >= 2 && body->inputs.size() == formal, [&] {
        return "body takes " + std::to_string(body->inputs.size()) + " inputs, the node passes " + std::to_string(formal);
    });
    const size_t carried = formal - 2;
    ctx.require(body->outputs.size() >= carried + 1, "body has fewer outputs than loop-carried values + 1");
    const size_t scans = body->outputs.size() - 1 - carried;
    ctx.require(ctx.numOutputs() == carried + scans, [&] {
        return "the node has " + std::to_string(ctx.numOutputs()) + " outputs, the body gives " + std::to_string(carried) + " loop-carried and " +
               std::to_string(scans) + " scan outputs";
    });
    const Tensor* trip = ctx.optionalInput(0);
    const Tensor* cond_in = ctx.optionalInput(1);
    ctx.require(trip || cond_in, "neither a trip count nor a condition: the loop would never end");
    ctx.require(!trip || (trip->numel() == 1 && trip->dtype() == DType::I64), "the trip count must be one int64");
    // Read as an integer: exporters write INT64_MAX for "no limit", which a double cannot hold.
    const int64_t max_trips = trip ? trip->toInt64Vector()[0] : std::numeric_limits<int64_t>::max();
    bool cond = cond_in ? truth(ctx, *cond_in, "the condition") : true;
    std::vector<Tensor> state;
    for (size_t k = 0; k < carried; ++k) state.push_back(ctx.input(2 + k));
    std::vector<std::vector<Tensor>> scanned(scans);
    Scope scope = capturedScope(ctx);
    for (int64_t i = 0; i < max_trips && cond; ++i) {
        scope[body->inputs[0].name] = Tensor::scalar<int64_t>(i);
        scope[body->inputs[1].name] = Tensor::scalar<bool>(cond);
        for (size_t k = 0; k < carried; ++k) scope[body->inputs[2 + k].name] = state[k];
        std::vector<Tensor> outs = runBody(ctx, *body, scope);
        if (cond_in) cond = truth(ctx, outs[0], "the body's condition output");
        for (size_t k = 0; k < carried; ++k) state[k] = std::move(outs[1 + k]);
        for (size_t k = 0; k < scans; ++k) scanned[k].push_back(std::move(outs[1 + carried + k]));
    }
    std::vector<Tensor> result = std::move(state);
    for (size_t k = 0; k < scans; ++k) result.push_back(stack(ctx, scanned[k], 0, false, body->outputs[1 + carried + k]));
    return result;
}

std::vector<Tensor> scanKernel(const KernelContext& ctx) {
    const auto body = ctx.attrs().getGraph("body");
    const size_t formal = formalInputCount(ctx.node);
    const int64_t m = ctx.attrs().getInt("num_scan_inputs");
    ctx.require(m >= 1 && static_cast<size_t>(m) <= formal, "num_scan_inputs is out of range");
    const size_t states = formal - static_cast<size_t>(m);
    ctx.require(body->inputs.size() == formal, "the body's input count differs from the node's");
    ctx.require(body->outputs.size() >= states && ctx.numOutputs() == body->outputs.size(), "the body's output count differs from the node's");
    const size_t scans_out = body->outputs.size() - states;
    auto axes_in = ctx.attrs().getInts("scan_input_axes", std::vector<int64_t>(static_cast<size_t>(m), 0));
    auto dirs_in = ctx.attrs().getInts("scan_input_directions", std::vector<int64_t>(static_cast<size_t>(m), 0));
    auto axes_out = ctx.attrs().getInts("scan_output_axes", std::vector<int64_t>(scans_out, 0));
    auto dirs_out = ctx.attrs().getInts("scan_output_directions", std::vector<int64_t>(scans_out, 0));
    ctx.require(axes_in.size() == static_cast<size_t>(m) && dirs_in.size() == static_cast<size_t>(m) && axes_out.size() == scans_out &&
                    dirs_out.size() == scans_out,
                "scan axis or direction lists have the wrong length");
    int64_t length = -1;
    for (size_t k = 0; k < static_cast<size_t>(m); ++k) {
        const Tensor& x = ctx.input(states + k);
        axes_in[k] = normalizeAxis(axes_in[k], static_cast<int64_t>(x.rank()), ctx);
        const int64_t len = x.dims()[static_cast<size_t>(axes_in[k])];
        ctx.require(length < 0 || len == length, "scan inputs differ in sequence length");
        length = len;
    }
    std::vector<Tensor> state;
    for (size_t k = 0; k < states; ++k) state.push_back(ctx.input(k));
    std::vector<std::vector<Tensor>> scanned(scans_out);
    Scope scope = capturedScope(ctx);
    for (int64_t t = 0; t < length; ++t) {
        for (size_t k = 0; k < states; ++k) scope[body->inputs[k].name] = state[k];
        for (size_t k = 0; k < static_cast<size_t>(m); ++k)
            scope[body->inputs[states + k].name] = sliceAt(ctx.input(states + k), axes_in[k], dirs_in[k] ? length - 1 - t : t);
        std::vector<Tensor> outs = runBody(ctx, *body, scope);
        for (size_t k = 0; k < states; ++k) state[k] = std::move(outs[k]);
        for (size_t k = 0; k < scans_out; ++k) scanned[k].push_back(std::move(outs[states + k]));
    }
    std::vector<Tensor> result = std::move(state);
    for (size_t k = 0; k < scans_out; ++k) {
        const ValueInfo& declared = body->outputs[states + k];
        const int64_t rank = scanned[k].empty() ? (declared.shape.rank_known ? static_cast<int64_t>(declared.shape.dims.size()) : 0)
                                                : static_cast<int64_t>(scanned[k][0].rank());
        result.push_back(stack(ctx, scanned[k], normalizeAxis(axes_out[k], rank + 1, ctx), dirs_out[k] != 0, declared));
    }
    return result;
}

}  // namespace

void registerControlFlowKernels(KernelRegistry& r) {
    r.add("If", ifKernel);
    r.add("Loop", loopKernel);
    r.add("Scan", scanKernel);
}

}  // namespace kiln
