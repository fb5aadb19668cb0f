// `kiln routes MODEL [--expr EXPR] [--dry-run] [--json]`: the parameter space and which
// parameters affect this model, or the routes an expression expands to. Builds nothing.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/builder.h"
#include "llm/llm_parameters.h"
#include "llm/model_loader.h"
#include "onnx_import/importer.h"
#include "route/expression.h"
#include "tools/commands.h"

namespace kiln::tools {

namespace {

struct RoutesOptions {
    std::string model, expr;
    bool dry_run = false, json = false;
    uint64_t seed = 0;
};

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
}

void listSpace(const RoutesOptions& o) {
    Builder builder(importOnnxModel(o.model), "");
    auto affecting = builder.affectingParameters();
    std::set<std::string> affects(affecting.begin(), affecting.end());
    nlohmann::json j = nlohmann::json::array();
    for (const auto& p : Builder::space().parameters())
        if (!p.hidden)
            j.push_back({{"name", p.name}, {"values", p.values}, {"offered_values", builder.offeredValues(p.name)}, {"default", p.default_value}, {"owner", p.owner},
                         {"description", p.description}, {"affects_model", affects.count(p.name) != 0}});
    if (o.json) {
        std::cout << nlohmann::json{{"model", o.model}, {"parameters", j}}.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return;
    }
    std::printf("%-26s %-20s %-8s %-8s %s\n", "parameter", "values", "default", "affects", "description");
    for (const auto& p : j)
        std::printf("%-26s %-20s %-8s %-8s %s\n", p["name"].get<std::string>().c_str(), joined(p["offered_values"]).c_str(), p["default"].get<std::string>().c_str(),
                    p["affects_model"].get<bool>() ? "yes" : "no", p["description"].get<std::string>().c_str());
    std::printf("%zu parameters, %zu affect %s (values: those this machine builds as themselves; --json lists all)\n", j.size(), affects.size(), o.model.c_str());
}

// An LLM folder: the runtime's parameters and the targets each applies on.
void listLlmSpace(const RoutesOptions& o) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& p : llm::llmSpace().parameters()) {
        std::vector<std::string> targets;
        for (const auto& t : llm::llmTargets())
            if (llm::llmParameterApplies(p.name, t)) targets.push_back(t);
        j.push_back({{"name", p.name}, {"values", p.values}, {"default", p.default_value}, {"owner", p.owner}, {"description", p.description}, {"targets", targets}});
    }
    if (o.json) {
        std::cout << nlohmann::json{{"model", o.model}, {"parameters", j}}.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return;
    }
    std::printf("%-30s %-28s %-8s %-9s %s\n", "parameter", "values", "default", "targets", "description");
    for (const auto& p : j)
        std::printf("%-30s %-28s %-8s %-9s %s\n", p["name"].get<std::string>().c_str(), joined(p["values"]).c_str(), p["default"].get<std::string>().c_str(),
                    joined(p["targets"]).c_str(), p["description"].get<std::string>().c_str());
    std::printf("%zu LLM runtime parameters (set with --route on generate, serve and bench-llm; searched by kiln tune %s)\n", j.size(), o.model.c_str());
}

void listRoutes(const RoutesOptions& o) {
    const bool llm_folder = std::filesystem::is_directory(o.model);
    if (!llm_folder) importOnnxModel(o.model);  // the model must load, even though expansion does not need it
    const ParameterSpace& space = llm_folder ? llm::llmSpace() : Builder::space();
    ExpandedRoutes r = expandRouteExpression(o.expr, space, o.seed);
    if (o.json) {
        nlohmann::json routes = nlohmann::json::array();
        for (const auto& route : r.routes) routes.push_back({{"hash", route.hash()}, {"changes", route.changesText(space)}, {"route", route.text()}});
        std::cout << nlohmann::json{{"expression", o.expr}, {"count", r.routes.size()}, {"generated", r.generated}, {"routes", routes}}.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return;
    }
    for (size_t i = 0; i < r.routes.size(); ++i) std::printf("%4zu  %s  %s\n", i + 1, r.routes[i].hash().c_str(), r.routes[i].changesText(space).c_str());
    std::printf("%zu routes (%zu generated, %zu duplicates removed)\n", r.routes.size(), r.generated, r.generated - r.routes.size());
}

}  // namespace

void addRoutesCommand(CLI::App& app) {
    auto o = std::make_shared<RoutesOptions>();
    CLI::App* cmd = app.add_subcommand("routes", "List the parameter space for a model, or the routes a route expression expands to");
    cmd->add_option("model", o->model, "Model file (.onnx), or an LLM folder (its runtime parameters)")->required();
    cmd->add_option("--expr", o->expr, "Route expression, e.g. 'fusion.*=[on,off] precision.matmul=[f32,f16]'");
    cmd->add_flag("--dry-run", o->dry_run, "Only list routes, build nothing (always the case for this command)");
    cmd->add_option("--seed", o->seed, "Seed for random:N");
    cmd->add_flag("--json", o->json, "Machine-readable output");
    cmd->callback([o] {
        if (!o->expr.empty()) listRoutes(*o);
        else if (std::filesystem::is_directory(o->model)) listLlmSpace(*o);
        else listSpace(*o);
    });
}

}  // namespace kiln::tools
