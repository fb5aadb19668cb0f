// The CUDA executor's node loop: each node enqueued on its GPU kernel, kept on the host
// (shape arithmetic) or run on the CPU reference kernel; If branches enqueued in f32; memory
// recorded on the first run of a signature and planned into one arena.
#include <algorithm>
#include <cstring>

#include "backends/cpu/reference/kernel.h"
#include "backends/cuda/cuda_executor_impl.h"
#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda {

DeviceTensor CudaExecutor::Impl::allocate(RunState& rs, size_t node, const std::string& value, DType dtype, const Dims& dims) {
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

std::vector<Tensor> CudaExecutor::Impl::computeOnHost(const Node& node, int64_t opset, const std::vector<const DeviceTensor*>& in) {
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

std::vector<DeviceTensor> CudaExecutor::Impl::runOnCpu(RunState& rs, size_t at, const std::string& prefix, const Node& node, int64_t opset,
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

bool CudaExecutor::Impl::isHostNode(const Node& node, const std::vector<const DeviceTensor*>& in) {
    if (node.op_type == "Shape" || node.op_type == "Size") return true;
    int64_t elements = 0;
    for (const DeviceTensor* t : in) {
        if (!t) continue;
        if (!t->host) return false;
        elements += t->numel();
    }
    return elements <= 4096 && referenceKernels().find(node.op_type) != nullptr;
}

std::vector<DeviceTensor> CudaExecutor::Impl::runOnHost(const Node& node, int64_t opset, const std::vector<const DeviceTensor*>& in) {
    std::vector<DeviceTensor> result;
    for (Tensor& t : computeOnHost(node, opset, in))
        result.push_back(DeviceTensor{physicalOf(t.dtype()), t.dtype(), t.dims(), nullptr, std::make_shared<const Tensor>(t)});
    return result;
}

void CudaExecutor::Impl::materialize(Signature& sig, const std::string& name, DeviceTensor& t) {
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

void CudaExecutor::Impl::enqueueNodes(RunState& rs, const Graph& g, Frame& frame, const std::string& prefix, std::optional<size_t> at,
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

std::vector<DeviceTensor> CudaExecutor::Impl::runSubgraph(RunState& rs, const Node& node, const std::string& prefix, const std::string& attribute, size_t at,
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

void CudaExecutor::Impl::enqueue(RunState& rs, std::unordered_map<std::string, DeviceTensor>& values) {
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

void CudaExecutor::Impl::plan(RunState& rs) {
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

}  // namespace kiln::cuda
