#include "engine/builder.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>

#include "backends/backend.h"
#include "backends/cpu/reference/kernel.h"
#include "backends/memory_plan.h"
#include "passes/pass.h"
#include "quant/qdq_insertion.h"

namespace kiln {

const ParameterSpec& quantSkipFirstLastParameter() {
    static const ParameterSpec p{"quant.skip_first_last", {"off", "on"}, "off", "quant",
                                 "With precision.conv/precision.matmul=int8: keep the first and the last Conv/MatMul/Gemm in f32 (usually the most sensitive)"};
    return p;
}

const ParameterSpec& debugFaultParameter() {
    static const ParameterSpec p{"debug.fault", {"none", "build_error", "crash", "hang", "wrong", "wrong_past_16_rows"}, "none", "builder",
                                 "Fault injection for testing the tuner's isolation (wrong_past_16_rows: wrong only where the first output's first dim exceeds 16)", true};
    return p;
}

const ParameterSpace& Builder::space() {
    static const ParameterSpace s = [] {
        std::vector<ParameterSpec> all = passParameters();
        for (const auto& p : backendParameters()) all.push_back(p);
        all.push_back(quantSkipFirstLastParameter());
        all.push_back(memoryPlannerParameter());
        all.push_back(debugFaultParameter());
        return ParameterSpace(all);
    }();
    return s;
}

Builder::Builder(Graph model, std::string model_hash, std::string target)
    : model_(std::move(model)), model_hash_(std::move(model_hash)), target_(std::move(target)), route_(BuildRoute::defaults(space())) {
    // Names the target without touching the device (a tuner parent must not start CUDA
    // before it forks candidate processes).
    backendFor(target_);
}

void Builder::setShapeProfile(ShapeProfile profile) {
    for (const auto& [name, r] : profile) {
        bool known = false;
        for (const auto& in : model_.runtimeInputs()) known |= in.name == name;
        check(known, "shape profile names unknown input '" + name + "'");
        check(r.min.size() == r.max.size() && r.opt.size() == r.max.size(), "shape profile for '" + name + "': min/opt/max ranks differ");
        for (size_t d = 0; d < r.max.size(); ++d)
            check(r.min[d] <= r.opt[d] && r.opt[d] <= r.max[d], "shape profile for '" + name + "': needs min <= opt <= max in every dim");
    }
    profile_ = std::move(profile);
}

bool int8Requested(const BuildRoute& route) { return route.get("precision.conv") == "int8" || route.get("precision.matmul") == "int8"; }

Graph Builder::quantized(const BuildRoute& r) const {
    if (!int8Requested(r)) return model_;
    const QuantSelection selection{r.get("precision.conv") == "int8", r.get("precision.matmul") == "int8", r.get(quantSkipFirstLastParameter().name) == "on"};
    check(calibration_ != nullptr, "precision.conv/precision.matmul=int8 needs calibration ranges: give --calib FILE (made by `kiln calibrate MODEL --data DIR`)");
    check(model_hash_.empty() || calibration_->model_hash == model_hash_,
          "the calibration ranges were measured on another model (hash " + calibration_->model_hash + ", this model has " + model_hash_ + ")");
    return insertQdq(model_, *calibration_, selection);
}

Graph Builder::optimize() const { return optimizeGraph(quantized(route_), passRoute(route_)); }

RouteValues Builder::passRoute(const BuildRoute& r) const {
    RouteValues v = r.values();
    v[kTargetKey] = target_;
    return v;
}

std::vector<std::string> Builder::offeredValues(const std::string& parameter) const {
    std::vector<std::string> out;
    for (const std::string& v : space().get(parameter).values) {
        BuildRoute r = BuildRoute::defaults(space());
        r.set(parameter, v, space());
        if (backendFor(target_).adjustRoute(r, nullptr).get(parameter) == v) out.push_back(v);
    }
    return out;
}

void Builder::setBuildRoute(const BuildRoute& route) {
    warnings_.clear();
    route_ = backendFor(target_).adjustRoute(route, &warnings_);
}

Engine Builder::build() const {
    const std::string fault = route_.get(debugFaultParameter().name);
    if (fault == "build_error") throw Error("debug.fault=build_error: injected build failure");
    if (fault == "crash") std::abort();
    if (fault == "hang") std::this_thread::sleep_for(std::chrono::hours(24));
    Engine e;
    e.kiln_version = KILN_VERSION;
    e.target = targetSignature(target_);
    e.route = route_.text();
    e.model_hash = model_hash_;
    e.profile = profile_;
    e.graph = optimize();
    if (fault == "wrong" || fault == "wrong_past_16_rows") {
        // Scale the first graph output: a build that runs fine but computes wrong numbers
        // (by 1 + 0.5 * (rows > 16) for the shape-dependent fault).
        const std::string out = e.graph.outputs.at(0).name, tmp = out + "_before_fault", k = out + "_fault_scale";
        for (auto& n : e.graph.nodes)
            for (auto& o : n.outputs)
                if (o == out) o = tmp;
        if (fault == "wrong") {
            e.graph.initializers[k] = Tensor::scalar<float>(1.5f);
        } else {
            auto add = [&](const std::string& op, std::vector<std::string> in, Attributes attrs = {}) {
                const std::string name = "debug_fault_" + std::to_string(e.graph.nodes.size());
                e.graph.nodes.push_back(Node{name, op, "", std::move(in), {name}, std::move(attrs)});
                return name;
            };
            e.graph.initializers["debug_fault_zero"] = Tensor::scalar<int64_t>(0);
            e.graph.initializers["debug_fault_rows"] = Tensor::scalar<int64_t>(16);
            e.graph.initializers["debug_fault_half"] = Tensor::scalar<float>(0.5f);
            e.graph.initializers["debug_fault_one"] = Tensor::scalar<float>(1.0f);
            Attributes to_float;
            to_float.set("to", std::string(dtypeName(DType::F32)));
            const std::string rows = add("Gather", {add("Shape", {tmp}), "debug_fault_zero"});
            const std::string past = add("Cast", {add("Greater", {rows, "debug_fault_rows"})}, to_float);
            const std::string scale = add("Add", {add("Mul", {past, "debug_fault_half"}), "debug_fault_one"});
            for (auto& n : e.graph.nodes)
                if (n.outputs[0] == scale) n.outputs[0] = k;
        }
        e.graph.nodes.push_back(Node{"debug_fault", "Mul", "", {tmp, k}, {out}, {}});
    }
    std::string missing;
    for (const auto& n : e.graph.nodes)
        if (!referenceKernels().find(n.op_type)) missing += (missing.empty() ? "" : ", ") + n.describe();
    check(missing.empty(), "no CPU kernel for " + missing);
    e.tactics = backendFor(target_).selectTactics(e.graph, route_.values(), timing_cache_, buildShapes(e));
    return e;
}

// Every runtime input's shape for timing: the profile's opt shape, else its static shape;
// empty when some input has neither.
std::map<std::string, Dims> Builder::buildShapes(const Engine& e) const {
    std::map<std::string, Dims> shapes;
    for (const auto& vi : e.graph.runtimeInputs()) {
        auto p = e.profile.find(vi.name);
        if (p != e.profile.end()) {
            shapes[vi.name] = p->second.opt;
            continue;
        }
        if (!vi.shape.rank_known) return {};
        Dims d;
        for (const auto& dim : vi.shape.dims) {
            if (!dim.known()) return {};
            d.push_back(dim.size);
        }
        shapes[vi.name] = d;
    }
    return shapes;
}

namespace {

// Op types of a graph and of its subgraphs.
void collectOpTypes(const Graph& g, std::set<std::string>& out) {
    for (const Node& n : g.nodes) {
        out.insert(n.op_type);
        for (const auto& attr : subgraphAttributes(n)) collectOpTypes(*n.attrs.getGraph(attr), out);
    }
}

// Parameters read after the passes: by tactic selection or at run time.
bool actsAfterPasses(const ParameterSpec& p) { return p.owner == "runtime" || p.owner.rfind("backends/", 0) == 0; }

// Whether such a parameter acts on an optimized graph with these ops, on this target kind:
// the backends' own parameters on their target, kernel choices only where their ops are.
bool actsOn(const ParameterSpec& p, const std::string& target_kind, const std::set<std::string>& op_types) {
    const bool other_target = p.owner != "runtime" && p.owner.rfind("backends/", 0) == 0 && p.owner != "backends/" + target_kind;
    const bool has_ops = p.ops.empty() || std::any_of(p.ops.begin(), p.ops.end(), [&](const std::string& op) { return op_types.count(op) > 0; });
    return !op_types.empty() && !other_target && has_ops;
}

}  // namespace

std::string Builder::engineIdentity(const Engine& engine) {
    std::set<std::string> op_types;
    collectOpTypes(engine.graph, op_types);
    const BuildRoute route = BuildRoute::parse(engine.route, space());
    Engine canonical = engine;
    canonical.tactics.clear();
    canonical.route.clear();
    for (const auto& p : space().parameters())
        if (actsAfterPasses(p) && actsOn(p, targetKind(engine.target), op_types)) canonical.route += p.name + "=" + route.get(p.name) + ";";
    return engineHash(canonical);
}

std::vector<std::string> Builder::affectingParameters() const {
    const Graph optimized = optimize();
    const std::string base = dumpGraph(optimized);
    std::set<std::string> op_types;
    collectOpTypes(optimized, op_types);
    std::vector<std::string> out;
    for (const auto& p : space().parameters()) {
        if (p.hidden) continue;
        if (actsAfterPasses(p)) {
            if (actsOn(p, target_, op_types)) out.push_back(p.name);
            continue;
        }
        for (const auto& v : p.values) {
            if (v == route_.get(p.name)) continue;
            BuildRoute r = route_;
            r.set(p.name, v, space());
            std::string changed;
            try {
                changed = dumpGraph(optimizeGraph(quantized(r), passRoute(r)));
            } catch (const Error&) {
                continue;  // a value this build cannot take (int8 without calibration ranges)
            }
            if (changed != base) {
                out.push_back(p.name);
                break;
            }
        }
    }
    return out;
}

}  // namespace kiln
