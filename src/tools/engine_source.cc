#include "tools/engine_source.h"

#include <iostream>
#include <sstream>

#include "backends/cpu/tactic_selection.h"
#include "backends/backend.h"
#include "onnx_import/importer.h"
#include "quant/calibration.h"

namespace kiln::tools {

std::pair<std::string, Dims> parseNamedShape(const std::string& spec, const std::string& flag) {
    auto colon = spec.rfind(':');
    check(colon != std::string::npos && colon > 0 && colon + 1 < spec.size(), flag + " '" + spec + "': expected NAME:DIMS such as input:1x3x224x224");
    Dims dims;
    std::stringstream ss(spec.substr(colon + 1));
    std::string part;
    while (std::getline(ss, part, 'x')) {
        check(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos && part.size() < 12,
              flag + " '" + spec + "': '" + spec.substr(colon + 1) + "' is not a shape like 1x3x224x224");
        dims.push_back(std::stoll(part));
    }
    return {spec.substr(0, colon), dims};
}

ShapeProfile profileFromFlags(const std::vector<std::string>& min_shapes, const std::vector<std::string>& opt_shapes, const std::vector<std::string>& max_shapes) {
    ShapeProfile profile;
    for (const auto& spec : max_shapes) {
        auto [name, dims] = parseNamedShape(spec, "--maxShapes");
        profile[name] = ShapeRange{dims, dims, dims};
    }
    for (const auto& spec : min_shapes) {
        auto [name, dims] = parseNamedShape(spec, "--minShapes");
        check(profile.count(name), "--minShapes " + name + " needs a matching --maxShapes");
        profile[name].min = dims;
        if (profile[name].opt == profile[name].max) profile[name].opt = dims;
    }
    for (const auto& spec : opt_shapes) {
        auto [name, dims] = parseNamedShape(spec, "--optShapes");
        check(profile.count(name), "--optShapes " + name + " needs a matching --maxShapes");
        profile[name].opt = dims;
    }
    return profile;
}

std::shared_ptr<const CalibrationTable> calibrationFor(const std::string& calib, const std::string& model, const std::string& hash) {
    auto table = std::make_shared<CalibrationTable>(readCalibration(calib));
    check(table->model_hash == hash, "--calib " + calib + " was measured on another model (hash " + table->model_hash + ", " + model + " has " + hash + ")");
    return table;
}

void addBuildOptions(CLI::App& cmd, BuildOptions& o) {
    cmd.add_option("--route", o.route, "Build route: name=value pairs separated by ';' (others keep defaults)");
    cmd.add_option("--target", o.target, "Target: " + backendNamesText() + " (an engine file runs on the target it was built for)")->check(CLI::IsMember(backendNames()));
    cmd.add_flag("--fp16", o.fp16, "CPU: compute matmul/conv/attention in f16 (precision.{matmul,conv,attention}=f16); CUDA: precision.activations=f16");
    cmd.add_flag("--bf16", o.bf16, "As --fp16, with bf16");
    cmd.add_option("--minShapes,--min-shapes", o.min_shapes, "Shape profile minimum, NAME:DIMS (repeatable)");
    cmd.add_option("--optShapes,--opt-shapes", o.opt_shapes, "Shape profile optimum, NAME:DIMS");
    cmd.add_option("--maxShapes,--max-shapes", o.max_shapes, "Shape profile maximum, NAME:DIMS");
    cmd.add_option("--timing-cache", o.timing_cache, "File of tactic timings: reused by later builds instead of re-timing identical nodes");
    cmd.add_flag("--int8", o.int8, "CPU: quantize convs and matmuls to int8 with the ranges of --calib (precision.conv=precision.matmul=int8; QDQ models need no flag: they run int8 as they are)");
    cmd.add_option("--calib", o.calib, "Calibration file from `kiln calibrate` (with --int8 or a precision.*=int8 route)");
}

BuildRoute routeFromOptions(const BuildOptions& o) {
    check(!(o.fp16 && o.bf16), "--fp16 and --bf16 exclude each other");
    check(!o.int8 || (!o.fp16 && !o.bf16), "--int8 excludes --fp16 and --bf16");
    BuildRoute route = BuildRoute::defaults(Builder::space());
    const char* precision = o.int8 ? "int8" : (o.fp16 ? "f16" : (o.bf16 ? "bf16" : nullptr));
    if (precision) {
        const auto params = backendFor(o.target).precisionParameters(precision);
        check(!params.empty(), [&] { return std::string("--") + precision + ": the " + o.target + " target has no " + precision + " kernels yet; build it for --target cpu"; });
        for (const auto& p : params) route.set(p, precision, Builder::space());
    }
    BuildRoute given = BuildRoute::parse(o.route, Builder::space());
    for (const auto& [k, v] : given.values())
        if (v != Builder::space().get(k).default_value) route.set(k, v, Builder::space());
    return route;
}

namespace {

// The calibration ranges of --calib, which must have been measured on this very model file
// and are used by a route with int8 precisions (--int8 sets them).
std::shared_ptr<const CalibrationTable> calibrationIfAsked(const BuildRoute& route, const std::string& model, const std::string& hash, const BuildOptions& o) {
    const bool int8 = int8Requested(route);
    if (o.calib.empty()) {
        check(!o.int8, "--int8 needs --calib FILE (make one with `kiln calibrate MODEL --data DIR -o FILE`)");
        return nullptr;
    }
    check(int8, "--calib applies only with --int8 or a route with precision.conv/precision.matmul=int8");
    return calibrationFor(o.calib, model, hash);
}

// `exact`: inputs whose profile is exactly this shape unless a --*Shapes flag names them.
Engine buildFromGraph(Graph graph, const std::string& model, const BuildOptions& o, const std::map<std::string, Dims>& exact) {
    const std::string hash = modelFileHash(model);
    const BuildRoute route = routeFromOptions(o);
    Builder builder(std::move(graph), hash, o.target);
    builder.setCalibration(calibrationIfAsked(route, model, hash, o));
    builder.setBuildRoute(route);
    for (const auto& w : builder.warnings()) std::cerr << "kiln: warning: " << w << "\n";
    ShapeProfile profile = profileFromFlags(o.min_shapes, o.opt_shapes, o.max_shapes);
    for (const auto& [name, dims] : exact)
        if (!profile.count(name)) profile[name] = ShapeRange{dims, dims, dims};
    builder.setShapeProfile(profile);
    TimingCache cache(o.timing_cache);
    builder.setTimingCache(&cache);
    Engine engine = builder.build();
    cache.save();
    return engine;
}

}  // namespace

Engine buildEngine(const std::string& model, const BuildOptions& o) { return buildFromGraph(importOnnxModel(model), model, o, {}); }

Engine engineWithInputs(const std::string& model, const BuildOptions& o, InputOptions& in, TensorMap* inputs) {
    Engine engine;
    inputs->clear();
    if (isEngineFile(model)) {
        check(o.route.empty() && !o.fp16 && !o.bf16 && !o.int8, model + " is an engine: build options (--route, --fp16, --bf16, --int8) apply only to .onnx models");
        engine = readEngine(model);
        const std::string here = targetSignature(targetKind(engine.target));
        check(engine.target == here, model + ": engine was built for target '" + engine.target + "' but this machine is '" + here + "'; rebuild it here");
    } else {
        Graph graph = importOnnxModel(model);
        try {
            *inputs = loadInputs(graph, in);
        } catch (const Error&) {
            inputs->clear();  // made again below, with the built engine's profile shapes (or reported there)
        }
        std::map<std::string, Dims> exact;
        for (const auto& [name, t] : *inputs)
            if (const ValueInfo* vi = graph.findValueInfo(name); vi && !vi->shape.fullyKnown()) exact[name] = t.dims();
        engine = buildFromGraph(std::move(graph), model, o, exact);
    }
    if (inputs->empty()) {
        addProfileShapes(engine, in);
        *inputs = loadInputs(engine.graph, in);
    }
    return engine;
}

}  // namespace kiln::tools
