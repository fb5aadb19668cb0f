// The QDQ form of a float model from its calibration ranges (calibration.h): what ONNX
// Runtime's static quantizer writes, so that one path (qdq_fusion, the int8 tactics) serves
// models quantized elsewhere and here.
#include <algorithm>
#include <cmath>
#include <set>

#include "quant/qdq_insertion.h"

namespace kiln {

namespace {

std::string freshIn(const Graph& g, const std::set<std::string>& taken, const std::string& base) {
    std::string name = base;
    for (int k = 1; g.initializers.count(name) || g.value_info.count(name) || taken.count(name); ++k) name = base + "_" + std::to_string(k);
    return name;
}

// Symmetric int8 values of w per index of `axis`, and their scales (max |w| / 127).
void quantizeWeights(const Tensor& w, int64_t axis, Tensor* q, Tensor* scales) {
    const int64_t channels = w.dims()[static_cast<size_t>(axis)];
    int64_t inner = 1;
    for (size_t d = static_cast<size_t>(axis) + 1; d < w.rank(); ++d) inner *= w.dims()[d];
    const float* p = w.data<float>();
    std::vector<double> amax(static_cast<size_t>(channels), 0.0);
    for (int64_t i = 0; i < w.numel(); ++i) {
        const size_t c = static_cast<size_t>((i / inner) % channels);
        amax[c] = std::max(amax[c], std::fabs(static_cast<double>(p[i])));
    }
    *scales = Tensor(DType::F32, {channels});
    for (int64_t c = 0; c < channels; ++c)
        scales->data<float>()[c] = amax[static_cast<size_t>(c)] > 0 ? static_cast<float>(amax[static_cast<size_t>(c)] / 127.0) : 1.0f;
    *q = Tensor(DType::I8, w.dims());
    for (int64_t i = 0; i < w.numel(); ++i) {
        const float s = scales->data<float>()[(i / inner) % channels];
        q->data<int8_t>()[i] = static_cast<int8_t>(std::clamp(std::nearbyint(p[i] / s), -127.0f, 127.0f));
    }
}

Tensor transposed2d(const Tensor& w) {
    const int64_t R = w.dims()[0], C = w.dims()[1];
    Tensor t(DType::F32, {C, R});
    for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) t.data<float>()[c * R + r] = w.data<float>()[r * C + c];
    return t;
}

bool constantF32(const Graph& g, const std::string& v, size_t rank) {
    auto it = g.initializers.find(v);
    return it != g.initializers.end() && it->second.dtype() == DType::F32 && it->second.rank() == rank;
}

// Gemm(A, B, C) with constant B (no transA, unit alpha and beta) as MatMul(A, B') + C, the
// form qdq_fusion folds.
// `selected` (the products' outputs) gains the MatMul each selected Gemm becomes.
void gemmsAsMatMuls(Graph& g, const CalibrationTable& table, std::set<std::string>& taken, std::set<std::string>& selected) {
    std::vector<Node> out;
    for (auto& n : g.nodes) {
        const bool plain = n.op_type == "Gemm" && n.domain.empty() && n.inputs.size() >= 2 && constantF32(g, n.inputs[1], 2) &&
                           n.attrs.getInt("transA", 0) == 0 && n.attrs.getFloat("alpha", 1.f) == 1.f && n.attrs.getFloat("beta", 1.f) == 1.f &&
                           table.ranges.count(n.inputs[0]) && selected.count(n.outputs[0]);
        if (!plain) {
            out.push_back(std::move(n));
            continue;
        }
        std::string weights = n.inputs[1];
        if (n.attrs.getInt("transB", 0)) {
            weights = freshIn(g, taken, n.inputs[1] + "_t");
            taken.insert(weights);
            g.initializers[weights] = transposed2d(g.initializers.at(n.inputs[1]));
        }
        const bool bias = n.hasInput(2);
        const std::string product = bias ? freshIn(g, taken, n.outputs[0] + "_matmul") : n.outputs[0];
        taken.insert(product);
        selected.insert(product);
        out.push_back(Node{n.name + "_matmul", "MatMul", "", {n.inputs[0], weights}, {product}, {}});
        if (bias) out.push_back(Node{n.name + "_bias", "Add", "", {product, n.inputs[2]}, {n.outputs[0]}, {}});
        if (bias) g.value_info[product] = ValueInfo{product, DType::F32, Shape::unknown()};
    }
    g.nodes = std::move(out);
}

}  // namespace

Graph insertQdq(const Graph& model, const CalibrationTable& table, const QuantSelection& selection) {
    Graph g = withConstantsAsInitializers(model);
    const std::vector<std::string> point_list = quantizationPoints(g, selection);
    const std::set<std::string> points(point_list.begin(), point_list.end());
    std::set<std::string> selected, taken;  // the selected products' outputs; value names in use
    for (size_t i : quantizedProducts(g, selection)) selected.insert(g.nodes[i].outputs[0]);
    for (const auto& n : g.nodes)
        for (const auto& v : n.outputs) taken.insert(v);
    for (const auto& v : g.inputs) taken.insert(v.name);
    gemmsAsMatMuls(g, table, taken, selected);
    std::vector<Node> added;
    // Weights: int8 per output channel (a Conv's axis 0, a MatMul's columns), where the
    // product's input is quantized. `selected` holds only Convs and MatMuls with constant f32
    // weights (quantizedProducts), and Gemms, which become MatMuls above or stay float.
    for (auto& n : g.nodes) {
        const bool conv = n.op_type == "Conv";
        if ((!conv && n.op_type != "MatMul") || !selected.count(n.outputs[0]) || !table.ranges.count(n.inputs[0])) continue;
        const int64_t axis = conv ? 0 : 1;
        Tensor q, scales;
        quantizeWeights(g.initializers.at(n.inputs[1]), axis, &q, &scales);
        const std::string base = freshIn(g, taken, n.name + "_w");
        const std::string wq = base + "_q", ws = base + "_scale", wz = base + "_zero", wd = base + "_dq";
        taken.insert({base, wq, ws, wz, wd});
        const int64_t channels = scales.numel();
        g.initializers[wq] = std::move(q);
        g.initializers[ws] = std::move(scales);
        g.initializers[wz] = Tensor(DType::I8, {channels});
        Node dq{n.name + "_w_dequantize", "DequantizeLinear", "", {wq, ws, wz}, {wd}, {}};
        dq.attrs.set("axis", axis);
        added.push_back(std::move(dq));
        g.value_info[wd] = ValueInfo{wd, DType::F32, Shape::fromDims(g.initializers.at(wq).dims())};
        n.inputs[1] = wd;
    }
    // Activations: uint8 over the measured range widened to include 0 (so that 0, padding
    // and Relu's floor, is exact).
    std::set<std::string> read;
    for (const auto& n : g.nodes)
        for (const auto& in : n.inputs) read.insert(in);
    for (const auto& o : g.outputs) read.insert(o.name);
    for (const auto& [value, r] : table.ranges) {
        if (!read.count(value) || !points.count(value) || !std::isfinite(r.min) || !std::isfinite(r.max)) continue;
        const double lo = std::min(r.min, 0.0), hi = std::max(r.max, 0.0);
        const double scale = hi > lo ? (hi - lo) / 255.0 : 1.0;
        const auto zp = static_cast<uint8_t>(std::clamp(std::nearbyint(-lo / scale), 0.0, 255.0));
        const std::string base = freshIn(g, taken, value + "_quant");
        const std::string s = base + "_scale", z = base + "_zero", q = base + "_q", d = base + "_dq";
        taken.insert({base, s, z, q, d});
        g.initializers[s] = Tensor::scalar<float>(static_cast<float>(scale));
        g.initializers[z] = Tensor::scalar<uint8_t>(zp);
        const ValueInfo* info = g.findValueInfo(value);
        const Shape shape = info ? info->shape : Shape::unknown();
        // A computed value: its producer writes the float under a new name and the DQ writes
        // `value`, so that every reader (a graph output too) takes the quantized one. A graph
        // input: its readers move to the DQ's output.
        Node* producer = nullptr;
        for (auto& n : g.nodes)
            for (auto& out : n.outputs)
                if (out == value) producer = &n;
        std::string source = value, dequantized = d;
        if (producer) {
            source = d, dequantized = value;
            for (auto& out : producer->outputs)
                if (out == value) out = source;
        } else {
            for (auto& n : g.nodes)
                for (auto& in : n.inputs)
                    if (in == value) in = d;
        }
        g.value_info[q] = ValueInfo{q, DType::U8, shape};
        g.value_info[source] = ValueInfo{source, DType::F32, shape};
        added.push_back(Node{base + "_quantize", "QuantizeLinear", "", {source, s, z}, {q}, {}});
        added.push_back(Node{base + "_dequantize", "DequantizeLinear", "", {q, s, z}, {dequantized}, {}});
    }
    for (auto& n : added) g.nodes.push_back(std::move(n));
    topologicalSort(g);
    return g;
}

}  // namespace kiln
