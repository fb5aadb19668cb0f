#include "onnx_import/importer.h"

#include <onnx/onnx_pb.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ir/attribute_checks.h"
#include "onnx_import/tensor_proto.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

struct ImportContext {
    fs::path base_dir;
    int64_t opset = 0;
    std::vector<std::string> unsupported;  // every unsupported node, reported together
};

Shape shapeFromProto(const onnx::TypeProto_Tensor& tt) {
    Shape s;
    if (!tt.has_shape()) return s;
    s.rank_known = true;
    for (const auto& d : tt.shape().dim()) {
        Dim dim;
        if (d.has_dim_value()) dim.size = d.dim_value();
        else if (d.has_dim_param()) dim.symbol = d.dim_param();
        s.dims.push_back(dim);
    }
    return s;
}

ValueInfo valueFromProto(const onnx::ValueInfoProto& v, bool required) {
    ValueInfo vi;
    vi.name = v.name();
    if (v.type().has_tensor_type()) {
        const auto& tt = v.type().tensor_type();
        if (tt.elem_type() != 0) {
            if (required) vi.dtype = dtypeFromOnnx(tt.elem_type(), "value '" + v.name() + "'");
            else {
                try {
                    vi.dtype = dtypeFromOnnx(tt.elem_type(), v.name());
                } catch (const Error&) {
                }
            }
        }
        vi.shape = shapeFromProto(tt);
    } else if (required && v.type().value_case() != onnx::TypeProto::VALUE_NOT_SET) {
        throw Error("value '" + v.name() + "': only tensor inputs and outputs are supported (sequence, map and optional types are not)");
    }
    return vi;
}

Graph convertGraph(const onnx::GraphProto& gp, ImportContext& ctx);

Attribute convertAttribute(const onnx::AttributeProto& a, const std::string& where, ImportContext& ctx) {
    switch (a.type()) {
        case onnx::AttributeProto::INT: return a.i();
        case onnx::AttributeProto::FLOAT: return a.f();
        case onnx::AttributeProto::STRING: return a.s();
        case onnx::AttributeProto::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
        case onnx::AttributeProto::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
        case onnx::AttributeProto::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
        case onnx::AttributeProto::TENSOR: return tensorFromProto(a.t(), ctx.base_dir);
        case onnx::AttributeProto::GRAPH: return std::make_shared<Graph>(convertGraph(a.g(), ctx));
        default: break;
    }
    throw Error(where + ": attribute '" + a.name() + "' has an unsupported kind (" + onnx::AttributeProto::AttributeType_Name(a.type()) + ")");
}

// Per-op conversions from ONNX conventions to IR ones: element types named by ONNX
// TensorProto numbers become Kiln dtype names.
void convertNodeAttributes(Node& n) {
    static const std::map<std::string, std::string> dtype_attrs = {{"Cast", "to"},
                                                                        {"EyeLike", "dtype"},
                                                                        {"QuantizeLinear", "output_dtype"},
                                                                        {"HannWindow", "output_datatype"},
                                                                        {"HammingWindow", "output_datatype"},
                                                                        {"BlackmanWindow", "output_datatype"},
                                                                        {"MelWeightMatrix", "output_datatype"}};
    auto it = dtype_attrs.find(n.op_type);
    if (it == dtype_attrs.end() || !n.attrs.has(it->second)) return;
    DType t = dtypeFromOnnx(static_cast<int>(n.attrs.getInt(it->second)), n.describe() + " attribute '" + it->second + "'");
    n.attrs.set(it->second, std::string(dtypeName(t)));
}

// Checks a node's input and output counts against its ONNX schema (required inputs must be
// named), so that no later stage sees a node with missing operands.
void checkArity(const Node& n, int64_t opset) {
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n.op_type, static_cast<int>(std::min<int64_t>(opset, 17)), "");
    if (!schema) return;
    const int ins = static_cast<int>(n.inputs.size()), outs = static_cast<int>(n.outputs.size());
    // The schemas stop at opset 17 (libonnx 1.12); opset 18 moved the Reduce ops' axes (all
    // but ReduceSum, moved in 13) to an optional second input, which the kernels read.
    // Pad gained its optional axes input (a fourth) in opset 18 too.
    const bool axes_input = opset >= 18 && n.op_type.rfind("Reduce", 0) == 0 && n.op_type != "ReduceSum";
    const bool pad_axes = opset >= 18 && n.op_type == "Pad";
    const int max_ins = axes_input ? std::max(schema->max_input(), 2) : pad_axes ? std::max(schema->max_input(), 4) : schema->max_input();
    check(ins >= schema->min_input() && ins <= max_ins, n.describe() + ": has " + std::to_string(ins) + " inputs, the operator takes " +
                                                            std::to_string(schema->min_input()) + " to " + std::to_string(max_ins));
    check(outs >= schema->min_output() && outs <= schema->max_output(), n.describe() + ": has " + std::to_string(outs) + " outputs, the operator produces " +
                                                                            std::to_string(schema->min_output()) + " to " + std::to_string(schema->max_output()));
    const auto& formal = schema->inputs();
    for (int i = 0; i < ins && !formal.empty(); ++i) {
        const auto& param = formal[static_cast<size_t>(std::min<int>(i, static_cast<int>(formal.size()) - 1))];
        check(!n.inputs[i].empty() || param.GetOption() == onnx::OpSchema::Optional, n.describe() + ": required input " + std::to_string(i) + " (" + param.GetName() + ") is empty");
    }
}

Graph convertGraph(const onnx::GraphProto& gp, ImportContext& ctx) {
    Graph g;
    g.name = gp.name();
    g.opset = ctx.opset;
    for (const auto& init : gp.initializer()) {
        check(!init.name().empty(), "graph '" + gp.name() + "': an initializer has no name");
        g.initializers[init.name()] = tensorFromProto(init, ctx.base_dir);
    }
    check(gp.sparse_initializer_size() == 0, "graph '" + gp.name() + "': sparse initializers are not supported");
    for (const auto& v : gp.input()) g.inputs.push_back(valueFromProto(v, !g.initializers.count(v.name())));
    for (const auto& v : gp.output()) g.outputs.push_back(valueFromProto(v, true));
    for (const auto& v : gp.value_info()) g.value_info[v.name()] = valueFromProto(v, false);
    for (int i = 0; i < gp.node_size(); ++i) {
        const auto& np = gp.node(i);
        Node n;
        n.name = np.name().empty() ? np.op_type() + "_" + std::to_string(i) : np.name();
        n.op_type = np.op_type();
        n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
        n.inputs.assign(np.input().begin(), np.input().end());
        n.outputs.assign(np.output().begin(), np.output().end());
        if (!isSupportedOp(n.domain, n.op_type, ctx.opset)) {
            ctx.unsupported.push_back(n.describe() + (n.domain.empty() ? "" : " in domain '" + n.domain + "'"));
            continue;
        }
        for (const auto& a : np.attribute()) n.attrs.set(a.name(), convertAttribute(a, n.describe(), ctx));
        convertNodeAttributes(n);
        checkArity(n, ctx.opset);
        checkNodeAttributes(n);  // before ONNX's shape inference, which divides by strides
        g.nodes.push_back(std::move(n));
    }
    return g;
}

int64_t defaultDomainOpset(const onnx::ModelProto& model, const std::string& file, int64_t max_opset) {
    int64_t opset = -1;
    for (const auto& imp : model.opset_import())
        if (imp.domain().empty() || imp.domain() == "ai.onnx") opset = imp.version();
    if (opset < 0 && model.ir_version() < 3) opset = 1;  // IR v1/v2 had no opset_import
    check(opset >= 0, file + ": model imports no default-domain opset");
    check(opset >= kMinOpset && opset <= max_opset,
          file + ": opset " + std::to_string(opset) + " is not supported (Kiln supports opsets " + std::to_string(kMinOpset) + " to " + std::to_string(max_opset) + ")");
    return opset;
}

// Value infos of every subgraph (If branches, Loop and Scan bodies), nested ones too, and
// their outputs: ONNX names are unique across scopes, so one flat list holds them.
void collectSubgraphValueInfos(const onnx::GraphProto& g, onnx::GraphProto& into) {
    for (const auto& n : g.node())
        for (const auto& a : n.attribute()) {
            if (a.type() != onnx::AttributeProto::GRAPH) continue;
            for (const auto& v : a.g().value_info()) *into.add_value_info() = v;
            for (const auto& v : a.g().output()) *into.add_value_info() = v;
            collectSubgraphValueInfos(a.g(), into);
        }
}

// Gives each subgraph the inferred types of the values its nodes produce.
void annotateSubgraphs(Graph& g, const std::map<std::string, ValueInfo>& inferred) {
    for (auto& node : g.nodes)
        for (const auto& [name, attr] : node.attrs.all()) {
            const auto* sub = std::get_if<std::shared_ptr<Graph>>(&attr);
            if (!sub || !*sub) continue;
            Graph& body = **sub;
            for (const auto& n : body.nodes)
                for (const auto& o : n.outputs)
                    if (auto it = inferred.find(o); it != inferred.end() && !body.value_info.count(o)) body.value_info[o] = it->second;
            for (auto& o : body.outputs)
                if (auto it = inferred.find(o.name); it != inferred.end() && !o.shape.rank_known) o.shape = it->second.shape;
            annotateSubgraphs(body, inferred);
        }
}

// Runs ONNX shape inference and records the result as value_info, in subgraphs too.
// Failures are not fatal: the runtime computes shapes itself; inference only annotates.
//
// ONNX's inference code can crash on malformed models (division by a zero stride, reads
// past short attribute lists), so it runs in a forked child that sends back the inferred
// value infos; if the child dies, the graph simply has no inferred shapes.
void inferShapes(onnx::ModelProto model, Graph& g) {
    int fds[2];
    if (pipe(fds) != 0) return;
    const pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        std::string out;
        try {
            onnx::ShapeInferenceOptions options{false, 0, true};
            onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), options);
            onnx::GraphProto inferred;  // only what the parent needs
            *inferred.mutable_value_info() = model.graph().value_info();
            *inferred.mutable_output() = model.graph().output();
            collectSubgraphValueInfos(model.graph(), inferred);
            out = inferred.SerializeAsString();
        } catch (...) {
        }
        for (size_t done = 0; done < out.size();) {
            ssize_t n = write(fds[1], out.data() + done, out.size() - done);
            if (n <= 0) break;
            done += static_cast<size_t>(n);
        }
        _exit(0);
    }
    close(fds[1]);
    std::string bytes;
    char buf[65536];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) bytes.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    onnx::GraphProto inferred;
    if (!WIFEXITED(status) || bytes.empty() || !inferred.ParseFromString(bytes)) return;
    model.mutable_graph()->mutable_value_info()->Swap(inferred.mutable_value_info());
    model.mutable_graph()->mutable_output()->Swap(inferred.mutable_output());
    std::map<std::string, ValueInfo> all;
    for (const auto& v : model.graph().value_info()) {
        ValueInfo vi = valueFromProto(v, false);
        if (vi.dtype != DType::Undefined) all[vi.name] = vi;
    }
    annotateSubgraphs(g, all);
    const std::set<std::string> outer = definedNames(g);
    for (auto& [name, vi] : all)
        if (outer.count(name)) g.value_info[name] = std::move(vi);
    for (int i = 0; i < model.graph().output_size() && i < static_cast<int>(g.outputs.size()); ++i) {
        ValueInfo vi = valueFromProto(model.graph().output(i), false);
        if (!g.outputs[i].shape.rank_known) g.outputs[i].shape = vi.shape;
    }
}

}  // namespace

Graph importOnnxModel(const fs::path& path, int64_t max_opset) {
    const std::string file = path.string();
    check(fs::exists(path), file + ": no such file");
    check(fs::is_regular_file(path), file + ": not a regular file");
    std::ifstream in(path, std::ios::binary);
    check(in.good(), file + ": cannot open file");
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string bytes = buffer.str();
    check(!bytes.empty(), file + ": file is empty");
    onnx::ModelProto model;
    check(model.ParseFromString(bytes), file + ": not a valid ONNX model (protobuf parse failed; the file is corrupt or truncated)");
    check(model.has_graph(), file + ": model has no graph");

    ImportContext ctx;
    ctx.base_dir = path.parent_path();
    ctx.opset = defaultDomainOpset(model, file, max_opset);
    Graph g;
    try {
        g = convertGraph(model.graph(), ctx);
    } catch (const Error& e) {
        throw Error(file + ": " + e.what());
    }
    if (!ctx.unsupported.empty()) {
        std::string msg = file + ": " + std::to_string(ctx.unsupported.size()) + " unsupported node(s) at opset " + std::to_string(ctx.opset) + ": ";
        for (size_t i = 0; i < ctx.unsupported.size() && i < 10; ++i) msg += (i ? ", " : "") + ctx.unsupported[i];
        if (ctx.unsupported.size() > 10) msg += ", ...";
        throw Error(msg);
    }
    // Weights are not needed for inference of types; drop them from the copy to save memory.
    onnx::ModelProto typed = model;
    typed.mutable_graph()->clear_initializer();
    for (const auto& init : model.graph().initializer()) {
        bool listed = false;
        for (const auto& v : model.graph().input()) listed |= v.name() == init.name();
        if (listed) continue;
        auto* vi = typed.mutable_graph()->add_input();
        vi->set_name(init.name());
        auto* tt = vi->mutable_type()->mutable_tensor_type();
        tt->set_elem_type(init.data_type());
        auto* shape = tt->mutable_shape();
        for (int64_t d : init.dims()) shape->add_dim()->set_dim_value(d);
    }
    inferShapes(std::move(typed), g);
    try {
        liftCaptures(g);
        topologicalSort(g);
        verifyGraph(g);
    } catch (const Error& e) {
        throw Error(file + ": " + e.what());
    }
    return g;
}

}  // namespace kiln
