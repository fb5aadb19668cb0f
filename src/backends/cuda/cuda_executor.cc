// The CUDA executor: construction and weight upload, runs (input and output staging, CUDA
// graph capture and replay) and build-time tactic calibration. The node loop is in
// cuda_enqueue.cc.
#include "backends/cuda/cuda_executor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "backends/cuda/cuda_executor_impl.h"

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

CudaExecutor::Impl::Impl(const Graph& g, CudaOptions o) : graph(g), options(std::move(o)) {
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

CudaExecutor::Impl::~Impl() {
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

DeviceTensor CudaExecutor::Impl::upload(const Tensor& t, const std::string& name) {
    DeviceTensor d{physicalOf(t.dtype()), t.dtype(), t.dims(), nullptr, std::make_shared<const Tensor>(t)};
    const Tensor physical = toPhysical(t, d.dtype);
    weight_buffers.emplace_back();
    weight_buffers.back().ensure(roundUp(physical.byteSize()));
    d.data = weight_buffers.back().ptr;
    if (physical.byteSize()) KILN_CUDA_CHECK(cudaMemcpy(d.data, physical.raw(), physical.byteSize(), cudaMemcpyHostToDevice));
    stats.weight_bytes += physical.byteSize();
    return d;
}

void CudaExecutor::Impl::uploadSubgraphWeights(const Graph& g, const std::string& prefix) {
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

Tensor CudaExecutor::Impl::download(const DeviceTensor& d) {
    if (d.host) return *d.host;
    Tensor physical = Tensor::uninitialized(d.dtype, d.dims);
    if (physical.byteSize()) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(physical.raw(), d.data, physical.byteSize(), cudaMemcpyDeviceToHost, res.stream()));
        KILN_CUDA_CHECK(cudaStreamSynchronize(res.stream()));
    }
    return toLogical(physical, d.logical);
}

std::vector<Tensor> CudaExecutor::Impl::run(const std::map<std::string, Tensor>& inputs) {
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

bool CudaExecutor::Impl::capture(RunState& rs, std::unordered_map<std::string, DeviceTensor>& values) {
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
