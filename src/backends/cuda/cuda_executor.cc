#include "backends/cuda/cuda_executor.h"
#include "backends/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>

#include "backends/cpu/reference/kernel.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_op.h"
#include "runtime/memory_plan.h"

namespace kiln::cuda {

bool deviceAvailable(std::string* why) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        if (why) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
        cudaGetLastError();
        return false;
    }
    return true;
}

std::string deviceSignature() {
    std::string why;
    const bool available = deviceAvailable(&why);
    check(available, "target cuda: no usable GPU on this machine (" + why + ")");
    int device = 0;
    cudaDeviceProp p{};
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    return "cuda/sm_" + std::to_string(p.major) + std::to_string(p.minor) + "/" + p.name;
}

namespace {

constexpr size_t kAlign = 256;
size_t roundUp(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Host-side f32 <-> f16/bf16 conversion for uploads and downloads. Finite values beyond
// f16's range saturate to +-65504, as TensorRT clamps weights: a mask constant of
// -3.4e38 (torch.finfo(float32).min, DeBERTa's) stays a large finite number, so that
// 0 * mask is 0, not NaN. Infinities and NaNs stay what they are.
Tensor toPhysical(const Tensor& t, DType physical) {
    if (t.dtype() == physical) return t;
    Tensor out = Tensor::uninitialized(physical, t.dims());
    const float* src = t.data<float>();
    constexpr float kHalfMax = 65504.f;
    for (int64_t i = 0; i < t.numel(); ++i) {
        if (physical == DType::F16) out.data<Half>()[i] = Half(std::isfinite(src[i]) ? std::clamp(src[i], -kHalfMax, kHalfMax) : src[i]);
        else out.data<BFloat16>()[i] = BFloat16(src[i]);
    }
    return out;
}

Tensor toLogical(const Tensor& t, DType logical) {
    if (t.dtype() == logical) return t;
    Tensor out = Tensor::uninitialized(logical, t.dims());
    float* dst = out.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = t.dtype() == DType::F16 ? float(t.data<Half>()[i]) : float(t.data<BFloat16>()[i]);
    return out;
}

}  // namespace

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

    Impl(const Graph& g, CudaOptions o) : graph(g), options(std::move(o)) {
        const std::string precision = routeValue(options.route, "precision.activations");
        storage = precision == "f32" ? DType::F32 : (precision == "bf16" ? DType::BF16 : DType::F16);
        frame_storage = storage;
        tf32 = routeOn(options.route, "precision.tf32");
        use_graphs = routeOn(options.route, "runtime.cuda_graph");
        if (const char* p = std::getenv("KILN_PROFILE")) {
            profile = true;
            profile_nodes = std::string(p) == "nodes";
            node_events.resize(graph.nodes.size() + 1);
            for (auto& e : node_events) KILN_CUDA_CHECK(cudaEventCreate(&e));
        }
        stats.device = deviceSignature();
        for (auto& e : events) KILN_CUDA_CHECK(cudaEventCreate(&e));
        for (size_t i = 0; i < graph.nodes.size(); ++i)
            for (const auto& in : graph.nodes[i].inputs) last_use[in] = i;
        for (const auto& o : graph.outputs) last_use[o.name] = graph.nodes.size();
        for (const auto& [name, t] : graph.initializers) weights[name] = upload(t, name);
        uploadSubgraphWeights(graph, "");
        KILN_CUDA_CHECK(cudaStreamSynchronize(res.stream()));
    }

    ~Impl() {
        cudaStreamSynchronize(res.stream());
        for (auto& e : events) cudaEventDestroy(e);
        for (auto& e : node_events) cudaEventDestroy(e);
        if (profile && !profile_ms.empty()) {
            std::vector<std::pair<double, std::string>> rows;
            double total = 0;
            for (const auto& [k, v] : profile_ms) rows.emplace_back(v, k), total += v;
            std::sort(rows.rbegin(), rows.rend());
            std::fprintf(stderr, "kiln profile (KILN_PROFILE, CUDA device time over all profiled runs)\n");
            for (size_t i = 0; i < rows.size() && i < 40; ++i)
                std::fprintf(stderr, "  %-40s %10.3f ms  %5.1f%%\n", rows[i].second.c_str(), rows[i].first, 100 * rows[i].first / std::max(total, 1e-9));
        }
    }

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

    DeviceTensor upload(const Tensor& t, const std::string& name) {
        DeviceTensor d{physicalOf(t.dtype()), t.dtype(), t.dims(), nullptr, std::make_shared<const Tensor>(t)};
        const Tensor physical = toPhysical(t, d.dtype);
        weight_buffers.emplace_back();
        weight_buffers.back().ensure(roundUp(physical.byteSize()));
        d.data = weight_buffers.back().ptr;
        if (physical.byteSize()) KILN_CUDA_CHECK(cudaMemcpy(d.data, physical.raw(), physical.byteSize(), cudaMemcpyHostToDevice));
        stats.weight_bytes += physical.byteSize();
        return d;
    }

    // Initializers of If/Loop/Scan subgraphs, nested ones too, uploaded with the weights (not
    // when a branch first runs: that may be inside a graph capture).
    void uploadSubgraphWeights(const Graph& g, const std::string& prefix) {
        ScopedStorage f32(frame_storage, DType::F32);
        for (const Node& n : g.nodes)
            for (const auto& attr : subgraphAttributes(n)) {
                const std::string inner = prefix + subgraphPrefix(n, attr);
                const auto sub = n.attrs.getGraph(attr);
                auto& table = subgraph_weights[inner];
                for (const auto& [name, t] : sub->initializers) table[name] = upload(t, inner + name);
                uploadSubgraphWeights(*sub, inner);
            }
    }

    DeviceTensor allocate(RunState& rs, size_t node, const std::string& value, DType dtype, const Dims& dims) {
        DeviceTensor t{dtype, dtype, dims, nullptr, nullptr};
        const size_t bytes = roundUp(t.bytes());
        if (rs.mode == Mode::Planned) {
            auto it = rs.sig->slots.find(value);
            if (it != rs.sig->slots.end() && it->second.second == bytes) {
                t.data = static_cast<char*>(rs.sig->arena.ptr) + it->second.first;
                return t;
            }
            rs.sig->capturable = false;  // sizes changed from the recorded run: data-dependent shapes
        } else {
            rs.recorded.push_back({value, node, bytes});
        }
        void* p = nullptr;
        KILN_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, kAlign)));
        rs.temporary.push_back(p);
        t.data = p;
        return t;
    }

    Tensor download(const DeviceTensor& d) {
        if (d.host) return *d.host;
        Tensor physical = Tensor::uninitialized(d.dtype, d.dims);
        if (physical.byteSize()) {
            KILN_CUDA_CHECK(cudaMemcpyAsync(physical.raw(), d.data, physical.byteSize(), cudaMemcpyDeviceToHost, res.stream()));
            KILN_CUDA_CHECK(cudaStreamSynchronize(res.stream()));
        }
        return toLogical(physical, d.logical);
    }

    // Node i's outputs from its reference kernel, inputs taken from their host copies
    // (Shape/Size: the dims alone) or copied from the device.
    std::vector<Tensor> computeOnHost(const Node& node, int64_t opset, const std::vector<const DeviceTensor*>& in) {
        const bool dims_only = node.op_type == "Shape" || node.op_type == "Size";
        std::vector<Tensor> host(in.size());
        std::vector<const Tensor*> ptrs;
        for (size_t k = 0; k < in.size(); ++k) {
            if (in[k]) host[k] = in[k]->host || !dims_only ? download(*in[k]) : Tensor::uninitialized(in[k]->logical, in[k]->dims);
            ptrs.push_back(in[k] ? &host[k] : nullptr);
        }
        KernelFn fn = referenceKernels().find(node.op_type);
        check(fn != nullptr, node.describe() + ": no CUDA or CPU kernel");
        KernelContext kctx{node, ptrs, opset, nullptr};
        return fn(kctx);
    }

    // A node no GPU kernel handles: computed on the host, outputs copied to the device.
    // `at`: the main graph's node the memory is planned for; `prefix` names a subgraph's values.
    std::vector<DeviceTensor> runOnCpu(RunState& rs, size_t at, const std::string& prefix, const Node& node, int64_t opset,
                                       const std::vector<const DeviceTensor*>& in) {
        rs.sig->capturable = false;
        std::vector<Tensor> outs = computeOnHost(node, opset, in);
        std::vector<DeviceTensor> result;
        for (size_t k = 0; k < outs.size() && k < node.outputs.size(); ++k) {
            DeviceTensor d = allocate(rs, at, prefix + node.outputs[k], physicalOf(outs[k].dtype()), outs[k].dims());
            d.logical = outs[k].dtype();
            const Tensor physical = toPhysical(outs[k], d.dtype);
            if (physical.byteSize())
                KILN_CUDA_CHECK(cudaMemcpyAsync(d.data, physical.raw(), physical.byteSize(), cudaMemcpyHostToDevice, res.stream()));
            KILN_CUDA_CHECK(cudaStreamSynchronize(res.stream()));  // `physical` is freed on return
            d.host = std::make_shared<const Tensor>(outs[k]);
            result.push_back(d);
        }
        return result;
    }

    // Shape arithmetic stays on the host: Shape/Size, and small ops whose inputs are all
    // known on the host. Their results feed Reshape/Expand/Slice without a device round trip.
    static bool isHostNode(const Node& node, const std::vector<const DeviceTensor*>& in) {
        if (node.op_type == "Shape" || node.op_type == "Size") return true;
        int64_t elements = 0;
        for (const DeviceTensor* t : in) {
            if (!t) continue;
            if (!t->host) return false;
            elements += t->numel();
        }
        return elements <= 4096 && referenceKernels().find(node.op_type) != nullptr;
    }

    // A host node: its outputs stay on the host until a GPU op reads them (materialize).
    std::vector<DeviceTensor> runOnHost(const Node& node, int64_t opset, const std::vector<const DeviceTensor*>& in) {
        std::vector<DeviceTensor> result;
        for (Tensor& t : computeOnHost(node, opset, in))
            result.push_back(DeviceTensor{physicalOf(t.dtype()), t.dtype(), t.dims(), nullptr, std::make_shared<const Tensor>(t)});
        return result;
    }

    void materialize(Signature& sig, const std::string& name, DeviceTensor& t) {
        if (t.data || !t.host) return;
        const Tensor physical = toPhysical(*t.host, t.dtype);
        auto& u = sig.host_uploads[name];
        const size_t bytes = physical.byteSize();
        if (u.pinned.bytes < std::max<size_t>(bytes, 1) || u.device.bytes < roundUp(std::max<size_t>(bytes, 1))) {
            if (capturing()) throw Unsupported{"host value first needed during capture"};
            u.pinned.ensure(std::max<size_t>(bytes, 1));
            u.device.ensure(roundUp(std::max<size_t>(bytes, 1)));
        }
        std::memcpy(u.pinned.ptr, physical.raw(), bytes);
        if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(u.device.ptr, u.pinned.ptr, bytes, cudaMemcpyHostToDevice, res.stream()));
        t.data = u.device.ptr;
    }

    // Enqueues the nodes of `g`, reading and writing `values`. The main graph's nodes plan
    // memory as themselves; a subgraph's (at: the main graph's node that runs it) plan theirs
    // as that node, under names `prefix` makes unique, so they live while it runs.
    void enqueueNodes(RunState& rs, const Graph& g, Frame& frame, const std::string& prefix, std::optional<size_t> at,
                      std::unordered_map<std::string, DeviceTensor>& values, bool timing) {
        Signature& sig = *rs.sig;
        frame.graph = &g;
        frame.states.resize(g.nodes.size());
        frame.cpu_reason.resize(g.nodes.size());
        for (size_t i = 0; i < g.nodes.size(); ++i) {
            const Node& node = g.nodes[i];
            const size_t plan_at = at.value_or(i);
            const std::string name = prefix + node.name;
            if (timing) KILN_CUDA_CHECK(cudaEventRecord(node_events[i], res.stream()));
            std::vector<const DeviceTensor*> in;
            for (const auto& input : node.inputs) {
                if (input.empty()) {
                    in.push_back(nullptr);
                    continue;
                }
                auto it = values.find(input);
                check(it != values.end(), node.describe() + ": input '" + input + "' has no value");
                in.push_back(&it->second);
            }
            std::vector<DeviceTensor> outs;
            std::vector<int> aliases;
            bool on_cpu = !frame.cpu_reason[i].empty();
            if (!on_cpu && isHostNode(node, in)) {
                outs = runOnHost(node, g.opset, in);
                if (rs.mode == Mode::Record) chosen[name] = "host";
            } else if (!on_cpu) {
                auto op = cudaOps().find(node.op_type);
                if (op == cudaOps().end()) {
                    frame.cpu_reason[i] = "no CUDA kernel for " + node.op_type;
                    on_cpu = true;
                } else {
                    auto t = options.tactics.find(name);
                    OpContext ctx{node, g.opset, in, res, options.route, frame_storage, tf32, t == options.tactics.end() ? "" : t->second,
                                  options.calibrate && rs.mode == Mode::Record, "", &frame.states[i],
                                  [&](size_t k, DType dt, const Dims& d) { return allocate(rs, plan_at, prefix + node.outputs.at(k), dt, d); }, {},
                                  [&](size_t k) { materialize(sig, prefix + node.inputs[k], values.at(node.inputs[k])); }, &sig.capturable,
                                  [&](const std::string& attribute, std::unordered_map<std::string, DeviceTensor> scope) {
                                      return runSubgraph(rs, node, prefix + subgraphPrefix(node, attribute), attribute, plan_at, std::move(scope));
                                  }};
                    const size_t recorded_before = rs.recorded.size();
                    try {
                        outs = op->second(ctx);
                        aliases = ctx.aliases;
                        if (!ctx.chosen_tactic.empty()) chosen[name] = ctx.chosen_tactic;
                    } catch (const Unsupported& u) {
                        frame.cpu_reason[i] = u.why;
                        on_cpu = true;
                        rs.recorded.resize(recorded_before);
                    }
                }
            }
            if (on_cpu) {
                if (rs.mode == Mode::Record) chosen[name] = "cpu";
                outs = runOnCpu(rs, plan_at, prefix, node, g.opset, in);
            }
            for (size_t k = 0; k < node.outputs.size() && k < outs.size(); ++k) {
                if (node.outputs[k].empty()) continue;
                if (k < aliases.size() && aliases[k] >= 0) {
                    const std::string src = prefix + node.inputs[aliases[k]];
                    auto r = rs.root.find(src);
                    rs.root[prefix + node.outputs[k]] = r == rs.root.end() ? src : r->second;
                }
                values[node.outputs[k]] = outs[k];
            }
        }
    }

    // Runs subgraph `attribute` of `node` on the device: `scope` holds the values it reads
    // from outside (by their names inside), its initializers are uploaded already. Returns
    // its outputs, which may view memory that is only planned while the node runs.
    // Branches compute in f32 whatever the engine's storage: in exported detectors they are
    // the post-processing, where f16 loses what the model needs (torchvision's batched NMS
    // offsets boxes by class times the largest coordinate: 29000 and more, where f16 steps by
    // 16). Captured f16 values are widened on the way in; the If widens or narrows its outputs.
    std::vector<DeviceTensor> runSubgraph(RunState& rs, const Node& node, const std::string& prefix, const std::string& attribute, size_t at,
                                          std::unordered_map<std::string, DeviceTensor> scope) {
        const auto g = node.attrs.getGraph(attribute);
        ScopedStorage f32(frame_storage, DType::F32);
        for (auto& [name, t] : scope) {
            if (t.logical != DType::F32 || t.dtype == DType::F32) continue;
            if (!t.data) {  // known on the host only: uploaded as f32 when a GPU op reads it
                t.dtype = DType::F32;
                continue;
            }
            DeviceTensor wide = allocate(rs, at, prefix + name + "#f32", DType::F32, t.dims);
            wide.logical = DType::F32;
            wide.host = t.host;
            launchCast(t.dtype, DType::F32, t.data, wide.data, t.numel(), res.stream());
            t = wide;
        }
        for (const auto& [name, w] : subgraph_weights.at(prefix)) scope.emplace(name, w);
        enqueueNodes(rs, *g, rs.sig->subgraphs[prefix], prefix, at, scope, false);
        std::vector<DeviceTensor> outs;
        for (const auto& o : g->outputs) {
            auto it = scope.find(o.name);
            check(it != scope.end(), node.describe() + " " + attribute + ": output '" + o.name + "' was not computed");
            outs.push_back(it->second);
        }
        return outs;
    }

    // Enqueues the whole graph: input casts, every node, output casts.
    void enqueue(RunState& rs, std::unordered_map<std::string, DeviceTensor>& values) {
        Signature& sig = *rs.sig;
        for (const auto& vi : graph.runtimeInputs()) {
            DeviceTensor& raw = values.at(vi.name);
            if (raw.dtype == DType::F32 && storage != DType::F32) {
                DeviceTensor converted = allocate(rs, 0, vi.name + "#storage", storage, raw.dims);
                converted.logical = DType::F32;
                launchCast(DType::F32, storage, raw.data, converted.data, raw.numel(), res.stream());
                raw = converted;
            }
        }
        const bool timing = profile && rs.mode == Mode::Planned && !capturing();
        enqueueNodes(rs, graph, sig.main, "", std::nullopt, values, timing);
        if (timing) {
            KILN_CUDA_CHECK(cudaEventRecord(node_events[graph.nodes.size()], res.stream()));
            KILN_CUDA_CHECK(cudaEventSynchronize(node_events[graph.nodes.size()]));
            for (size_t i = 0; i < graph.nodes.size(); ++i) {
                float ms = 0;
                cudaEventElapsedTime(&ms, node_events[i], node_events[i + 1]);
                profile_ms[profile_nodes ? graph.nodes[i].name : graph.nodes[i].op_type] += ms;
            }
        }
        // Graph outputs in their logical type, in device buffers the download reads.
        sig.outputs.clear();
        for (const auto& o : graph.outputs) {
            auto it = values.find(o.name);
            check(it != values.end(), "graph output '" + o.name + "' was not computed");
            DeviceTensor d = it->second;
            if (d.dtype != d.logical && !d.host) {
                DeviceBuffer& buf = sig.output_raw[o.name];
                DeviceTensor raw{d.logical, d.logical, d.dims, nullptr, nullptr};
                if (buf.bytes < raw.bytes()) {
                    if (rs.mode == Mode::Planned && sig.exec == nullptr) {
                        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
                        KILN_CUDA_CHECK(cudaStreamIsCapturing(res.stream(), &capturing));
                        if (capturing != cudaStreamCaptureStatusNone) throw Unsupported{"output buffer grows during capture"};
                    }
                    buf.ensure(raw.bytes());
                }
                raw.data = buf.ptr;
                launchCast(d.dtype, d.logical, d.data, raw.data, d.numel(), res.stream());
                d = raw;
            }
            sig.outputs.push_back(d);
        }
    }

    void plan(RunState& rs) {
        Signature& sig = *rs.sig;
        std::vector<BufferRequest> requests;
        std::unordered_map<std::string, size_t> end;  // value owning memory -> last use of it or any view of it
        for (const auto& r : rs.recorded) end[r.value] = r.node;
        auto lastUseOf = [&](const std::string& v) {
            auto it = last_use.find(v);
            return it == last_use.end() ? size_t(0) : it->second;
        };
        for (const auto& r : rs.recorded) end[r.value] = std::max(end[r.value], lastUseOf(r.value));
        for (const auto& vi : graph.runtimeInputs())  // converted inputs live until their last reader
            if (end.count(vi.name + "#storage")) end[vi.name + "#storage"] = std::max(end[vi.name + "#storage"], lastUseOf(vi.name));
        // Views live as long as their readers, views of converted inputs too (a conv reading an
        // Unsqueeze of an f16 input must not get the input's buffer as its output: cuDNN
        // refuses x == y, and the values would be overwritten as they are read).
        for (const auto& [view, owner] : rs.root)
            for (const std::string& o : {owner, owner + "#storage"})
                if (end.count(o)) end[o] = std::max(end[o], lastUseOf(view));
        for (const auto& r : rs.recorded) requests.push_back({r.node, std::max(end[r.value], r.node), r.bytes});
        sig.plan = planMemory(requests, routeValue(options.route, "memory.planner"));
        sig.arena.ensure(roundUp(sig.plan.arena_bytes));
        // Sizes are multiples of kAlign, so the packed offsets stay aligned.
        for (size_t k = 0; k < rs.recorded.size(); ++k) {
            check(sig.plan.offsets[k] % kAlign == 0, "internal: unaligned arena offset");
            sig.slots[rs.recorded[k].value] = {sig.plan.offsets[k], rs.recorded[k].bytes};
        }
    }

    std::vector<Tensor> run(const std::map<std::string, Tensor>& inputs) {
        std::string key;
        for (const auto& [name, t] : inputs) key += name + ":" + t.summary() + ";";
        auto& slot = signatures[key];
        if (!slot) {
            slot = std::make_unique<Signature>();
            slot->main.states.resize(graph.nodes.size());
            slot->main.cpu_reason.resize(graph.nodes.size());
        }
        Signature& sig = *slot;
        cudaStream_t s = res.stream();
        KILN_CUDA_CHECK(cudaEventRecord(events[0], s));
        // Inputs: host -> pinned -> device buffers that stay put (graph replays read them).
        for (const auto& [name, t] : inputs) {
            sig.input_pinned[name].ensure(std::max<size_t>(t.byteSize(), 1));
            sig.input_raw[name].ensure(roundUp(std::max<size_t>(t.byteSize(), 1)));
            std::memcpy(sig.input_pinned[name].ptr, t.raw(), t.byteSize());
            if (t.byteSize()) KILN_CUDA_CHECK(cudaMemcpyAsync(sig.input_raw[name].ptr, sig.input_pinned[name].ptr, t.byteSize(), cudaMemcpyHostToDevice, s));
        }
        // The values a run starts from: the uploaded inputs and the weights.
        auto initialValues = [&] {
            std::unordered_map<std::string, DeviceTensor> v;
            for (const auto& [name, t] : inputs) v[name] = DeviceTensor{t.dtype(), t.dtype(), t.dims(), sig.input_raw[name].ptr, nullptr};
            for (const auto& [name, w] : weights) v[name] = w;
            return v;
        };
        KILN_CUDA_CHECK(cudaEventRecord(events[1], s));
        stats.graph_replayed = false;
        RunState rs{sig.recorded ? Mode::Planned : Mode::Record, &sig, {}, {}, {}};
        if (sig.exec && sig.scratch_generation != res.scratchGeneration()) {  // another signature moved the scratch memory
            cudaGraphExecDestroy(sig.exec);
            sig.exec = nullptr;
        }
        try {
            if (sig.exec) {
                KILN_CUDA_CHECK(cudaGraphLaunch(sig.exec, s));
                stats.graph_replayed = true;
            } else if (rs.mode == Mode::Planned && use_graphs && sig.capturable) {
                auto values = initialValues();
                if (!capture(rs, values)) {  // not capturable: run it plainly
                    values = initialValues();
                    enqueue(rs, values);
                }
            } else {
                auto values = initialValues();
                enqueue(rs, values);
            }
        } catch (...) {
            cudaStreamSynchronize(s);
            for (void* p : rs.temporary) cudaFree(p);
            throw;
        }
        KILN_CUDA_CHECK(cudaEventRecord(events[2], s));
        for (size_t k = 0; k < sig.outputs.size(); ++k) {
            const DeviceTensor& d = sig.outputs[k];
            if (d.host) continue;
            auto& pinned = sig.output_pinned[graph.outputs[k].name];
            pinned.ensure(std::max<size_t>(d.bytes(), 1));
            if (d.bytes()) KILN_CUDA_CHECK(cudaMemcpyAsync(pinned.ptr, d.data, d.bytes(), cudaMemcpyDeviceToHost, s));
        }
        KILN_CUDA_CHECK(cudaEventRecord(events[3], s));
        const cudaError_t done = cudaEventSynchronize(events[3]);
        if (done != cudaSuccess) {
            for (void* p : rs.temporary) cudaFree(p);
            throw Error(std::string("CUDA execution failed: ") + cudaGetErrorString(done));
        }
        std::vector<Tensor> result;
        for (size_t k = 0; k < sig.outputs.size(); ++k) {
            const DeviceTensor& d = sig.outputs[k];
            if (d.host) {
                result.push_back(*d.host);
                continue;
            }
            Tensor t = Tensor::uninitialized(d.dtype, d.dims);
            std::memcpy(t.raw(), sig.output_pinned[graph.outputs[k].name].ptr, t.byteSize());
            result.push_back(toLogical(t, d.logical));
        }
        float ms[3] = {0, 0, 0};
        for (int k = 0; k < 3; ++k) cudaEventElapsedTime(&ms[k], events[k], events[k + 1]);
        stats.h2d_ms = ms[0];
        stats.compute_ms = ms[1];
        stats.d2h_ms = ms[2];
        if (rs.mode == Mode::Record) {
            plan(rs);
            sig.recorded = true;
        }
        for (void* p : rs.temporary) cudaFree(p);
        stats.arena_bytes = sig.plan.arena_bytes;
        stats.unplanned_bytes = sig.plan.unplanned_bytes;
        stats.scratch_bytes = res.scratchBytes();
        stats.cpu_nodes.clear();
        for (size_t i = 0; i < graph.nodes.size(); ++i)
            if (!sig.main.cpu_reason[i].empty()) stats.cpu_nodes.push_back(graph.nodes[i].describe() + ": " + sig.main.cpu_reason[i]);
        for (const auto& [prefix, frame] : sig.subgraphs)
            for (size_t i = 0; i < frame.cpu_reason.size(); ++i)
                if (!frame.cpu_reason[i].empty()) stats.cpu_nodes.push_back(prefix + frame.graph->nodes[i].describe() + ": " + frame.cpu_reason[i]);
        return result;
    }

    // Captures the graph's work into a CUDA graph and launches it; false when some node
    // cannot be captured (host round trips), leaving nothing enqueued.
    bool capture(RunState& rs, std::unordered_map<std::string, DeviceTensor>& values) {
        Signature& sig = *rs.sig;
        cudaStream_t s = res.stream();
        KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        bool ok = true;
        try {
            enqueue(rs, values);
        } catch (...) {  // Unsupported (host round trip) or a failed capture
            ok = false;
        }
        cudaGraph_t g = nullptr;
        const cudaError_t end = cudaStreamEndCapture(s, &g);
        ok = ok && end == cudaSuccess && sig.capturable && rs.temporary.empty();
        if (ok) ok = cudaGraphInstantiate(&sig.exec, g, 0) == cudaSuccess;
        sig.scratch_generation = res.scratchGeneration();
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();  // clear a capture error
        if (!ok) {
            sig.capturable = false;
            if (sig.exec) cudaGraphExecDestroy(sig.exec);
            sig.exec = nullptr;
            for (void* p : rs.temporary) cudaFree(p);
            rs.temporary.clear();
            return false;
        }
        KILN_CUDA_CHECK(cudaGraphLaunch(sig.exec, s));
        stats.graph_replayed = true;
        return true;
    }
};

CudaExecutor::CudaExecutor(const Graph& graph, CudaOptions options) : impl_(std::make_unique<Impl>(graph, std::move(options))) {}
CudaExecutor::~CudaExecutor() = default;
std::vector<Tensor> CudaExecutor::run(const std::map<std::string, Tensor>& inputs) { return impl_->run(inputs); }
const CudaStats& CudaExecutor::stats() const { return impl_->stats; }
const std::map<std::string, std::string>& CudaExecutor::chosenTactics() const { return impl_->chosen; }

std::map<std::string, std::string> calibrateTactics(const Graph& graph, const RouteValues& route, const std::map<std::string, Dims>& shapes) {
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    std::map<std::string, Tensor> inputs;
    for (const auto& vi : graph.runtimeInputs()) {
        auto it = shapes.find(vi.name);
        check(it != shapes.end(), "calibration needs a shape for input '" + vi.name + "'");
        Tensor t(vi.dtype, it->second);
        if (vi.dtype == DType::F32)
            for (auto& v : t.span<float>()) v = uniform(rng);
        else if (vi.dtype == DType::I64)  // token ids and masks: small valid values
            for (auto& v : t.span<int64_t>()) v = 1;
        inputs[vi.name] = t;
    }
    // Inputs here are made up: a graph whose integer inputs carry shapes or indices can fail
    // on them. Its tactics are then chosen by heuristics at run time instead.
    try {
        CudaExecutor exec(graph, CudaOptions{route, {}, true});
        exec.run(inputs);
        return exec.chosenTactics();
    } catch (const Error& e) {
        std::fprintf(stderr, "kiln: warning: tactic timing on made-up inputs failed (%s); the engine chooses tactics by heuristics\n", e.what());
        return {};
    }
}

}  // namespace kiln::cuda
