// Reference kernels: simple, correct implementations of every IR op on the CPU. They are
// the accuracy baseline that optimized backends and passes are tested against.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/graph.h"

namespace kiln {

// Runs a subgraph (If/Loop bodies) with extra named values in scope.
using SubgraphRunner = std::function<std::vector<Tensor>(const Graph&, const std::map<std::string, Tensor>&)>;

// Provides output buffers (e.g. planned arena slots) to kernels that ask for them.
class OutputAllocator {
public:
    virtual ~OutputAllocator() = default;
    virtual Tensor allocate(const std::string& value, DType dtype, const Dims& dims) = 0;
};

// What a kernel derived from its node and input shapes (attributes read, a oneDNN primitive
// built), kept between runs of one executor so that repeated runs skip the work; any
// thread may replace it while others read the one they loaded.
class KernelMemo {
public:
    template <typename T>
    std::shared_ptr<const T> get() const {
        return std::static_pointer_cast<const T>(slot_.load(std::memory_order_acquire));
    }
    void set(std::shared_ptr<const void> value) { slot_.store(std::move(value), std::memory_order_release); }

private:
    std::atomic<std::shared_ptr<const void>> slot_;
};

struct KernelContext {
    const Node& node;
    std::vector<const Tensor*> inputs;  // nullptr where an optional input is omitted
    int64_t opset = 0;
    SubgraphRunner run_subgraph;
    OutputAllocator* allocator = nullptr;
    KernelMemo* memo = nullptr;  // null where the caller keeps none (one-off runs, timing)

    // An uninitialized buffer for output `i`: the planned slot when there is one.
    Tensor output(size_t i, DType dtype, const Dims& dims) const {
        if (allocator && i < node.outputs.size()) return allocator->allocate(node.outputs[i], dtype, dims);
        return Tensor::uninitialized(dtype, dims);
    }

    size_t numInputs() const { return inputs.size(); }
    bool hasInput(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
    const Tensor& input(size_t i) const;
    const Tensor* optionalInput(size_t i) const { return hasInput(i) ? inputs[i] : nullptr; }
    const Attributes& attrs() const { return node.attrs; }
    size_t numOutputs() const { return node.outputs.size(); }
    // Throws Error prefixed with the node's description.
    [[noreturn]] void fail(const std::string& message) const;
    void require(bool condition, const std::string& message) const {
        if (!condition) fail(message);
    }
    // The message made only on failure (for checks on every run).
    template <typename MakeMessage, std::enable_if_t<std::is_invocable_r_v<std::string, MakeMessage>, int> = 0>
    void require(bool condition, MakeMessage&& message) const {
        if (!condition) fail(message());
    }
};

using KernelFn = std::vector<Tensor> (*)(const KernelContext&);

class KernelRegistry {
public:
    void add(const std::string& op_type, KernelFn fn) { kernels_[op_type] = fn; }
    KernelFn find(const std::string& op_type) const;
    std::vector<std::string> opTypes() const;

private:
    std::map<std::string, KernelFn> kernels_;
};

// The reference kernel table, built once from the explicit registration list.
const KernelRegistry& referenceKernels();

// Building blocks the fused kernels reuse (defined in the op family's file).
std::vector<Tensor> convKernel(const KernelContext& ctx);
std::vector<Tensor> matmulKernel(const KernelContext& ctx);
Tensor transposeTensor(const Tensor& x, const std::vector<int64_t>& perm);

// Registration functions, one per kernel file (listed in reference_kernels.cc).
void registerElementwiseKernels(KernelRegistry& r);
void registerActivationKernels(KernelRegistry& r);
void registerConvKernels(KernelRegistry& r);
void registerGemmKernels(KernelRegistry& r);
void registerNormKernels(KernelRegistry& r);
void registerPoolKernels(KernelRegistry& r);
void registerSoftmaxKernels(KernelRegistry& r);
void registerReduceKernels(KernelRegistry& r);
void registerShapeKernels(KernelRegistry& r);
void registerGatherKernels(KernelRegistry& r);
void registerPadResizeKernels(KernelRegistry& r);
void registerEinsumKernels(KernelRegistry& r);
void registerGeneratorKernels(KernelRegistry& r);
void registerLossKernels(KernelRegistry& r);
void registerFusedKernels(KernelRegistry& r);
void registerDetectionKernels(KernelRegistry& r);
void registerControlFlowKernels(KernelRegistry& r);
void registerRecurrentKernels(KernelRegistry& r);
void registerQuantizeKernels(KernelRegistry& r);
void registerSamplingKernels(KernelRegistry& r);
void registerSignalKernels(KernelRegistry& r);
void registerMiscKernels(KernelRegistry& r);

}  // namespace kiln
