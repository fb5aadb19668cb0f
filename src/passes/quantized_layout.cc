// Channels-last int8 convolutions (layout.qconv=nhwc, CPU): oneDNN's int8 convs read and write
// NHWC, and reordering each one's NCHW input and output took as long as the convs themselves
// (PP-OCRv4's recognizer: 122 ms of reorders against 115 ms of convs). Each 2-D QLinearConv
// becomes a kiln QLinearConvNhwc between a Transpose to NHWC and one back; the transposes back
// then sink through the layout-blind nodes after them (per-tensor Q/DQ, activations, binary
// ops on scalars or on values transposed alike), so that between two convs they meet the
// next conv's transpose and cancel (transpose_cancel). What reads a conv's result in a
// layout-aware way (a pool, a reshape, a graph output) still gets it in NCHW.
#include <algorithm>
#include <set>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

const std::vector<int64_t> kToNhwc = {0, 2, 3, 1}, kToNchw = {0, 3, 1, 2};

// Names unique in the graph, made without rescanning it for each one.
class Names {
public:
    explicit Names(const Graph& g) {
        used_ = definedNames(g);
        for (const auto& n : g.nodes) used_.insert(n.name);
        for (const auto& [name, vi] : g.value_info) used_.insert(name);
    }
    std::string fresh(const std::string& base) {
        std::string name = base;
        for (int i = 1; used_.count(name); ++i) name = base + "_" + std::to_string(i);
        used_.insert(name);
        return name;
    }

private:
    std::set<std::string> used_;
};

// `nhwc` gets the type of `nchw` with its shape in channels-last order (where known), so that
// later passes (elementwise chains) see the shapes they need.
void describeChannelsLast(Graph& g, const std::string& nchw, const std::string& nhwc) {
    const ValueInfo* vi = g.findValueInfo(nchw);
    if (!vi) return;
    ValueInfo t{nhwc, vi->dtype, vi->shape};
    if (t.shape.rank_known && t.shape.dims.size() == 4) t.shape.dims = {vi->shape.dims[0], vi->shape.dims[2], vi->shape.dims[3], vi->shape.dims[1]};
    else t.shape = Shape::unknown();
    g.value_info[nhwc] = t;
}

bool isRank4(const Graph& g, const std::string& v) {
    const ValueInfo* vi = g.findValueInfo(v);
    return vi && vi->shape.rank_known && vi->shape.dims.size() == 4;
}

void toNhwcConvs(Graph& g, Names& names) {
    std::vector<Node> added;
    for (auto& n : g.nodes) {
        if (n.op_type != "QLinearConv" || !n.domain.empty() || !isRank4(g, n.inputs[0]) || n.outputs.size() != 1) continue;
        const std::string x = names.fresh(n.inputs[0] + "_nhwc"), y = names.fresh(n.outputs[0] + "_nhwc");
        Node in{names.fresh(n.name + "_to_nhwc"), "Transpose", "", {n.inputs[0]}, {x}, {}};
        in.attrs.set("perm", kToNhwc);
        Node out{names.fresh(n.name + "_to_nchw"), "Transpose", "", {y}, {n.outputs[0]}, {}};
        out.attrs.set("perm", kToNchw);
        describeChannelsLast(g, n.inputs[0], x);
        describeChannelsLast(g, n.outputs[0], y);
        n.inputs[0] = x, n.outputs[0] = y;
        n.op_type = "QLinearConvNhwc", n.domain = "kiln";
        added.push_back(std::move(in));
        added.push_back(std::move(out));
    }
    for (auto& n : added) g.nodes.push_back(std::move(n));
}

// Nodes a transpose moves past: the result is the same elementwise whatever the layout.
bool layoutBlind(const Graph& g, const Node& n) {
    static const std::set<std::string> kUnary = {"Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Gelu", "Erf", "Abs", "Neg",
                                                 "Exp", "Sqrt", "Identity", "Softplus"};
    static const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div", "Max", "Min"};
    if (!n.domain.empty() || n.outputs.size() != 1) return false;
    if (kUnary.count(n.op_type)) return true;
    if (kBinary.count(n.op_type)) return true;  // the inputs are checked by the caller
    if (n.op_type == "Clip") return true;  // min / max are scalars by the spec
    if (n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear") {
        const Tensor* s = n.inputs.size() > 1 ? constantOf(g, n.inputs[1]) : nullptr;
        return s && s->numel() == 1 && n.attrs.getInt("block_size", 0) == 0;
    }
    return false;
}

// Which inputs of a layout-blind node carry the tensor (the others are parameters).
size_t dataInputs(const Node& n) {
    if (n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear" || n.op_type == "Clip") return 1;
    return n.inputs.size();
}

// Moves NHWC -> NCHW transposes below the layout-blind nodes that read them, one node at a
// time: the node reads the transposes' inputs and a new transpose follows it. A transpose
// that other nodes still read stays for them; one no longer read is left to dead code
// elimination.
bool sinkOnce(Graph& g, Names& names) {
    GraphIndex index(g);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        Node& n = g.nodes[i];
        if (!layoutBlind(g, n) || index.isGraphOutput(n.outputs[0])) continue;
        std::vector<int> transposes(dataInputs(n), -1);
        bool ok = true, any = false;
        for (size_t k = 0; k < transposes.size() && ok; ++k) {
            const std::string& v = n.inputs[k];
            const int p = v.empty() ? -1 : index.producer(v);
            if (p >= 0 && g.nodes[p].op_type == "Transpose" && g.nodes[p].attrs.getInts("perm") == kToNchw) {
                transposes[k] = p;
                any = true;
            } else {
                const Tensor* c = v.empty() ? nullptr : constantOf(g, v);
                ok = c && c->numel() == 1;  // a scalar broadcasts the same in either layout
            }
        }
        if (!ok || !any) continue;
        for (size_t k = 0; k < transposes.size(); ++k)
            if (transposes[k] >= 0) n.inputs[k] = g.nodes[transposes[k]].inputs[0];
        const std::string result = n.outputs[0], moved = names.fresh(result + "_nhwc");
        describeChannelsLast(g, result, moved);
        n.outputs[0] = moved;
        Node back{names.fresh(n.name + "_to_nchw"), "Transpose", "", {moved}, {result}, {}};
        back.attrs.set("perm", kToNchw);
        // Transposes no one reads any more go now: a dead reader would keep the values
        // between the nodes from looking single-use to the fusions after this pass.
        std::vector<bool> erase(g.nodes.size(), false);
        for (int p : transposes) {
            if (p < 0 || index.isGraphOutput(g.nodes[p].outputs[0])) continue;
            const std::string& v = g.nodes[p].outputs[0];
            erase[p] = std::none_of(g.nodes.begin(), g.nodes.end(), [&](const Node& r) { return std::find(r.inputs.begin(), r.inputs.end(), v) != r.inputs.end(); });
        }
        g.nodes.push_back(std::move(back));
        erase.push_back(false);
        eraseNodes(g, erase);
        return true;
    }
    return false;
}

// A transpose to NHWC of a transpose to NCHW: its readers take the NHWC value itself.
void cancelPairs(Graph& g) {
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (n.op_type != "Transpose" || n.attrs.getInts("perm") != kToNhwc || index.isGraphOutput(n.outputs[0])) continue;
        const int p = index.producer(n.inputs[0]);
        if (p < 0 || g.nodes[p].op_type != "Transpose" || g.nodes[p].attrs.getInts("perm") != kToNchw) continue;
        replaceUses(g, n.outputs[0], g.nodes[p].inputs[0]);
        erase[i] = true;
    }
    eraseNodes(g, erase);
}

void assignQuantizedLayout(Graph& g, const RouteValues& route) {
    if (routeValue(route, "layout.qconv") != "nhwc" || passTarget(route) != "cpu") return;
    Names names(g);
    toNhwcConvs(g, names);
    topologicalSort(g);
    while (sinkOnce(g, names)) topologicalSort(g);
    cancelPairs(g);
}

}  // namespace

Pass quantizedLayoutPass() {
    return {"quantized_layout",
            {{"layout.qconv", {"nhwc", "nchw"}, "nhwc", "quantized_layout",
              "Data layout of int8 convolutions (QLinearConv) on the CPU: nhwc keeps chains of them channels-last", false, {"QLinearConv"}}},
            assignQuantizedLayout};
}

}  // namespace kiln
