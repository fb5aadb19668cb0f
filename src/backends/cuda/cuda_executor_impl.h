// The CUDA executor's state and steps, shared by its files: cuda_executor.cc (construction,
// weights, runs and CUDA graph capture) and cuda_enqueue.cc (the node loop, host fallback,
// If branches and the memory plan). Private to the CUDA backend.
#pragma once
#include <cuda_runtime_api.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_executor.h"
#include "backends/cuda/cuda_op.h"
#include "backends/cuda/device_buffer.h"
#include "backends/memory_plan.h"

namespace kiln::cuda {

constexpr size_t kAlign = 256;  // of every arena slot and device buffer
inline size_t roundUp(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Host-side conversion between a logical f32 tensor and its f16/bf16 storage.
Tensor toPhysical(const Tensor& t, DType physical);
Tensor toLogical(const Tensor& t, DType logical);

struct CudaExecutor::Impl {
    const Graph& graph;
    CudaOptions options;
    Resources res;
    DType storage = DType::F16;
    // The storage of the graph being enqueued: `storage` for the main graph, F32 inside If
    // branches (runSubgraph says why).
    DType frame_storage = DType::F16;
    bool tf32 = false, use_graphs = true;
    std::unordered_map<std::string, DeviceTensor> weights;
    std::deque<DeviceBuffer> weight_buffers;  // deque: growing never moves a buffer
    std::unordered_map<std::string, size_t> last_use;  // graph outputs: nodes.size()
    std::map<std::string, std::string> chosen;
    CudaStats stats;
    cudaEvent_t events[4] = {};
    // KILN_PROFILE=1 (per op type) or =nodes: device time per node in runs that do not
    // replay a graph (use runtime.cuda_graph=off), printed when the executor ends.
    bool profile = false, profile_nodes = false;
    std::vector<cudaEvent_t> node_events;
    std::map<std::string, double> profile_ms;

    // Per node of one graph (the main graph, or a subgraph by its prefix).
    struct Frame {
        const Graph* graph = nullptr;
        std::vector<std::unique_ptr<NodeState>> states;
        std::vector<std::string> cpu_reason;  // per node: why it runs on the CPU ("" = GPU)
    };
    // Subgraph initializers on the device, by the subgraph's prefix (subgraphPrefix).
    std::map<std::string, std::unordered_map<std::string, DeviceTensor>> subgraph_weights;

    // Everything that depends on the input shapes.
    struct Signature {
        bool recorded = false, capturable = true;
        Frame main;
        std::map<std::string, Frame> subgraphs;  // by prefix, made when a branch first runs
        std::unordered_map<std::string, std::pair<size_t, size_t>> slots;  // value -> offset, bytes
        DeviceBuffer arena;
        MemoryPlan plan;
        std::map<std::string, DeviceBuffer> input_raw, output_raw;  // logical-type staging on the device
        std::map<std::string, PinnedBuffer> input_pinned, output_pinned;
        std::vector<DeviceTensor> outputs;  // where the last run left the graph outputs
        // Host-computed values a GPU op reads: copied from pinned memory, so the copy can
        // be part of a captured graph (their values depend only on the input shapes).
        struct HostUpload {
            PinnedBuffer pinned;
            DeviceBuffer device;
        };
        std::map<std::string, HostUpload> host_uploads;
        cudaGraphExec_t exec = nullptr;
        uint64_t scratch_generation = 0;  // of the scratch memory exec was captured with
        ~Signature() {
            if (exec) cudaGraphExecDestroy(exec);
        }
    };
    std::map<std::string, std::unique_ptr<Signature>> signatures;

    // Per run.
    enum class Mode { Record, Planned };
    struct RunState {
        Mode mode;
        Signature* sig;
        std::vector<void*> temporary;  // cudaMalloc'd this run, freed after it
        struct Recorded {
            std::string value;
            size_t node, bytes;
        };
        std::vector<Recorded> recorded;
        std::unordered_map<std::string, std::string> root;  // view -> value owning the memory
    };

    // Uploads the weights, subgraphs' too.
    Impl(const Graph& g, CudaOptions o);
    ~Impl();  // prints the KILN_PROFILE table

    DType physicalOf(DType logical) const { return logical == DType::F32 ? frame_storage : logical; }

    // Sets frame_storage for a scope, restoring it on the way out (exceptions included).
    struct ScopedStorage {
        DType& slot;
        DType before;
        ScopedStorage(DType& s, DType now) : slot(s), before(s) { s = now; }
        ~ScopedStorage() { slot = before; }
    };

    bool capturing() const {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        KILN_CUDA_CHECK(cudaStreamIsCapturing(res.stream(), &status));
        return status != cudaStreamCaptureStatusNone;
    }

    DeviceTensor upload(const Tensor& t, const std::string& name);

    // Initializers of If/Loop/Scan subgraphs, nested ones too, uploaded with the weights (not
    // when a branch first runs: that may be inside a graph capture).
    void uploadSubgraphWeights(const Graph& g, const std::string& prefix);

    // A node's output: its planned arena slot, or (recording, or sizes that changed since) a
    // temporary cudaMalloc freed after the run.
    DeviceTensor allocate(RunState& rs, size_t node, const std::string& value, DType dtype, const Dims& dims);

    Tensor download(const DeviceTensor& d);

    // Node i's outputs from its reference kernel, inputs taken from their host copies
    // (Shape/Size: the dims alone) or copied from the device.
    std::vector<Tensor> computeOnHost(const Node& node, int64_t opset, const std::vector<const DeviceTensor*>& in);

    // A node no GPU kernel handles: computed on the host, outputs copied to the device.
    // `at`: the main graph's node the memory is planned for; `prefix` names a subgraph's values.
    std::vector<DeviceTensor> runOnCpu(RunState& rs, size_t at, const std::string& prefix, const Node& node, int64_t opset,
                                       const std::vector<const DeviceTensor*>& in);

    // Shape arithmetic stays on the host: Shape/Size, and small ops whose inputs are all
    // known on the host. Their results feed Reshape/Expand/Slice without a device round trip.
    static bool isHostNode(const Node& node, const std::vector<const DeviceTensor*>& in);

    // A host node: its outputs stay on the host until a GPU op reads them (materialize).
    std::vector<DeviceTensor> runOnHost(const Node& node, int64_t opset, const std::vector<const DeviceTensor*>& in);

    // Uploads a host-known value (through pinned memory) the first time a GPU op reads it.
    void materialize(Signature& sig, const std::string& name, DeviceTensor& t);

    // Enqueues the nodes of `g`, reading and writing `values`. The main graph's nodes plan
    // memory as themselves; a subgraph's (at: the main graph's node that runs it) plan theirs
    // as that node, under names `prefix` makes unique, so they live while it runs.
    void enqueueNodes(RunState& rs, const Graph& g, Frame& frame, const std::string& prefix, std::optional<size_t> at,
                      std::unordered_map<std::string, DeviceTensor>& values, bool timing);

    // Runs subgraph `attribute` of `node` on the device: `scope` holds the values it reads
    // from outside (by their names inside), its initializers are uploaded already. Returns
    // its outputs, which may view memory that is only planned while the node runs.
    // Branches compute in f32 whatever the engine's storage: in exported detectors they are
    // the post-processing, where f16 loses what the model needs (torchvision's batched NMS
    // offsets boxes by class times the largest coordinate: 29000 and more, where f16 steps by
    // 16). Captured f16 values are widened on the way in; the If widens or narrows its outputs.
    std::vector<DeviceTensor> runSubgraph(RunState& rs, const Node& node, const std::string& prefix, const std::string& attribute, size_t at,
                                          std::unordered_map<std::string, DeviceTensor> scope);

    // Enqueues the whole graph: input casts, every node, output casts.
    void enqueue(RunState& rs, std::unordered_map<std::string, DeviceTensor>& values);

    // After the recording run: every value's lifetime (views extend their owner's) and one
    // arena planned by the route's memory.planner.
    void plan(RunState& rs);

    std::vector<Tensor> run(const std::map<std::string, Tensor>& inputs);

    // Captures the graph's work into a CUDA graph and launches it; false when some node
    // cannot be captured (host round trips), leaving nothing enqueued.
    bool capture(RunState& rs, std::unordered_map<std::string, DeviceTensor>& values);
};

}  // namespace kiln::cuda
