// `kiln build MODEL -o FILE`: optimizes a model with a build route and writes an engine.
#include <iostream>

#include "engine/coverage.h"
#include "tools/commands.h"
#include "tools/engine_source.h"

namespace kiln::tools {

namespace {
struct BuildCommand {
    std::string model, output;
    BuildOptions build;
    bool verbose = false;
};
}  // namespace

void addBuildCommand(CLI::App& app) {
    auto o = std::make_shared<BuildCommand>();
    CLI::App* cmd = app.add_subcommand("build", "Build an engine from an .onnx model with a build route");
    cmd->add_option("model", o->model, "Model file (.onnx)")->required();
    cmd->add_option("-o,--output", o->output, "Engine file to write")->required();
    addBuildOptions(*cmd, o->build);
    cmd->add_flag("-v,--verbose", o->verbose, "Print a summary of the build");
    cmd->callback([o] {
        Engine e = buildEngine(o->model, o->build);
        writeEngine(e, o->output);
        if (o->verbose)
            std::cout << "built " << o->output << ": " << e.graph.nodes.size() << " layers, target " << e.target << ", route "
                      << routeFromOptions(o->build).changesText(Builder::space()) << "\n";
        if (o->verbose) {
            const auto slow = referenceKernelNodes(e);
            if (!slow.empty()) std::cout << coverageSummary(e, slow) << ":\n";
            for (const auto& s : slow) std::cout << "  " << s.node << " (" << s.op << "): " << s.why << "\n";
        }
    });
}

}  // namespace kiln::tools
