#include "backends/cpu/reference/kernel.h"

namespace kiln {

const Tensor& KernelContext::input(size_t i) const {
    if (!hasInput(i)) fail("required input " + std::to_string(i) + " is missing");
    return *inputs[i];
}

void KernelContext::fail(const std::string& message) const { throw Error(node.describe() + ": " + message); }

KernelFn KernelRegistry::find(const std::string& op_type) const {
    auto it = kernels_.find(op_type);
    return it == kernels_.end() ? nullptr : it->second;
}

std::vector<std::string> KernelRegistry::opTypes() const {
    std::vector<std::string> out;
    for (const auto& [name, fn] : kernels_) out.push_back(name);
    return out;
}

const KernelRegistry& referenceKernels() {
    static const KernelRegistry registry = [] {
        KernelRegistry r;
        registerElementwiseKernels(r);
        registerActivationKernels(r);
        registerConvKernels(r);
        registerGemmKernels(r);
        registerNormKernels(r);
        registerPoolKernels(r);
        registerSoftmaxKernels(r);
        registerReduceKernels(r);
        registerShapeKernels(r);
        registerGatherKernels(r);
        registerPadResizeKernels(r);
        registerEinsumKernels(r);
        registerGeneratorKernels(r);
        registerLossKernels(r);
        registerFusedKernels(r);
        registerDetectionKernels(r);
        registerControlFlowKernels(r);
        registerRecurrentKernels(r);
        registerQuantizeKernels(r);
        registerSamplingKernels(r);
        registerSignalKernels(r);
        registerMiscKernels(r);
        return r;
    }();
    return registry;
}

}  // namespace kiln
