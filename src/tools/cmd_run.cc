// `kiln run MODEL`: runs a model on given or random inputs and prints / writes outputs.
#include <iostream>
#include <nlohmann/json.hpp>

#include "onnx_import/importer.h"
#include "tools/commands.h"
#include "tools/model_io.h"

namespace kiln::tools {

namespace {

struct RunOptions {
    std::string model;
    InputOptions inputs;
    std::string outputs_dir;
    std::string target = "cpu";
    bool npy = false;
    bool json = false;
};

void execute(const RunOptions& o) {
    check(o.target == "cpu", "--target " + o.target + ": only the cpu target is available in this build");
    Graph g = importOnnxModel(o.model);
    TensorMap inputs = loadInputs(g, o.inputs);
    GraphExecutor exec(g);
    std::vector<Tensor> outputs = exec.run(inputs);
    if (!o.outputs_dir.empty()) writeOutputs(g, outputs, o.outputs_dir, o.npy);
    if (o.json) {
        nlohmann::json j;
        j["model"] = o.model;
        for (size_t i = 0; i < outputs.size(); ++i)
            j["outputs"].push_back({{"name", g.outputs[i].name}, {"dtype", dtypeName(outputs[i].dtype())}, {"shape", outputs[i].dims()}});
        std::cout << j.dump(2) << "\n";
    } else {
        std::cout << summarizeOutputs(g, outputs);
    }
}

}  // namespace

void addRunCommand(CLI::App& app) {
    auto opts = std::make_shared<RunOptions>();
    CLI::App* cmd = app.add_subcommand("run", "Run a model (.onnx) on the CPU and print or save its outputs");
    cmd->add_option("model", opts->model, "Model file (.onnx)")->required();
    cmd->add_option("--inputs-dir", opts->inputs.inputs_dir, "ONNX test_data_set folder with input_0.pb, input_1.pb, ... (or .npy)");
    cmd->add_option("--input", opts->inputs.input_files, "NAME=FILE (.pb TensorProto or .npy); repeatable");
    cmd->add_option("--shapes", opts->inputs.shapes, "NAME:DIMS (e.g. x:1x3x224x224) for random inputs with symbolic dims");
    cmd->add_option("--seed", opts->inputs.seed, "Seed for random inputs (inputs not given are random)");
    cmd->add_option("--outputs-dir", opts->outputs_dir, "Write output_0.pb, ... here");
    cmd->add_flag("--npy", opts->npy, "Write outputs as .npy instead of .pb");
    cmd->add_option("--target", opts->target, "Target: cpu")->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_flag("--json", opts->json, "Print a JSON summary instead of text");
    cmd->callback([opts] { execute(*opts); });
}

}  // namespace kiln::tools
