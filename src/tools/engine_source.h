// Turning a command's MODEL argument into an engine: an engine file is loaded (and checked
// against this machine's target), an .onnx file is imported and built with a route.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/builder.h"

namespace kiln::tools {

struct BuildOptions {
    std::string route;   // route text (name=value;...), "" = default
    std::string target = "cpu";
    bool fp16 = false, bf16 = false;  // shorthand for precision.*=f16 / bf16
    std::vector<std::string> min_shapes, opt_shapes, max_shapes;  // NAME:DIMS
    std::string timing_cache;  // tactic timings kept across builds
    // Set by run/bench: the inputs the engine will run on. An input with symbolic dims that no
    // --*Shapes names gets a profile of exactly its shape (trtexec's --shapes), so that tactic
    // timing at build sees real shapes.
    const struct InputOptions* run_inputs = nullptr;
};

// Registers the build options on a CLI command.
void addBuildOptions(CLI::App& cmd, BuildOptions& o);
// The route the options describe, validated against the parameter space.
BuildRoute routeFromOptions(const BuildOptions& o);
Engine buildEngine(const std::string& model, const BuildOptions& o);
Engine loadOrBuildEngine(const std::string& model, const BuildOptions& o);
// Parses "NAME:1x3x224x224".
std::pair<std::string, Dims> parseNamedShape(const std::string& spec, const std::string& flag);

}  // namespace kiln::tools
