// Inputs and outputs for the CLI commands: ONNX test_data_set folders, NAME=FILE pairs,
// seeded random inputs, and output writing / summaries.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "ir/graph.h"
#include "backends/cpu/graph_executor.h"

namespace kiln::tools {

struct InputOptions {
    std::string inputs_dir;                   // input_0.pb ... in graph-input order
    std::vector<std::string> input_files;     // NAME=FILE
    std::vector<std::string> shapes;          // NAME:1x3x224x224 for symbolic dims of random inputs
    uint64_t seed = 0;
};

// Registers --inputs-dir, --input, --shapes and --seed on a command.
void addInputOptions(CLI::App& cmd, InputOptions& o);
// Random inputs with symbolic dims default to the engine profile's opt shapes.
void addProfileShapes(const Engine& engine, InputOptions& o);

// Loads or generates inputs for every runtime input of `g`.
TensorMap loadInputs(const Graph& g, const InputOptions& opts);
// Reads output_N.pb files of a test_data_set folder (empty if there are none).
std::vector<Tensor> loadExpectedOutputs(const std::filesystem::path& dir);
// Writes output_0.pb, ... (TensorProto named after the graph output), or .npy with `npy`.
void writeOutputs(const Graph& g, const std::vector<Tensor>& outputs, const std::filesystem::path& dir, bool npy);
// One line per output: name, dtype, shape, min / max / mean and the first values.
std::string summarizeOutputs(const Graph& g, const std::vector<Tensor>& outputs);

}  // namespace kiln::tools
