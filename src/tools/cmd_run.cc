// `kiln run MODEL|ENGINE`: runs on given or random inputs and prints / writes outputs.
#include <iostream>
#include <nlohmann/json.hpp>

#include "runtime/accuracy.h"
#include "runtime/context.h"
#include "tools/commands.h"
#include "tools/engine_source.h"
#include "tools/model_io.h"

namespace kiln::tools {

namespace {

struct RunOptions {
    std::string model;
    InputOptions inputs;
    BuildOptions build;
    std::string outputs_dir;
    std::string expected_dir;
    double max_rel_l2 = -1;
    bool npy = false;
    bool json = false;
};

void execute(RunOptions& o) {
    TensorMap inputs;
    Engine engine = engineWithInputs(o.model, o.build, o.inputs, &inputs);
    ExecutionContext context(engine);
    std::vector<Tensor> outputs = context.run(inputs);
    const Graph& g = engine.graph;
    if (!o.outputs_dir.empty()) writeOutputs(g, outputs, o.outputs_dir, o.npy);
    nlohmann::json errors = nlohmann::json::array();
    bool within = true;
    if (!o.expected_dir.empty()) {
        auto expected = loadExpectedOutputs(o.expected_dir);
        check(expected.size() == outputs.size(), "--expected-dir: " + o.expected_dir + " has " + std::to_string(expected.size()) + " output files, the model has " + std::to_string(outputs.size()) + " outputs");
        for (size_t i = 0; i < outputs.size(); ++i) {
            ErrorStats e = compareOutputs(outputs[i], expected[i], g.outputs[i].name);
            bool ok = !e.nan_mismatch && (o.max_rel_l2 < 0 || e.rel_l2 <= o.max_rel_l2);
            within &= ok;
            errors.push_back({{"name", g.outputs[i].name}, {"max_abs", e.max_abs}, {"rel_l2", e.rel_l2}, {"cosine", e.cosine}, {"ok", ok}});
        }
    }
    if (o.json) {
        nlohmann::json j;
        j["model"] = o.model;
        for (size_t i = 0; i < outputs.size(); ++i)
            j["outputs"].push_back({{"name", g.outputs[i].name}, {"dtype", dtypeName(outputs[i].dtype())}, {"shape", outputs[i].dims()}});
        if (!errors.empty()) j["errors"] = errors;
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
        std::cout << summarizeOutputs(g, outputs);
        for (const auto& e : errors)
            std::cout << "vs expected " << e["name"].get<std::string>() << ": max-abs " << e["max_abs"].get<double>() << "  rel-l2 " << e["rel_l2"].get<double>()
                      << "  cosine " << e["cosine"].get<double>() << (e["ok"].get<bool>() ? "" : "  OUT OF TOLERANCE") << "\n";
    }
    check(within, "outputs differ from " + o.expected_dir + " by more than --max-rel-l2 " + std::to_string(o.max_rel_l2));
}

}  // namespace

void addRunCommand(CLI::App& app) {
    auto opts = std::make_shared<RunOptions>();
    CLI::App* cmd = app.add_subcommand("run", "Run a model (.onnx, built with the default or given route) or an engine, and print or save its outputs");
    cmd->add_option("model", opts->model, "Model file (.onnx) or engine file")->required();
    addInputOptions(*cmd, opts->inputs);
    addBuildOptions(*cmd, opts->build);
    cmd->add_option("--outputs-dir", opts->outputs_dir, "Write output_0.pb, ... here");
    cmd->add_flag("--npy", opts->npy, "Write outputs as .npy instead of .pb");
    cmd->add_option("--expected-dir", opts->expected_dir, "Compare outputs with output_N.pb / .npy in this folder (max-abs, rel-l2, cosine)");
    cmd->add_option("--max-rel-l2", opts->max_rel_l2, "With --expected-dir: fail when an output's relative L2 error exceeds this");
    cmd->add_flag("--json", opts->json, "Print a JSON summary instead of text");
    cmd->callback([opts] { execute(*opts); });
}

}  // namespace kiln::tools
