#include "tools/model_io.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "onnx_import/tensor_proto.h"
#include "runtime/input_dims.h"
#include "tools/engine_source.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

Tensor randomTensor(DType dtype, const Dims& dims, std::mt19937_64& rng) {
    Tensor t(dtype, dims);
    std::uniform_real_distribution<double> real(-1.0, 1.0);
    std::uniform_int_distribution<int> small(0, 9);  // valid as token ids / indices for small tables
    dispatchDType(dtype, "random input", [&](auto tag) {
        using T = typename decltype(tag)::type;
        T* p = t.data<T>();
        for (int64_t i = 0; i < t.numel(); ++i) {
            if constexpr (std::is_same_v<T, bool>) p[i] = small(rng) % 2;
            else if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(small(rng));
            else p[i] = static_cast<T>(real(rng));
        }
    });
    return t;
}

}  // namespace

void addInputOptions(CLI::App& cmd, InputOptions& o) {
    cmd.add_option("--inputs-dir", o.inputs_dir, "ONNX test_data_set folder with input_0.pb, input_1.pb, ... (or .npy)");
    cmd.add_option("--input", o.input_files, "NAME=FILE (.pb TensorProto or .npy); repeatable");
    cmd.add_option("--shapes", o.shapes, "NAME:DIMS (e.g. x:1x3x224x224) for random inputs with symbolic dims");
    cmd.add_option("--seed", o.seed, "Seed for random inputs (inputs not given are random)");
}

void addProfileShapes(const Engine& engine, InputOptions& o) {
    for (const auto& [name, range] : engine.profile) {
        bool given = false;
        for (const auto& s : o.shapes) given |= s.rfind(name + ":", 0) == 0;
        if (given) continue;
        std::string dims;
        for (int64_t d : range.opt) dims += (dims.empty() ? "" : "x") + std::to_string(d);
        o.shapes.push_back(name + ":" + dims);
    }
}

TensorMap loadInputs(const Graph& g, const InputOptions& opts) {
    TensorMap inputs;
    const auto declared = g.runtimeInputs();
    if (!opts.inputs_dir.empty()) {
        fs::path dir(opts.inputs_dir);
        check(fs::is_directory(dir), "--inputs-dir: " + opts.inputs_dir + " is not a directory");
        for (size_t i = 0; i < declared.size(); ++i) {
            fs::path pb = dir / ("input_" + std::to_string(i) + ".pb"), npy = dir / ("input_" + std::to_string(i) + ".npy");
            check(fs::exists(pb) || fs::exists(npy), "--inputs-dir: " + pb.string() + " is missing (the model has " + std::to_string(declared.size()) + " inputs)");
            inputs[declared[i].name] = loadTensorFile(fs::exists(pb) ? pb : npy);
        }
    }
    for (const auto& spec : opts.input_files) {
        auto eq = spec.find('=');
        check(eq != std::string::npos && eq > 0, "--input '" + spec + "': expected NAME=FILE");
        const std::string name = spec.substr(0, eq);
        check(std::any_of(declared.begin(), declared.end(), [&](const ValueInfo& v) { return v.name == name; }),
              "--input '" + spec + "': unknown input '" + name + "'");
        inputs[name] = loadTensorFile(spec.substr(eq + 1));
    }
    std::map<std::string, Dims> shapes;
    for (const auto& spec : opts.shapes) {
        auto [name, dims] = parseNamedShape(spec, "--shapes");
        shapes[name] = dims;
    }
    std::mt19937_64 rng(opts.seed);
    for (const auto& vi : declared) {
        if (inputs.count(vi.name)) continue;
        const Dims dims = randomInputDims(vi, shapes, "--shapes", "pass a file", SymbolicDims::Error);
        check(vi.dtype != DType::Undefined, "input '" + vi.name + "' has no declared element type; pass a file");
        inputs[vi.name] = randomTensor(vi.dtype, dims, rng);
    }
    return inputs;
}

std::vector<Tensor> loadExpectedOutputs(const fs::path& dir) {
    std::vector<Tensor> outs;
    for (size_t i = 0;; ++i) {
        fs::path pb = dir / ("output_" + std::to_string(i) + ".pb"), npy = dir / ("output_" + std::to_string(i) + ".npy");
        if (fs::exists(pb)) outs.push_back(loadTensorFile(pb));
        else if (fs::exists(npy)) outs.push_back(loadTensorFile(npy));
        else break;
    }
    return outs;
}

void writeOutputs(const Graph& g, const std::vector<Tensor>& outputs, const fs::path& dir, bool npy) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    check(!ec && fs::is_directory(dir), "--outputs-dir: cannot create " + dir.string());
    for (size_t i = 0; i < outputs.size(); ++i)
        saveTensorFile(outputs[i], g.outputs[i].name, dir / ("output_" + std::to_string(i) + (npy ? ".npy" : ".pb")));
}

std::string summarizeOutputs(const Graph& g, const std::vector<Tensor>& outputs) {
    std::ostringstream s;
    for (size_t i = 0; i < outputs.size(); ++i) {
        const Tensor& t = outputs[i];
        double mn = INFINITY, mx = -INFINITY, sum = 0;
        for (int64_t k = 0; k < t.numel(); ++k) {
            double v = t.scalarAt(k);
            mn = std::min(mn, v);
            mx = std::max(mx, v);
            sum += v;
        }
        s << g.outputs[i].name << ": " << t.summary();
        if (t.numel() > 0) {
            s << "  min " << mn << "  max " << mx << "  mean " << sum / static_cast<double>(t.numel()) << "  first [";
            for (int64_t k = 0; k < std::min<int64_t>(t.numel(), 5); ++k) s << (k ? ", " : "") << t.scalarAt(k);
            s << (t.numel() > 5 ? ", ...]" : "]");
        }
        s << "\n";
    }
    return s.str();
}

}  // namespace kiln::tools
