// `kiln inspect ENGINE`: header, route, layers with tactics and precisions, memory use.
#include <iostream>
#include <nlohmann/json.hpp>

#include "engine/coverage.h"
#include "tools/commands.h"
#include "tools/engine_source.h"

namespace kiln::tools {

namespace {

std::string precisionOf(const Graph& g, const Node& n) {
    // Integer products: the type of their 8-bit data (their float inputs are only scales).
    if (n.op_type.rfind("QLinear", 0) == 0 && !n.inputs.empty()) {
        const ValueInfo* vi = g.findValueInfo(n.inputs[0]);
        auto c = g.initializers.find(n.inputs.size() > 2 ? n.inputs[2] : "");
        const DType t = c != g.initializers.end() ? c->second.dtype() : vi ? vi->dtype : DType::Undefined;
        if (t != DType::Undefined) return std::string(dtypeName(t));
    }
    for (const auto& in : n.inputs) {
        if (in.empty()) continue;
        if (auto it = g.initializers.find(in); it != g.initializers.end() && isFloating(it->second.dtype())) return std::string(dtypeName(it->second.dtype()));
        if (const ValueInfo* vi = g.findValueInfo(in); vi && isFloating(vi->dtype)) return std::string(dtypeName(vi->dtype));
    }
    return "-";
}

}  // namespace

void addInspectCommand(CLI::App& app) {
    auto path = std::make_shared<std::string>();
    auto json = std::make_shared<bool>(false);
    CLI::App* cmd = app.add_subcommand("inspect", "Show an engine's header, route, layers (tactic, precision) and memory use");
    cmd->add_option("engine", *path, "Engine file")->required();
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([path, json] {
        Engine e = readEngine(*path);
        size_t weights = 0;
        for (const auto& [n, t] : e.graph.initializers) weights += t.byteSize();
        BuildRoute route = BuildRoute::parse(e.route, Builder::space());
        nlohmann::json j = {{"file", *path}, {"format_version", kEngineFormatVersion}, {"kiln_version", e.kiln_version}, {"target", e.target},
                            {"model_hash", e.model_hash}, {"route", e.route}, {"route_hash", route.hash()},
                            {"route_changes", route.changesText(Builder::space())}, {"weights_bytes", weights}, {"layers", nlohmann::json::array()}};
        for (const auto& [name, r] : e.profile) j["profile"][name] = {{"min", r.min}, {"opt", r.opt}, {"max", r.max}};
        for (const auto& n : e.graph.nodes) {
            auto t = e.tactics.find(n.name);
            j["layers"].push_back({{"name", n.name}, {"op", (n.domain.empty() ? "" : n.domain + ".") + n.op_type},
                                   {"tactic", t == e.tactics.end() ? "-" : t->second}, {"precision", precisionOf(e.graph, n)}});
        }
        const auto slow = referenceKernelNodes(e);
        j["reference_kernel_nodes"] = nlohmann::json::array();
        for (const auto& s : slow) j["reference_kernel_nodes"].push_back({{"name", s.node}, {"op", s.op}, {"why", s.why}});
        if (*json) {
            std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
            return;
        }
        std::cout << "engine       " << *path << "\nformat       v" << kEngineFormatVersion << ", built by kiln " << e.kiln_version << "\ntarget       " << e.target
                  << "\nmodel hash   " << e.model_hash << "\nroute        " << route.changesText(Builder::space()) << " (hash " << route.hash() << ")\nweights      "
                  << weights << " bytes in " << e.graph.initializers.size() << " tensors\n";
        for (const auto& [name, r] : e.profile)
            std::cout << "profile      " << name << ": " << dimsToString(r.min) << " .. " << dimsToString(r.max) << " (opt " << dimsToString(r.opt) << ")\n";
        std::cout << "layers       " << e.graph.nodes.size() << "\n";
        for (const auto& l : j["layers"])
            std::cout << "  " << l["name"].get<std::string>() << "  " << l["op"].get<std::string>() << "  tactic=" << l["tactic"].get<std::string>()
                      << "  precision=" << l["precision"].get<std::string>() << "\n";
        if (!slow.empty()) std::cout << coverageSummary(e, slow) << ":\n";
        for (const auto& s : slow) std::cout << "  " << s.node << " (" << s.op << "): " << s.why << "\n";
    });
}

}  // namespace kiln::tools
