// Turning a command's MODEL argument into an engine: an engine file is loaded (and checked
// against this machine's target), an .onnx file is imported and built with a route.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/builder.h"
#include "tools/model_io.h"

namespace kiln::tools {

struct BuildOptions {
    std::string route;   // route text (name=value;...), "" = default
    std::string target = "cpu";
    bool fp16 = false, bf16 = false;  // shorthand for precision.*=f16 / bf16
    std::vector<std::string> min_shapes, opt_shapes, max_shapes;  // NAME:DIMS
    std::string timing_cache;  // tactic timings kept across builds
    bool int8 = false;         // quantize with the ranges of `calib` (QDQ inserted, then int8 kernels)
    std::string calib;
};

// Registers the build options on a CLI command.
void addBuildOptions(CLI::App& cmd, BuildOptions& o);
// The route the options describe, validated against the parameter space.
BuildRoute routeFromOptions(const BuildOptions& o);
Engine buildEngine(const std::string& model, const BuildOptions& o);
// For run/bench: the engine (an engine file loaded, or an .onnx built) and the inputs it runs
// on, each input file read once. Building, an input with symbolic dims that no --*Shapes
// names gets a profile of exactly its shape (trtexec's --shapes), so that tactic timing sees
// real shapes; inputs that need the engine's profile shapes are made after the build.
Engine engineWithInputs(const std::string& model, const BuildOptions& o, InputOptions& in, TensorMap* inputs);
// The shape profile of --minShapes/--optShapes/--maxShapes (each NAME:DIMS; an input needs
// --maxShapes, and opt defaults to min when only min and max are given).
ShapeProfile profileFromFlags(const std::vector<std::string>& min_shapes, const std::vector<std::string>& opt_shapes, const std::vector<std::string>& max_shapes);
// The ranges of a --calib file, refused unless they were measured on the model whose file hash
// is `hash`.
std::shared_ptr<const CalibrationTable> calibrationFor(const std::string& calib, const std::string& model, const std::string& hash);
// Parses "NAME:1x3x224x224".
std::pair<std::string, Dims> parseNamedShape(const std::string& spec, const std::string& flag);

}  // namespace kiln::tools
