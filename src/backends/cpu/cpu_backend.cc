#include "backends/cpu/cpu_backend.h"

#include <cstring>
#include <set>
#include <tuple>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/graph_executor.h"
#include "backends/cpu/tactic_selection.h"
#include "backends/memory_plan.h"
#include "passes/pass.h"

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

// Planned slots for one input-shape signature; values are copied into their slot.
struct Arena : ValuePlacer {
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

// The graph executor over an arena per input-shape signature: the first run of a signature
// records every value's size and lifetime, plans the arena (memory.planner), and later runs
// write into it.
class CpuExecutor : public TargetExecutor {
public:
    CpuExecutor(const Graph& graph, const std::map<std::string, std::string>& tactics, const RouteValues& route)
        : executor_(graph, tactics), planner_(memoryPlannerParameter().default_value) {
        if (auto it = route.find(memoryPlannerParameter().name); it != route.end()) planner_ = it->second;
    }

    std::vector<Tensor> run(const TensorMap& inputs, TargetStats& stats) override {
        stats.planner = planner_;
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
                SizeRecorder recorder(executor_);
                outputs = executor_.run(inputs, &recorder);
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
        stats.arena_bytes = arena->plan.arena_bytes;
        stats.unplanned_bytes = arena->plan.unplanned_bytes;
        return recorded ? outputs : executor_.run(inputs, arena);
    }

private:
    GraphExecutor executor_;
    std::string planner_;
    std::map<std::string, std::unique_ptr<Arena>> arenas_;  // per input-shape signature
    Arena* last_arena_ = nullptr;                             // the last run's, and its inputs:
    std::vector<std::tuple<std::string, DType, Dims>> last_inputs_;
};

class CpuBackend : public Backend {
public:
    std::string name() const override { return "cpu"; }
    std::string signature() const override {
#if defined(__x86_64__)
        return "cpu/x86_64/generic";
#elif defined(__aarch64__)
        return "cpu/aarch64/generic";
#else
        return "cpu/unknown/generic";
#endif
    }
    std::vector<ParameterSpec> parameters() const override { return tacticParameters(); }
    BuildRoute adjustRoute(const BuildRoute& route, std::vector<std::string>* warnings) const override {
        return keepNativeCpuPrecisions(route, cpuHasNativeF16(), cpuHasNativeBf16(), warnings);
    }
    // Per op class: f16/bf16 products (f32 results), int8 from calibration ranges.
    std::vector<std::string> precisionParameters(const std::string& precision) const override {
        if (precision == "int8") return {"precision.conv", "precision.matmul"};
        if (precision == "f16" || precision == "bf16") return {"precision.matmul", "precision.conv", "precision.attention"};
        return {};
    }
    std::map<std::string, std::string> selectTactics(const Graph& graph, const RouteValues& route, TimingCache* cache,
                                                     const std::map<std::string, Dims>& shapes) const override {
        return kiln::selectTactics(graph, route, cache, shapes);
    }
    std::unique_ptr<TargetExecutor> makeExecutor(const Graph& graph, const std::map<std::string, std::string>& tactics,
                                                 const RouteValues& route) const override {
        return std::make_unique<CpuExecutor>(graph, tactics, route);
    }
};

}  // namespace

const Backend& cpuBackend() {
    static const CpuBackend b;
    return b;
}

BuildRoute keepNativeCpuPrecisions(const BuildRoute& route, bool native_f16, bool native_bf16, std::vector<std::string>* warnings) {
    static const ParameterSpace passes(passParameters());
    BuildRoute out = route;
    for (const ParameterSpec& spec : passes.parameters()) {
        if (spec.owner != "precision_assignment") continue;  // the CPU's per-op-class precisions
        const std::string& p = spec.name;
        const std::string v = route.get(p);
        const bool emulated = (v == "f16" && !native_f16) || (v == "bf16" && !native_bf16);
        if (!emulated) continue;
        out.set(p, "f32", passes);
        if (warnings)
            warnings->push_back(p + "=" + v + ": this CPU has no native " + v + " (" + (v == "f16" ? "AVX512-FP16" : "AVX512-BF16 or AMX-BF16") +
                                "), where it would be emulated about 100x slower than f32; the engine keeps f32");
    }
    return out;
}

}  // namespace kiln
