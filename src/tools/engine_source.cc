#include "tools/engine_source.h"

#include <sstream>

#include "engine/tactic_selection.h"
#include "onnx_import/importer.h"
#include "tools/model_io.h"

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

void addBuildOptions(CLI::App& cmd, BuildOptions& o) {
    cmd.add_option("--route", o.route, "Build route: name=value pairs separated by ';' (others keep defaults)");
    cmd.add_option("--target", o.target, "Target: cpu or cuda (an engine file runs on the target it was built for)")->check(CLI::IsMember({"cpu", "cuda"}));
    cmd.add_flag("--fp16", o.fp16, "CPU: compute matmul/conv/attention in f16 (precision.{matmul,conv,attention}=f16); CUDA: precision.activations=f16");
    cmd.add_flag("--bf16", o.bf16, "As --fp16, with bf16");
    cmd.add_option("--minShapes,--min-shapes", o.min_shapes, "Shape profile minimum, NAME:DIMS (repeatable)");
    cmd.add_option("--optShapes,--opt-shapes", o.opt_shapes, "Shape profile optimum, NAME:DIMS");
    cmd.add_option("--maxShapes,--max-shapes", o.max_shapes, "Shape profile maximum, NAME:DIMS");
    cmd.add_option("--timing-cache", o.timing_cache, "File of tactic timings: reused by later builds instead of re-timing identical nodes");
}

BuildRoute routeFromOptions(const BuildOptions& o) {
    check(!(o.fp16 && o.bf16), "--fp16 and --bf16 exclude each other");
    BuildRoute route = BuildRoute::defaults(Builder::space());
    const char* low = o.fp16 ? "f16" : (o.bf16 ? "bf16" : nullptr);
    if (low && o.target == "cuda") route.set("precision.activations", low, Builder::space());
    else if (low)
        for (const char* p : {"precision.matmul", "precision.conv", "precision.attention"}) route.set(p, low, Builder::space());
    BuildRoute given = BuildRoute::parse(o.route, Builder::space());
    for (const auto& [k, v] : given.values())
        if (v != Builder::space().get(k).default_value) route.set(k, v, Builder::space());
    return route;
}

Engine buildEngine(const std::string& model, const BuildOptions& o) {
    Graph graph = importOnnxModel(model);
    std::map<std::string, Dims> run_shapes;  // symbolic-shape inputs of the run this build serves
    if (o.run_inputs) {
        try {
            for (const auto& [name, t] : loadInputs(graph, *o.run_inputs))
                if (const ValueInfo* vi = graph.findValueInfo(name); vi && !vi->shape.fullyKnown()) run_shapes[name] = t.dims();
        } catch (const Error&) {
            // inputs that cannot be made yet (a random one without --shapes) are reported when the engine runs
        }
    }
    Builder builder(std::move(graph), modelFileHash(model), o.target);
    builder.setBuildRoute(routeFromOptions(o));
    ShapeProfile profile;
    for (const auto& spec : o.max_shapes) {
        auto [name, dims] = parseNamedShape(spec, "--maxShapes");
        profile[name] = ShapeRange{dims, dims, dims};
    }
    for (const auto& spec : o.min_shapes) {
        auto [name, dims] = parseNamedShape(spec, "--minShapes");
        check(profile.count(name), "--minShapes " + name + " needs a matching --maxShapes");
        profile[name].min = dims;
        if (profile[name].opt == profile[name].max) profile[name].opt = dims;
    }
    for (const auto& spec : o.opt_shapes) {
        auto [name, dims] = parseNamedShape(spec, "--optShapes");
        check(profile.count(name), "--optShapes " + name + " needs a matching --maxShapes");
        profile[name].opt = dims;
    }
    for (const auto& [name, dims] : run_shapes)
        if (!profile.count(name)) profile[name] = ShapeRange{dims, dims, dims};
    builder.setShapeProfile(profile);
    TimingCache cache(o.timing_cache);
    builder.setTimingCache(&cache);
    Engine engine = builder.build();
    cache.save();
    return engine;
}

Engine loadOrBuildEngine(const std::string& model, const BuildOptions& o) {
    if (isEngineFile(model)) {
        check(o.route.empty() && !o.fp16 && !o.bf16, model + " is an engine: build options (--route, --fp16, --bf16) apply only to .onnx models");
        Engine e = readEngine(model);
        const std::string here = targetSignature(targetKind(e.target));
        check(e.target == here, model + ": engine was built for target '" + e.target + "' but this machine is '" + here + "'; rebuild it here");
        return e;
    }
    return buildEngine(model, o);
}

}  // namespace kiln::tools
