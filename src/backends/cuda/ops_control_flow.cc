// If on the GPU. The condition is read on the host (a copy back when the device computed
// it, which keeps the signature out of CUDA graphs, as ONNX Runtime's and TensorRT's
// data-dependent branches do); the branch taken runs on the device like the graph around
// it, in f32 (CudaExecutor's runSubgraph says why). Its outer values arrive as the node's
// inputs after the condition, named inside by attribute "captures" (liftCaptures in ir/graph.h).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

bool condition(OpContext& ctx) {
    const DeviceTensor& c = *ctx.inputs.at(0);
    if (c.numel() != 1) ctx.require(false, "the condition must hold one element, it has shape " + dimsToString(c.dims));
    if (c.host) return c.host->scalarAt(0) != 0;
    if (c.dtype != DType::Bool) ctx.unsupported("condition of type " + std::string(dtypeName(c.dtype)));
    bool value = false;
    ctx.readBack(&value, c.data, sizeof value);
    return value;
}

std::vector<DeviceTensor> ifOp(OpContext& ctx) {
    ctx.require(ctx.has(0), "the condition is missing");
    const bool cond = condition(ctx);
    const std::vector<std::string> names = ctx.attrs().getStrings("captures");
    const size_t formal = formalInputCount(ctx.node);
    ctx.require(formal + names.size() == ctx.numInputs(), "captures do not match the inputs");
    std::unordered_map<std::string, DeviceTensor> scope;
    for (size_t k = 0; k < names.size(); ++k)
        if (ctx.has(formal + k)) scope[names[k]] = *ctx.inputs[formal + k];
    const char* branch = cond ? "then_branch" : "else_branch";
    std::vector<DeviceTensor> outs = ctx.run_subgraph(branch, std::move(scope));
    if (outs.size() != ctx.node.outputs.size())
        ctx.require(false, std::string(branch) + " has " + std::to_string(outs.size()) + " outputs, the node " + std::to_string(ctx.node.outputs.size()));
    // The branch's memory is planned only while the node runs: outputs move to the node's own,
    // in the graph's storage type (the branch computed in f32).
    std::vector<DeviceTensor> result;
    for (size_t k = 0; k < outs.size(); ++k) {
        DeviceTensor b = outs[k];
        const DType physical = b.logical == DType::F32 ? ctx.storage : b.dtype;
        if (!b.data && b.host) {  // known on the host (a constant branch): stays there
            b.dtype = physical;
            result.push_back(b);
            continue;
        }
        DeviceTensor y = ctx.allocate(k, physical, b.dims);
        y.logical = b.logical;
        if (physical != b.dtype) launchCast(b.dtype, physical, b.data, y.data, b.numel(), ctx.stream());
        else if (b.bytes()) KILN_CUDA_CHECK(cudaMemcpyAsync(y.data, b.data, b.bytes(), cudaMemcpyDeviceToDevice, ctx.stream()));
        y.host = b.host;
        result.push_back(y);
    }
    return result;
}

}  // namespace

void addControlFlowOps(std::map<std::string, OpFn>& ops) { ops["If"] = ifOp; }

}  // namespace kiln::cuda
