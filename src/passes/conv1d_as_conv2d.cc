// A 1-D convolution [N, C, L] is a 2-D one over [N, C, 1, L] with a 1 x K kernel: the same
// bytes, so every 2-D kernel (oneDNN's blocked convs, Winograd, cuDNN) and the layout and
// fusion passes serve speech and sequence models (wav2vec2's feature extractor, Whisper's
// stem) too. The rewrite keeps a run of such convs in 4-D: elementwise activations and
// BatchNormalization between them move to the 4-D value (they act per element or per
// channel, so the extra unit axis changes nothing), and a Squeeze restores the 3-D value
// only where something else reads it.
#include <map>
#include <set>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

// A default-domain Conv over rank-3 data with a constant rank-3 weight.
bool conv1dNode(const Graph& g, const Node& n) {
    if (n.op_type != "Conv" || !n.domain.empty() || n.inputs.size() < 2 || n.outputs.size() != 1) return false;
    const Tensor* w = constantOf(g, n.inputs[1]);
    if (!w || w->rank() != 3) return false;
    const auto k = n.attrs.getInts("kernel_shape");
    return k.empty() || k.size() == 1;
}

// Ops that give the same result on [N, C, 1, L] as on [N, C, L]: elementwise on their data
// input (any extra inputs scalar constants), or per channel on axis 1.
bool unitAxisAgnostic(const Graph& g, const Node& n) {
    static const std::set<std::string> unary = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Gelu", "Softplus", "Elu",
                                                "Selu", "Erf", "Exp", "Abs", "Neg", "Sqrt", "Clip", "Identity"};
    if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty()) return false;
    if (unary.count(n.op_type)) {
        double v;
        for (size_t k = 1; k < n.inputs.size(); ++k)
            if (!n.inputs[k].empty() && !scalarConstant(g, n.inputs[k], &v)) return false;
        return true;
    }
    return n.op_type == "BatchNormalization" && n.attrs.getInt("training_mode", 0) == 0 && n.outputs.size() == 1;
}

// Shape with a unit axis inserted at 2 (unknown stays unknown).
Shape withUnitAxis(const Shape& s) {
    if (!s.rank_known || s.dims.size() != 3) return Shape::unknown();
    Shape out = s;
    out.dims.insert(out.dims.begin() + 2, Dim{1, ""});
    return out;
}

struct Rewriter {
    Graph& g;
    std::map<std::string, std::string> twin;  // 3-D value -> its 4-D twin
    std::set<std::string> needs_3d;           // 3-D values read by nodes left as they were
    std::vector<Node> added;

    // The axes operand of an (Un)Squeeze at axis 2: an input from opset 13, else an attribute.
    void setAxes(Node& n) {
        if (g.opset >= 13) {
            const std::string axes = freshName(g, n.name + "_axes");
            g.initializers[axes] = Tensor::fromVector<int64_t>({1}, {2});
            n.inputs.push_back(axes);
        } else {
            n.attrs.set("axes", std::vector<int64_t>{2});
        }
    }
    std::string makeTwin(const std::string& value) {
        const std::string name = freshName(g, value + "_4d");
        const ValueInfo* vi = g.findValueInfo(value);
        g.value_info[name] = ValueInfo{name, vi ? vi->dtype : DType::Undefined, vi ? withUnitAxis(vi->shape) : Shape::unknown()};
        twin[value] = name;
        return name;
    }
    // The 4-D twin of a 3-D value, made by an Unsqueeze when it has none yet.
    std::string fourD(const std::string& value) {
        auto it = twin.find(value);
        if (it != twin.end()) return it->second;
        const std::string name = makeTwin(value);
        Node u{freshName(g, value + "_unsqueeze"), "Unsqueeze", "", {value}, {name}, {}};
        setAxes(u);
        added.push_back(u);
        return name;
    }
    void rewriteConv(Node& n) {
        Tensor& w = g.initializers.at(n.inputs[1]);
        const std::string w4 = freshName(g, n.inputs[1] + "_4d");
        g.initializers[w4] = w.reshaped({w.dims()[0], w.dims()[1], 1, w.dims()[2]});
        auto two = [](const std::vector<int64_t>& v, int64_t unit) { return std::vector<int64_t>{unit, v.empty() ? unit : v[0]}; };
        Attributes& a = n.attrs;
        a.set("kernel_shape", std::vector<int64_t>{1, w.dims()[2]});
        if (a.has("strides")) a.set("strides", two(a.getInts("strides"), 1));
        if (a.has("dilations")) a.set("dilations", two(a.getInts("dilations"), 1));
        if (a.has("pads")) {
            auto p = a.getInts("pads");
            p.resize(2, 0);
            a.set("pads", std::vector<int64_t>{0, p[0], 0, p[1]});
        }
        n.inputs[0] = fourD(n.inputs[0]);
        n.inputs[1] = w4;
        n.outputs[0] = makeTwin(n.outputs[0]);
    }
};

void conv1dToConv2d(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.conv1d_as_2d")) return;
    bool any = false;
    for (const Node& n : g.nodes) any |= conv1dNode(g, n);
    if (!any) return;
    Rewriter r{g, {}, {}, {}};
    for (Node& n : g.nodes) {
        if (conv1dNode(g, n)) {
            r.rewriteConv(n);
            continue;
        }
        if (unitAxisAgnostic(g, n) && r.twin.count(n.inputs[0])) {
            n.inputs[0] = r.twin.at(n.inputs[0]);
            n.outputs[0] = r.makeTwin(n.outputs[0]);
            continue;
        }
        for (const auto& in : n.inputs)
            if (r.twin.count(in)) r.needs_3d.insert(in);
    }
    for (const auto& out : g.outputs)
        if (r.twin.count(out.name)) r.needs_3d.insert(out.name);
    for (const auto& value : r.needs_3d) {
        Node s{freshName(g, value + "_squeeze"), "Squeeze", "", {r.twin.at(value)}, {value}, {}};
        r.setAxes(s);
        r.added.push_back(s);
    }
    g.nodes.insert(g.nodes.end(), r.added.begin(), r.added.end());  // the pipeline sorts the graph after each pass
}

}  // namespace

Pass conv1dAsConv2dPass() {
    return {"conv1d_as_conv2d",
            {{"fusion.conv1d_as_2d", {"on", "off"}, "on", "conv1d_as_conv2d", "Run 1-D convolutions as 2-D ones over a unit axis (the 2-D kernels and fusions)"}},
            conv1dToConv2d};
}

}  // namespace kiln
