// The interface between the CUDA executor and the GPU implementations of IR ops. An op
// reads device inputs, asks the context for outputs (planned device memory) and enqueues
// kernels on the context's stream. An op that cannot handle a node (types, attributes,
// rank) throws Unsupported before it enqueues anything, and the node runs on the CPU.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/device_tensor.h"
#include "backends/cuda/kernels/kernels.h"
#include "ir/graph.h"
#include "ir/parameter.h"

namespace kiln::cuda {

struct Unsupported {
    std::string why;
};

// Library handles, the stream and grow-only scratch buffers of one executor.
class Resources {
public:
    Resources();
    ~Resources();
    Resources(const Resources&) = delete;
    Resources& operator=(const Resources&) = delete;
    cudaStream_t stream() const { return stream_; }
    // Library handles are made on first use: a graph without convolutions never pays
    // for cuDNN's start-up.
    cublasLtHandle_t lt();
    cublasHandle_t blas();
    cudnnHandle_t dnn();
    // Scratch memory, slot 0 for libraries' workspaces, slot 1 for a node's temporaries.
    // Growing synchronizes the stream; it must not happen during graph capture.
    void* scratch(int slot, size_t bytes);
    size_t scratchBytes() const { return scratch_bytes_[0] + scratch_bytes_[1]; }
    // Counts the times scratch memory moved: CUDA graphs captured before hold the old addresses.
    uint64_t scratchGeneration() const { return scratch_generation_; }
    int multiprocessors() const { return sms_; }

private:
    cudaStream_t stream_ = nullptr;
    cublasLtHandle_t lt_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    cudnnHandle_t dnn_ = nullptr;
    void* scratch_[2] = {nullptr, nullptr};
    size_t scratch_bytes_[2] = {0, 0};
    uint64_t scratch_generation_ = 0;
    int sms_ = 0;
};

// What an op keeps between runs of one input-shape signature (descriptors, algorithms).
struct NodeState {
    virtual ~NodeState() = default;
};

struct OpContext {
    const Node& node;
    int64_t opset = 0;
    std::vector<const DeviceTensor*> inputs;  // nullptr where an optional input is omitted
    Resources& res;
    const RouteValues& route;
    DType storage = DType::F32;  // device type of the graph's F32 values
    bool tf32 = false;
    std::string tactic;          // the engine's recorded tactic for this node ("" = none)
    bool calibrate = false;      // time the alternatives and record the winner
    std::string chosen_tactic;   // set by ops that choose one
    std::unique_ptr<NodeState>* state = nullptr;
    std::function<DeviceTensor(size_t, DType, const Dims&)> allocate;  // physical dtype
    std::vector<int> aliases;    // per output: index of the input it views, or -1
    // Copies a host-only input (shape data the CPU computed) to the device on first access.
    std::function<void(size_t)> materialize;
    // Cleared by ops whose output shapes depend on the data (readBack): the signature then
    // never becomes a CUDA graph.
    bool* capturable = nullptr;
    // Enqueues subgraph `attribute` of the node (If branches) on the device, `scope` holding
    // the outer values it reads under their names inside; returns its outputs.
    std::function<std::vector<DeviceTensor>(const std::string& attribute, std::unordered_map<std::string, DeviceTensor> scope)> run_subgraph;

    cudaStream_t stream() const { return res.stream(); }
    size_t numInputs() const { return inputs.size(); }
    bool has(size_t i) const { return i < inputs.size() && inputs[i]; }
    const DeviceTensor& input(size_t i) const;
    const Attributes& attrs() const { return node.attrs; }
    // A planned output buffer; logical F32 becomes the storage type.
    DeviceTensor output(size_t i, DType logical, const Dims& dims);
    // Output i views input `in` with new dims (Reshape and friends): no copy.
    DeviceTensor view(size_t i, size_t in, const Dims& dims);
    [[noreturn]] void unsupported(const std::string& why) const { throw Unsupported{why}; }
    void require(bool ok, const std::string& message) const;
    // Integer values of input i from its host copy; Unsupported when there is none.
    std::vector<int64_t> hostInts(size_t i) const;
    // The input's storage type must be a float type the kernels take.
    DType floatType(size_t i) const;
    // Copies device memory the stream has written to the host, waiting for it: for output
    // shapes that depend on the data (NonZero's count). Not allowed in a CUDA graph.
    void readBack(void* host, const void* device, size_t bytes);
};

using OpFn = std::vector<DeviceTensor> (*)(OpContext&);

// The GPU implementations, by op type.
const std::map<std::string, OpFn>& cudaOps();

// Registration, one per file.
void addElementwiseOps(std::map<std::string, OpFn>& ops);
void addShapeOps(std::map<std::string, OpFn>& ops);
void addNnOps(std::map<std::string, OpFn>& ops);
void addGemmOps(std::map<std::string, OpFn>& ops);
void addConvOps(std::map<std::string, OpFn>& ops);
void addReduceResizeOps(std::map<std::string, OpFn>& ops);
void addIndexOps(std::map<std::string, OpFn>& ops);
void addSelectionOps(std::map<std::string, OpFn>& ops);
void addRecurrentOps(std::map<std::string, OpFn>& ops);
void addControlFlowOps(std::map<std::string, OpFn>& ops);

// Helpers shared by the op files.
Shape6 toShape6(const Dims& dims, const OpContext& ctx);
View6 denseView(const Dims& dims);
// Reads `in` over `out` with numpy broadcasting (stride 0 on broadcast dims).
View6 broadcastView(const Dims& in, const Dims& out, const OpContext& ctx);
UnaryFn unaryFromName(const std::string& name, float a, float b, const OpContext& ctx);
// Activation of a fused node (attributes activation, activation_params).
UnaryFn fusedActivation(const OpContext& ctx);
// cuBLAS data type of a device float type.
inline cudaDataType_t cudaTypeOf(DType t) { return t == DType::F16 ? CUDA_R_16F : (t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F); }
// Milliseconds one call of f takes on the stream (median of a few runs after a warm-up).
float timeOnStream(cudaStream_t stream, const std::function<void()>& f);

}  // namespace kiln::cuda
