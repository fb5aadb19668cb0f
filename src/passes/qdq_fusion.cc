// Folds the Q/DQ pairs of explicitly quantized (QDQ) models around Conv and MatMul into the
// integer operators ONNX defines for them, so that the product runs on 8-bit integers
// (CPU builds; constant symmetric int8 weights, the form ONNX Runtime's quantizer and
// TensorRT use):
//   Q(Conv(DQ(x), DQ(w), b))  ->  QLinearConv(x, .., w, .., y_scale, y_zp, b / (x_scale w_scale))
//   (also with a Relu before the Q, where the Q's zero point is its lowest value)
//   Q(MatMul(DQ(a), DQ(b)))   ->  QLinearMatMul(a, .., b, .., y_scale, y_zp)
// This is what ONNX Runtime and TensorRT do with such models. The two differ only in where
// the one rounding happens (the integer operators sum exactly and round once at the end; the
// float graph rounds each product's f32 sum at the Q), so outputs agree within one
// quantization step. Runs before constant folding, which would otherwise dequantize the
// weights into f32 constants. Scales and zero points must be constants, activations' per
// tensor, weights' per tensor or per output channel; anything else (a matmul of two
// activations among them) stays as it was, in floating point between its Q/DQ nodes.
// Data-movement ops between a DQ and a Q of the same parameters move onto the 8-bit tensor.
// fusion.qdq=off keeps every Q/DQ node.
#include <cmath>
#include <limits>
#include <set>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

bool zeroPointIsLowest(const Tensor& zp) { return zp.scalarAt(0) == (zp.dtype() == DType::U8 ? 0.0 : -128.0); }

// Q(Clip(y, 0, hi)) is Q(y) where Q's zero point is its lowest code (it clamps at 0) and its
// largest representable value is at most hi (it saturates there first): ReLU6 before a Q
// calibrated on its output.
bool clipIsSaturation(const Graph& g, const Node& clip, const Node& q) {
    double lo = clip.attrs.has("min") ? clip.attrs.getFloat("min", 0.f) : 0.0, hi = clip.attrs.has("max") ? clip.attrs.getFloat("max", 0.f) : 0.0;
    if (!clip.attrs.has("min") && !(clip.inputs.size() > 1 && scalarConstant(g, clip.inputs[1], &lo))) return false;
    if (!clip.attrs.has("max") && !(clip.inputs.size() > 2 && scalarConstant(g, clip.inputs[2], &hi))) return false;
    const Tensor& zp = *constantOf(g, q.inputs[2]);
    const double top = (zp.dtype() == DType::U8 ? 255.0 : 127.0) - zp.scalarAt(0);
    return lo == 0.0 && top * constantOf(g, q.inputs[1])->scalarAt(0) <= hi * (1 + 1e-6);
}

bool allZero(const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i)
        if (t.scalarAt(i) != 0.0) return false;
    return true;
}

// A DequantizeLinear whose scale and zero point are constants of the shapes asked for.
struct Dequantized {
    int node = -1;
    std::string q, scale, zero_point;  // its inputs
    const Tensor* scale_value = nullptr;
    const Tensor* zp_value = nullptr;
};

// `value` as the output of such a DequantizeLinear: scalar parameters, or (per_axis >= 0)
// one per index of that axis of its input (of rank `rank` where that is not a constant).
// Node -1 otherwise.
Dequantized dequantizedInput(const Graph& g, const GraphIndex& index, const std::string& value, int per_axis = -1, size_t rank = 0) {
    Dequantized d;
    const int p = index.producer(value);
    if (p < 0) return d;
    const Node& n = g.nodes[p];
    if (n.op_type != "DequantizeLinear" || !n.domain.empty() || n.inputs.size() != 3 || n.inputs[2].empty()) return d;
    if (n.attrs.getInt("block_size", 0) != 0) return d;
    const Tensor* s = constantOf(g, n.inputs[1]);
    const Tensor* z = constantOf(g, n.inputs[2]);
    if (!s || !z || s->dtype() != DType::F32 || !isEightBitInteger(z->dtype()) || s->numel() != z->numel()) return d;
    if (s->numel() != 1) {
        if (per_axis < 0 || s->rank() != 1) return d;
        if (const Tensor* c = constantOf(g, n.inputs[0])) rank = c->rank();
        int64_t axis = n.attrs.getInt("axis", 1);
        if (axis < 0) axis += static_cast<int64_t>(rank);
        if (axis != per_axis) return d;
    }
    for (int64_t i = 0; i < s->numel(); ++i)
        if (!(s->scalarAt(i) > 0.0) || !std::isfinite(s->scalarAt(i))) return d;
    d.node = p, d.q = n.inputs[0], d.scale = n.inputs[1], d.zero_point = n.inputs[2], d.scale_value = s, d.zp_value = z;
    return d;
}

// The QuantizeLinear that is the sole reader of `value`, with scalar constant parameters
// of an 8-bit type; -1 otherwise.
int soleQuantizer(const Graph& g, const GraphIndex& index, const std::string& value) {
    const int c = index.soleConsumer(value);
    if (c < 0) return -1;
    const Node& q = g.nodes[c];
    if (q.op_type != "QuantizeLinear" || !q.domain.empty() || q.inputs.size() != 3 || q.inputs[0] != value || q.inputs[2].empty()) return -1;
    if (q.attrs.getInt("block_size", 0) != 0) return -1;
    const Tensor* s = constantOf(g, q.inputs[1]);
    const Tensor* z = constantOf(g, q.inputs[2]);
    if (!s || !z || s->numel() != 1 || z->numel() != 1 || s->dtype() != DType::F32 || !isEightBitInteger(z->dtype()) || !(s->scalarAt(0) > 0.0)) return -1;
    return c;
}

// The values of `value` when it is an f32 constant or the DequantizeLinear of a constant
// (any integer type, scale and zero point per tensor or per element); false otherwise.
bool constantValues(const Graph& g, const GraphIndex& index, const std::string& value, std::vector<double>* out) {
    if (const Tensor* c = constantOf(g, value)) {
        if (c->dtype() != DType::F32) return false;
        *out = c->toDoubleVector();
        return true;
    }
    const int p = index.producer(value);
    if (p < 0) return false;
    const Node& n = g.nodes[p];
    if (n.op_type != "DequantizeLinear" || !n.domain.empty() || n.inputs.size() < 2 || n.attrs.getInt("block_size", 0) != 0) return false;
    const Tensor* q = constantOf(g, n.inputs[0]);
    const Tensor* s = constantOf(g, n.inputs[1]);
    const Tensor* z = n.hasInput(2) ? constantOf(g, n.inputs[2]) : nullptr;
    if (!q || !s || (n.hasInput(2) && !z) || (s->numel() != 1 && s->numel() != q->numel()) || (z && z->numel() != s->numel())) return false;
    out->resize(static_cast<size_t>(q->numel()));
    for (int64_t i = 0; i < q->numel(); ++i) {
        const int64_t k = s->numel() == 1 ? 0 : i;
        (*out)[static_cast<size_t>(i)] = (q->scalarAt(i) - (z ? z->scalarAt(k) : 0.0)) * s->scalarAt(k);
    }
    return true;
}

// The conv's bias in accumulator units as QLinearConv takes it: int32 b / (x_scale w_scale[c]).
// False when the bias is not constant or would overflow.
bool accumulatorBias(const Graph& g, const GraphIndex& index, const std::string& bias, double x_scale, const Tensor& w_scale, int64_t channels,
                     Tensor* out) {
    std::vector<double> b;
    if (!constantValues(g, index, bias, &b) || static_cast<int64_t>(b.size()) != channels) return false;
    Tensor t(DType::I32, {channels});
    for (int64_t c = 0; c < channels; ++c) {
        const double v = std::nearbyint(b[static_cast<size_t>(c)] / (x_scale * w_scale.scalarAt(w_scale.numel() == 1 ? 0 : c)));
        if (!(std::fabs(v) < 2147483647.0)) return false;
        t.data<int32_t>()[c] = static_cast<int32_t>(v);
    }
    *out = std::move(t);
    return true;
}

// Moves data-movement ops onto the quantized tensors: DQ(s, z) -> op -> Q(s, z) with the
// same constant parameters is op itself on the 8-bit values, exactly (the op moves values
// without computing; Q(DQ(q)) = q). ONNX Runtime's quantizer puts such pairs around every
// Reshape, Transpose, Gather and Concat of a QDQ model; each pair costs two passes over
// the tensor in f32.
void moveDataOpsOntoQuantized(Graph& g) {
    static const std::set<std::string> kMovers = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather", "Concat"};
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<std::pair<size_t, int>> moves;  // (op, its Q)
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (!n.domain.empty() || !kMovers.count(n.op_type) || n.outputs.size() != 1 || n.inputs.empty()) continue;
        const int q = soleQuantizer(g, index, n.outputs[0]);
        if (q < 0) continue;
        const Tensor& qs = *constantOf(g, g.nodes[q].inputs[1]);
        const Tensor& qz = *constantOf(g, g.nodes[q].inputs[2]);
        // The quantized inputs: the data input (every input of a Concat), each a DQ of q's parameters.
        const size_t data_inputs = n.op_type == "Concat" ? n.inputs.size() : 1;
        bool same = true;
        for (size_t k = 0; k < data_inputs && same; ++k) {
            const Dequantized d = dequantizedInput(g, index, n.inputs[k]);
            same = d.node >= 0 && d.scale_value->scalarAt(0) == qs.scalarAt(0) && d.zp_value->dtype() == qz.dtype() && d.zp_value->scalarAt(0) == qz.scalarAt(0);
        }
        if (!same || !claimNodes(erase, std::vector<int>{q})) continue;
        moves.emplace_back(i, q);
    }
    for (const auto& [i, q] : moves) {
        Node& n = g.nodes[i];
        const size_t data_inputs = n.op_type == "Concat" ? n.inputs.size() : 1;
        for (size_t k = 0; k < data_inputs; ++k) n.inputs[k] = g.nodes[static_cast<size_t>(index.producer(n.inputs[k]))].inputs[0];
        n.outputs[0] = g.nodes[static_cast<size_t>(q)].outputs[0];
    }
    std::vector<Node> none;
    replaceNodes(g, erase, none);
}

void fuseQdq(Graph& g, const RouteValues& route) {
    // The integer operators have fast kernels on the CPU only (oneDNN's int8 convs and
    // matmuls); elsewhere the Q/DQ nodes stay, and the products run in floating point.
    if (!routeOn(route, "fusion.qdq") || passTarget(route) != "cpu") return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        const bool conv = n.op_type == "Conv", matmul = n.op_type == "MatMul";
        if (!n.domain.empty() || (!conv && !matmul) || n.inputs.size() < 2 || n.outputs.size() != 1) continue;
        int q = soleQuantizer(g, index, n.outputs[0]), relu = -1;
        if (q < 0) {  // Q(Relu(y)) is Q(y) where Q's zero point is its type's lowest value: it clamps there
            const int r = index.soleConsumer(n.outputs[0]);
            if (r < 0 || !g.nodes[r].domain.empty() || (g.nodes[r].op_type != "Relu" && g.nodes[r].op_type != "Clip")) continue;
            q = soleQuantizer(g, index, g.nodes[r].outputs[0]);
            if (q < 0 || !zeroPointIsLowest(*constantOf(g, g.nodes[q].inputs[2]))) continue;
            if (g.nodes[r].op_type == "Clip" && !clipIsSaturation(g, g.nodes[r], g.nodes[q])) continue;
            relu = r;
        }
        const Dequantized x = dequantizedInput(g, index, n.inputs[0]);
        if (x.node < 0) continue;
        // Weights: a constant of symmetric int8 (zero points 0), per tensor or per output channel.
        const Dequantized wd = conv ? dequantizedInput(g, index, n.inputs[1], 0, 4) : dequantizedInput(g, index, n.inputs[1], 1, 2);
        const Tensor* w = wd.node >= 0 ? constantOf(g, wd.q) : nullptr;
        if (!w || w->dtype() != DType::I8 || !allZero(*wd.zp_value)) continue;
        if (conv ? w->rank() < 3 : w->rank() != 2) continue;
        const int64_t channels = conv ? w->dims()[0] : w->dims()[1];
        if (wd.scale_value->numel() != 1 && wd.scale_value->numel() != channels) continue;
        std::string bias;
        Tensor bias_value;
        if (conv && n.hasInput(2)) {
            if (!accumulatorBias(g, index, n.inputs[2], x.scale_value->scalarAt(0), *wd.scale_value, w->dims()[0], &bias_value)) continue;
        }
        const Node& quantizer = g.nodes[q];
        std::vector<int> matched = {static_cast<int>(i), q};
        if (relu >= 0) matched.push_back(relu);
        if (!claimNodes(erase, matched)) continue;
        if (bias_value.defined()) {
            bias = freshName(g, n.name + "_bias_i32");
            g.initializers[bias] = std::move(bias_value);
        }
        Node fused{freshName(g, n.name + "_qlinear"), conv ? "QLinearConv" : "QLinearMatMul", "", {}, {quantizer.outputs[0]}, {}};
        fused.inputs = {x.q, x.scale, x.zero_point, wd.q, wd.scale, wd.zero_point, quantizer.inputs[1], quantizer.inputs[2]};
        if (!bias.empty()) fused.inputs.push_back(bias);
        if (conv) fused.attrs = n.attrs;
        added.push_back(std::move(fused));
    }
    replaceNodes(g, erase, added);
    moveDataOpsOntoQuantized(g);
}

}  // namespace

Pass qdqFusionPass() {
    return {"qdq_fusion",
            {{"fusion.qdq", {"on", "off"}, "on", "qdq_fusion",
              "Fold QuantizeLinear/DequantizeLinear around Conv and MatMul into QLinearConv/QLinearMatMul (8-bit integer kernels)", false,
              {"DequantizeLinear"}}},
            fuseQdq};
}

}  // namespace kiln
