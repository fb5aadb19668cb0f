#include "runtime/context.h"

#include <cstring>
#include <set>

#include "backends/cuda/cuda_executor.h"
#include "engine/builder.h"

namespace kiln {

namespace {

// Ops whose output is their input's bytes under another shape (the kernels return a view).
bool isViewOp(const Node& n) {
    return n.domain.empty() && (n.op_type == "Reshape" || n.op_type == "Flatten" || n.op_type == "Squeeze" || n.op_type == "Unsqueeze" ||
                                n.op_type == "Identity");
}

// First run for a shape signature: keeps the kernels' tensors and records each value's
// size and lifetime for planning. A view op's output gets no buffer of its own: it stays a
// view of its input's, whose lifetime stretches to the view's last use (graph outputs, which
// leave the arena, are still copied out).
class SizeRecorder : public ValuePlacer {
public:
    explicit SizeRecorder(const GraphExecutor& exec) : exec_(exec) {}
    Tensor place(size_t node, const std::string& value, Tensor computed) override {
        const size_t last = exec_.lastUse(value), end = exec_.graph().nodes.size();
        const Node& n = exec_.graph().nodes[node];
        if (isViewOp(n) && last < end && !n.inputs.empty()) {
            auto root = request_of_.find(rootOf(n.inputs[0]));
            if (root != request_of_.end() && requests[root->second].bytes == computed.byteSize()) {
                view_root_[value] = root->first;
                views.insert(value);
                requests[root->second].last_use = std::max(requests[root->second].last_use, last);
                return computed;
            }
        }
        if (last < end) {  // graph outputs stay out of the arena
            request_of_[value] = requests.size();
            names.push_back(value);
            requests.push_back({node, std::max(node, last), computed.byteSize()});
        }
        return computed;
    }
    std::vector<std::string> names;
    std::vector<BufferRequest> requests;
    std::set<std::string> views;  // values that stay views of another value's buffer

private:
    std::string rootOf(const std::string& value) const {
        auto it = view_root_.find(value);
        return it == view_root_.end() ? value : it->second;
    }
    const GraphExecutor& exec_;
    std::map<std::string, size_t> request_of_;
    std::map<std::string, std::string> view_root_;
};

std::string shapeSignature(const TensorMap& inputs) {
    std::string s;
    for (const auto& [name, t] : inputs) s += name + ":" + t.summary() + ";";
    return s;
}

}  // namespace

// Planned slots for one input-shape signature; values are copied into their slot.
struct ExecutionContext::Arena : ValuePlacer {
    std::map<std::string, std::pair<size_t, size_t>> slots;  // value -> (offset, bytes)
    std::set<std::string> views;
    std::shared_ptr<std::byte[]> memory;
    MemoryPlan plan;
    // Fast kernels write straight into their planned slot.
    Tensor allocate(const std::string& value, DType dtype, const Dims& dims) override {
        auto it = slots.find(value);
        if (it == slots.end() || numElements(dims) * static_cast<int64_t>(dtypeSize(dtype)) != static_cast<int64_t>(it->second.second))
            return Tensor::uninitialized(dtype, dims);
        return Tensor::alias(dtype, dims, memory, it->second.first);
    }
    Tensor place(size_t, const std::string& value, Tensor computed) override {
        if (views.count(value)) return computed;  // shares its root's slot, alive long enough
        auto it = slots.find(value);
        if (it != slots.end() && computed.raw() == memory.get() + it->second.first) return computed;  // already in its slot
        if (it == slots.end() || computed.byteSize() != it->second.second) {
            // A value kept outside the arena must not alias it (Reshape/Identity return views).
            const std::byte* p = computed.raw();
            const bool aliases = p >= memory.get() && p < memory.get() + plan.arena_bytes;
            return aliases ? computed.clone() : computed;
        }
        Tensor slot = Tensor::alias(computed.dtype(), computed.dims(), memory, it->second.first);
        if (computed.byteSize()) std::memcpy(slot.raw(), computed.raw(), computed.byteSize());
        return slot;
    }
};

ExecutionContext::ExecutionContext(const Engine& engine) : engine_(engine) {
    if (targetKind(engine.target) == "cuda") {
        BuildRoute route = BuildRoute::parse(engine.route, Builder::space());
        cuda_ = std::make_unique<cuda::CudaExecutor>(engine.graph, cuda::CudaOptions{route.values(), engine.tactics, false});
    } else {
        executor_ = std::make_unique<GraphExecutor>(engine.graph, engine.tactics);
    }
    // The planner comes from the engine's route text ("name=value;...").
    planner_ = memoryPlannerParameter().default_value;
    const std::string key = memoryPlannerParameter().name + "=";
    size_t start = 0;
    while (start < engine.route.size()) {
        size_t end = engine.route.find(';', start);
        if (end == std::string::npos) end = engine.route.size();
        if (engine.route.compare(start, key.size(), key) == 0) planner_ = engine.route.substr(start + key.size(), end - start - key.size());
        start = end + 1;
    }
    stats_.planner = planner_;
}

ExecutionContext::~ExecutionContext() = default;

std::vector<Tensor> ExecutionContext::run(const TensorMap& inputs) {
    for (const auto& [name, range] : engine_.profile) {
        auto it = inputs.find(name);
        if (it == inputs.end()) continue;  // checkInputs reports it
        const Dims& d = it->second.dims();
        check(range.contains(d), [&] {
            return "input '" + name + "' has shape " + dimsToString(d) + ", outside the engine's profile " + dimsToString(range.min) + " .. " +
                   dimsToString(range.max);
        });
    }
    if (cuda_) {
        checkInputs(engine_.graph, inputs);
        auto outputs = cuda_->run(inputs);
        const cuda::CudaStats& s = cuda_->stats();
        stats_.gpu = true;
        stats_.arena_bytes = s.arena_bytes;
        stats_.unplanned_bytes = s.unplanned_bytes;
        stats_.h2d_ms = s.h2d_ms;
        stats_.gpu_compute_ms = s.compute_ms;
        stats_.d2h_ms = s.d2h_ms;
        stats_.graph_replayed = s.graph_replayed;
        stats_.weight_bytes = s.weight_bytes;
        stats_.scratch_bytes = s.scratch_bytes;
        stats_.cpu_nodes = s.cpu_nodes;
        return outputs;
    }
    // The last run's arena when the inputs' names, types and dims are the same (a signature
    // string per run cost about 0.5 us of mlp's 4), else the arena of their signature; the
    // first run of a signature records its sizes and plans it.
    bool same = last_arena_ && last_inputs_.size() == inputs.size();
    if (same) {
        size_t i = 0;
        for (auto in = inputs.begin(); same && in != inputs.end(); ++in, ++i) {
            const auto& [name, dtype, dims] = last_inputs_[i];
            same = in->first == name && in->second.dtype() == dtype && in->second.dims() == dims;
        }
    }
    Arena* arena = same ? last_arena_ : nullptr;
    std::vector<Tensor> outputs;
    bool recorded = false;  // this run recorded the sizes: its outputs are the answer
    if (!arena) {
        const std::string sig = shapeSignature(inputs);
        auto it = arenas_.find(sig);
        if (it == arenas_.end()) {
            SizeRecorder recorder(*executor_);
            outputs = executor_->run(inputs, &recorder);
            recorded = true;
            auto made = std::make_unique<Arena>();
            made->plan = planMemory(recorder.requests, planner_);
            made->memory = allocateBytes(made->plan.arena_bytes);
            for (size_t i = 0; i < recorder.names.size(); ++i) made->slots[recorder.names[i]] = {made->plan.offsets[i], recorder.requests[i].bytes};
            made->views = recorder.views;
            it = arenas_.emplace(sig, std::move(made)).first;
        }
        arena = it->second.get();
        last_arena_ = arena;
        last_inputs_.clear();
        for (const auto& [name, t] : inputs) last_inputs_.emplace_back(name, t.dtype(), t.dims());
    }
    stats_.arena_bytes = arena->plan.arena_bytes;
    stats_.unplanned_bytes = arena->plan.unplanned_bytes;
    return recorded ? outputs : executor_->run(inputs, arena);
}

}  // namespace kiln
