// Precision assignment per op class: nodes of a class set to f16 / bf16 compute on inputs
// converted to that type (weights converted once at build time, activations by Cast
// nodes) and hand f32 results back through a Cast.
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

struct OpClass {
    const char* parameter;
    std::vector<std::string> ops;
};

const std::vector<OpClass>& opClasses() {
    static const std::vector<OpClass> classes = {
        {"precision.matmul", {"MatMul", "Gemm", "FusedMatMul"}},
        {"precision.conv", {"Conv", "FusedConv", "ConvTranspose"}},
        {"precision.attention", {"Attention"}},
        {"precision.norm", {"LayerNormalization", "BatchNormalization", "InstanceNormalization"}},
        {"precision.elementwise", {"ElementwiseChain", "Gelu"}},
    };
    return classes;
}

Tensor convertConstant(const Tensor& t, DType to) {
    Tensor out(to, t.dims());
    const float* src = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
        if (to == DType::F16) out.data<Half>()[i] = Half(src[i]);
        else out.data<BFloat16>()[i] = BFloat16(src[i]);
    }
    return out;
}

bool isF32(const Graph& g, const std::string& v) {
    if (const Tensor* t = constantOf(g, v)) return t->dtype() == DType::F32;
    const ValueInfo* vi = g.findValueInfo(v);
    return vi && vi->dtype == DType::F32;
}

void assignPrecision(Graph& g, const RouteValues& route) {
    std::vector<Node> added;
    std::map<std::string, std::string> converted;  // (value|type) -> converted value name
    for (auto& n : g.nodes) {
        std::string precision = "f32";
        for (const auto& cls : opClasses())
            for (const auto& op : cls.ops)
                if (n.op_type == op) precision = routeValue(route, cls.parameter);
        // int8 is not this pass's: the Builder quantized those products before the passes ran.
        if (precision == "f32" || precision == "int8" || n.outputs.empty() || !isF32(g, n.outputs[0])) continue;
        const DType to = parseDType(precision);
        bool all_f32 = true;
        for (const auto& in : n.inputs) all_f32 &= in.empty() || isF32(g, in) || constantOf(g, in);
        if (!all_f32) continue;
        // BatchNorm statistics and LayerNorm's scale stay in the op's input type by spec;
        // convert every float input alike so the types line up.
        for (auto& in : n.inputs) {
            if (in.empty() || !isF32(g, in)) continue;
            const std::string key = in + "|" + precision;
            auto it = converted.find(key);
            if (it == converted.end()) {
                std::string name = freshName(g, in + "_" + precision);
                if (const Tensor* t = constantOf(g, in)) {
                    g.initializers[name] = convertConstant(*t, to);
                } else {
                    Node cast{freshName(g, name + "_cast"), "Cast", "", {in}, {name}, {}};
                    cast.attrs.set("to", std::string(dtypeName(to)));
                    added.push_back(cast);
                    g.value_info[name] = ValueInfo{name, to, g.findValueInfo(in) ? g.findValueInfo(in)->shape : Shape{}};
                }
                it = converted.emplace(key, name).first;
            }
            in = it->second;
        }
        const std::string result = n.outputs[0];
        const std::string low = freshName(g, result + "_" + precision);
        Shape shape = g.findValueInfo(result) ? g.findValueInfo(result)->shape : Shape{};
        g.value_info[low] = ValueInfo{low, to, shape};
        n.outputs[0] = low;
        Node back{freshName(g, low + "_cast"), "Cast", "", {low}, {result}, {}};
        back.attrs.set("to", std::string("f32"));
        added.push_back(back);
    }
    for (auto& n : added) g.nodes.push_back(std::move(n));
}

}  // namespace

Pass precisionAssignmentPass() {
    Pass p{"precision_assignment", {}, assignPrecision};
    for (const auto& cls : opClasses()) {
        // Convs and MatMuls also run int8 on the CPU, from calibration ranges (Builder::setCalibration).
        const bool integer = std::string(cls.parameter) == "precision.conv" || std::string(cls.parameter) == "precision.matmul";
        std::vector<std::string> values = {"f32", "f16", "bf16"};
        if (integer) values.push_back("int8");
        p.parameters.push_back({cls.parameter, values, "f32", "precision_assignment",
                                std::string("Compute precision of ") + cls.ops.front() + "-class ops (f16/bf16 inputs, f32 results" +
                                    (integer ? "; int8: quantized with --calib ranges, CPU" : "") + ")"});
    }
    return p;
}

}  // namespace kiln
