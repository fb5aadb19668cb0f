#include "llm/onnx_decoder.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <set>

#include "ir/error.h"
#include "llm/decoder_model.h"
#include "llm/safetensors.h"
#include "onnx_import/importer.h"

namespace kiln::llm {

namespace {

Tensor floatTensor(Dims dims, std::vector<float> values) {
    Tensor t(DType::F32, std::move(dims));
    std::copy(values.begin(), values.end(), t.data<float>());
    return t;
}

Tensor transposed2d(const Tensor& t) { return floatTensor({t.dims()[1], t.dims()[0]}, transposed(t)); }

class GraphReader {
public:
    GraphReader(const Graph& g, std::string where) : g_(g), where_(std::move(where)) {
        for (size_t i = 0; i < g.nodes.size(); ++i) {
            for (const auto& o : g.nodes[i].outputs) producer_[o] = i;
            for (const auto& in : g.nodes[i].inputs) consumers_[in].push_back(i);
        }
        for (const auto& in : g.runtimeInputs()) inputs_.insert(in.name);
    }

    const Tensor* constant(const std::string& name) const {
        auto it = g_.initializers.find(name);
        return it == g_.initializers.end() || !isFloat(it->second.dtype()) ? nullptr : &it->second;
    }
    static bool isFloat(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }

    // Whether `value` is a graph input seen through shape-only ops (the token ids).
    bool fromGraphInput(std::string value) const {
        static const std::set<std::string> views = {"Reshape", "Unsqueeze", "Squeeze", "Cast", "Flatten", "Identity"};
        for (int hops = 0; hops < 8; ++hops) {
            if (inputs_.count(value)) return true;
            auto it = producer_.find(value);
            if (it == producer_.end() || !views.count(g_.nodes[it->second].op_type)) return false;
            value = g_.nodes[it->second].inputs[0];
        }
        return false;
    }

    // A linear node's weight as [in][out] f32 and its bias ([out], zeros when the export
    // dropped an all-zero bias), or false when `n` is not a linear node with constant weights.
    bool linear(const Node& n, Tensor* weight, Tensor* bias) const {
        const Tensor* w = nullptr;
        bool out_in = false;  // stored [out][in]
        if (n.op_type == "Gemm" && n.inputs.size() >= 2 && (w = constant(n.inputs[1])) && w->rank() == 2) {
            check(n.attrs.getInt("transA", 0) == 0 && n.attrs.getFloat("alpha", 1.f) == 1.f && n.attrs.getFloat("beta", 1.f) == 1.f,
                  where_ + ": " + n.describe() + ": only plain Gemm (no transA, alpha = beta = 1) is read as a linear layer");
            out_in = n.attrs.getInt("transB", 0) != 0;
        } else if (n.op_type == "MatMul" && n.inputs.size() == 2) {
            if (!(w = constant(n.inputs[1]))) {  // a Transpose of a constant [out][in]
                auto p = producer_.find(n.inputs[1]);
                if (p == producer_.end()) return false;
                const Node& t = g_.nodes[p->second];
                if (t.op_type != "Transpose" || !(w = constant(t.inputs[0])) || w->rank() != 2) return false;
                out_in = true;
            }
            if (w->rank() != 2) return false;
        } else {
            return false;
        }
        *weight = out_in ? transposed2d(*w) : floatTensor(w->dims(), toFloats(*w));
        const int64_t out = weight->dims()[1];
        *bias = Tensor(DType::F32, {out});
        const Tensor* b = nullptr;
        if (n.op_type == "Gemm" && n.hasInput(2)) {
            b = constant(n.inputs[2]);
            check(b && b->numel() == out, where_ + ": " + n.describe() + ": the bias is not a constant of " + std::to_string(out) + " values");
        } else if (const Node* add = consumerThroughReshapes(n.outputs[0], "Add")) {  // MatMul + Add(bias)
            for (const auto& in : add->inputs)
                if (const Tensor* c = constant(in); c && c->numel() == out && c->dims().back() == out) b = c;
        }
        if (b) *bias = floatTensor({out}, toFloats(*b));
        return true;
    }

    const Graph& graph() const { return g_; }
    const std::string& where() const { return where_; }
    // The node writing `value`, or null (graph inputs, initializers).
    const Node* producer(const std::string& value) const {
        auto it = producer_.find(value);
        return it == producer_.end() ? nullptr : &g_.nodes[it->second];
    }
    // The nodes reading `value`.
    std::vector<const Node*> consumers(const std::string& value) const {
        std::vector<const Node*> out;
        if (auto it = consumers_.find(value); it != consumers_.end())
            for (size_t i : it->second) out.push_back(&g_.nodes[i]);
        return out;
    }
    // A constant input of `n` with `numel` values, or null.
    const Tensor* constantInput(const Node& n, int64_t numel) const {
        for (const auto& in : n.inputs)
            if (const Tensor* c = constant(in); c && c->numel() == numel) return c;
        return nullptr;
    }

private:
    // The single op_type consumer of `value`, looking through Reshapes with one consumer.
    const Node* consumerThroughReshapes(std::string value, const std::string& op_type) const {
        for (int hops = 0; hops < 4; ++hops) {
            auto it = consumers_.find(value);
            if (it == consumers_.end() || it->second.size() != 1) return nullptr;
            const Node& c = g_.nodes[it->second[0]];
            if (c.op_type == op_type) return &c;
            if (c.op_type != "Reshape") return nullptr;
            value = c.outputs[0];
        }
        return nullptr;
    }

    const Graph& g_;
    std::string where_;
    std::map<std::string, size_t> producer_;
    std::map<std::string, std::vector<size_t>> consumers_;
    std::set<std::string> inputs_;
};

DecoderWeights readGpt2(const GraphReader& r) {
    const Graph& g = r.graph();
    const std::string& where = r.where();
    DecoderWeights out;
    DecoderConfig& c = out.config;
    c.family = Family::Gpt2;
    std::vector<const Node*> norms;
    std::vector<std::pair<Tensor, Tensor>> linears;
    const Tensor *wte = nullptr, *wpe = nullptr;
    bool tanh_gelu = false, erf_gelu = false;
    for (const Node& n : g.nodes) {
        if (n.op_type == "Gather" && n.inputs.size() == 2) {
            const Tensor* table = r.constant(n.inputs[0]);
            if (table && table->rank() == 2) {
                if (r.fromGraphInput(n.inputs[1])) wte = table;
                else wpe = table;
            }
        }
        if (n.op_type == "LayerNormalization") norms.push_back(&n);
        if (n.op_type == "Tanh") tanh_gelu = true;
        if (n.op_type == "Erf") erf_gelu = true;
        Tensor w, b;
        if (r.linear(n, &w, &b)) linears.emplace_back(std::move(w), std::move(b));
    }
    check(wte && wpe, where + ": no token and position embedding lookups (Gather of constant tables) found: not a GPT-2-style decoder");
    check(norms.size() >= 3 && norms.size() % 2 == 1, where + ": " + std::to_string(norms.size()) + " LayerNormalization nodes; a GPT-2 decoder has 2 per layer plus the final one");
    check(tanh_gelu && !erf_gelu, where + ": the MLP's GELU is not the tanh form GPT-2 uses (gelu_new)");
    c.layers = static_cast<int64_t>(norms.size() - 1) / 2;
    c.vocab = wte->dims()[0], c.hidden = wte->dims()[1], c.max_positions = wpe->dims()[0];
    check(wpe->dims()[1] == c.hidden, where + ": position table " + wpe->summary() + " does not match the token table " + wte->summary());
    // Linear layers per block: c_attn, c_proj, c_fc, c_proj; the LM head (tied to the token
    // table, as GPT-2's is) may follow.
    check(static_cast<int64_t>(linears.size()) >= 4 * c.layers,
          where + ": " + std::to_string(linears.size()) + " linear layers with constant weights; " + std::to_string(c.layers) + " blocks need " +
              std::to_string(4 * c.layers));
    const int64_t H = c.hidden;
    c.intermediate = linears[2].first.dims()[1];
    // Heads: the first Reshape to [batch, seq, heads, head_dim] with heads * head_dim = H.
    for (const Node& n : g.nodes) {
        if (n.op_type != "Reshape" || n.inputs.size() < 2) continue;
        auto s = g.initializers.find(n.inputs[1]);
        if (s == g.initializers.end() || s->second.numel() != 4) continue;
        const auto dims = s->second.toInt64Vector();  // one of heads / head_dim may be -1
        const int64_t heads = dims[2] > 0 ? dims[2] : dims[3] > 0 && H % dims[3] == 0 ? H / dims[3] : 0;
        if (heads > 0 && H % heads == 0 && (dims[3] <= 0 || dims[3] == H / heads) && (dims[2] > 0 || dims[3] > 0)) {
            c.heads = heads;
            break;
        }
    }
    check(c.heads > 0, where + ": no Reshape into attention heads ([batch, seq, heads, head_dim]) found");
    c.kv_heads = c.heads, c.head_dim = H / c.heads;
    c.norm_eps = norms[0]->attrs.getFloat("epsilon", 1e-5f);
    c.tie_embeddings = true;
    if (static_cast<int64_t>(linears.size()) > 4 * c.layers) {
        const Tensor& head = linears[4 * c.layers].first;  // [H][vocab]
        check(head.dims() == Dims{H, c.vocab}, where + ": the LM head " + head.summary() + " is not [hidden, vocab]");
        const std::vector<float> table = toFloats(*wte);  // [vocab][H]
        const float* h = head.data<float>();
        bool tied = true;
        for (int64_t v = 0; v < c.vocab && tied; ++v)
            for (int64_t k = 0; k < H && tied; ++k) tied = table[v * H + k] == h[k * c.vocab + v];
        check(tied, where + ": the LM head is not tied to the token embedding (GPT-2 ties them)");
    }
    auto& w = out.weights;
    w["wte.weight"] = floatTensor(wte->dims(), toFloats(*wte));
    w["wpe.weight"] = floatTensor(wpe->dims(), toFloats(*wpe));
    auto norm = [&](const Node* n, const std::string& name) {
        const Tensor* scale = r.constant(n->inputs[1]);
        const Tensor* shift = n->hasInput(2) ? r.constant(n->inputs[2]) : nullptr;
        check(scale && scale->numel() == H && (!n->hasInput(2) || (shift && shift->numel() == H)),
              where + ": " + n->describe() + ": scale and bias must be constants of " + std::to_string(H) + " values");
        w[name + ".weight"] = floatTensor({H}, toFloats(*scale));
        w[name + ".bias"] = shift ? floatTensor({H}, toFloats(*shift)) : Tensor(DType::F32, {H});
    };
    const char* names[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    const Dims shapes[4] = {{H, 3 * H}, {H, H}, {H, c.intermediate}, {c.intermediate, H}};
    for (int64_t l = 0; l < c.layers; ++l) {
        const std::string p = "h." + std::to_string(l) + ".";
        norm(norms[2 * l], p + "ln_1");
        norm(norms[2 * l + 1], p + "ln_2");
        for (int k = 0; k < 4; ++k) {
            auto& [weight, bias] = linears[4 * l + k];
            check(weight.dims() == shapes[k], where + ": block " + std::to_string(l) + "'s " + names[k] + " weight is " + weight.summary() + ", expected [" +
                                                  std::to_string(shapes[k][0]) + "," + std::to_string(shapes[k][1]) + "]");
            w[p + names[k] + ".weight"] = weight;
            w[p + names[k] + ".bias"] = bias;
        }
    }
    norm(norms.back(), "ln_f");
    return out;
}

// An RMSNorm as exporters decompose it: ReduceMean(Pow(x, 2)) -> Add(eps) -> Sqrt ->
// Reciprocal (or Div) -> Mul(x) -> Mul(weight). From the ReduceMean, the first Add of a scalar
// constant is eps and the first Mul by a constant of H values is the weight.
struct RmsNorm {
    const Tensor* weight = nullptr;
    float eps = 0.f;
};
RmsNorm decomposedRmsNorm(const GraphReader& r, const Node& mean, int64_t H) {
    RmsNorm out;
    std::vector<std::string> frontier = {mean.outputs[0]};
    for (int hops = 0; hops < 6 && !out.weight; ++hops) {
        std::vector<std::string> next;
        for (const auto& v : frontier)
            for (const Node* c : r.consumers(v)) {
                if (c->op_type == "Add" && out.eps == 0.f)
                    if (const Tensor* e = r.constantInput(*c, 1)) out.eps = static_cast<float>(e->scalarAt(0));
                if (c->op_type == "Mul" && (out.weight = r.constantInput(*c, H))) break;
                next.push_back(c->outputs[0]);
            }
        frontier = std::move(next);
    }
    check(out.weight != nullptr, r.where() + ": " + mean.describe() + ": no scale of " + std::to_string(H) + " values after this RMSNorm");
    return out;
}

// An RMSNorm as one node (opset 23's RMSNormalization, ONNX Runtime's fused op).
bool isRmsNormNode(const Node& n) { return n.op_type == "RMSNormalization" || n.op_type == "SimplifiedLayerNormalization"; }

// The ReduceMean of a decomposed RMSNorm: fed by Pow(x, 2).
bool isRmsNormMean(const GraphReader& r, const Node& n) {
    if (n.op_type != "ReduceMean") return false;
    const Node* p = r.producer(n.inputs[0]);
    if (!p || p->op_type != "Pow" || p->inputs.size() != 2) return false;
    const Tensor* e = r.constant(p->inputs[1]);
    return e && e->numel() == 1 && e->scalarAt(0) == 2.0;
}

// A Llama-family export (RMSNorm, RoPE, SwiGLU, grouped-query attention): per layer the linear
// nodes q, k, v, o, gate, up, down in forward order, then the LM head; head_dim and
// rope_theta come from the rotary inv_freq constant (1, theta^(-2/D), ...).
DecoderWeights readLlama(const GraphReader& r) {
    const Graph& g = r.graph();
    const std::string& where = r.where();
    DecoderWeights out;
    DecoderConfig& c = out.config;
    c.family = Family::Llama;
    const Tensor* embed = nullptr;
    for (const Node& n : g.nodes)
        if (n.op_type == "Gather" && n.inputs.size() == 2 && r.fromGraphInput(n.inputs[1]))
            if (const Tensor* t = r.constant(n.inputs[0]); t && t->rank() == 2) embed = t;
    check(embed != nullptr, where + ": no token embedding lookup (Gather of a constant table by the input ids) found");
    c.vocab = embed->dims()[0], c.hidden = embed->dims()[1];
    const int64_t H = c.hidden;
    std::vector<RmsNorm> norms;
    std::vector<std::tuple<Tensor, Tensor, const Node*>> linears;
    for (const Node& n : g.nodes) {
        if (isRmsNormNode(n)) {
            const Tensor* w = n.inputs.size() > 1 ? r.constant(n.inputs[1]) : nullptr;
            check(w && w->numel() == H, where + ": " + n.describe() + ": the scale is not a constant of " + std::to_string(H) + " values");
            norms.push_back({w, n.attrs.getFloat("epsilon", 1e-5f)});
        } else if (isRmsNormMean(r, n)) {
            norms.push_back(decomposedRmsNorm(r, n, H));
        }
        Tensor w, b;
        if (r.linear(n, &w, &b)) linears.emplace_back(std::move(w), std::move(b), &n);
    }
    check(norms.size() >= 3 && norms.size() % 2 == 1, where + ": " + std::to_string(norms.size()) + " RMSNorms; a Llama decoder has 2 per layer plus the final one");
    c.layers = static_cast<int64_t>(norms.size() - 1) / 2;
    check(static_cast<int64_t>(linears.size()) == 7 * c.layers + 1, where + ": " + std::to_string(linears.size()) + " linear layers with constant weights; " +
                                                                         std::to_string(c.layers) + " Llama layers and the LM head need " +
                                                                         std::to_string(7 * c.layers + 1));
    const int64_t Q = std::get<0>(linears[0]).dims()[1], KV = std::get<0>(linears[1]).dims()[1];
    // Rotary inv_freq: D/2 values from 1 down, each the previous times theta^(-2/D), with D
    // dividing the q and k widths (the longest such constant, should another one look alike).
    const Tensor* inv_freq = nullptr;
    for (const auto& [name, t] : g.initializers) {
        if (!GraphReader::isFloat(t.dtype()) || t.numel() < 2 || t.numel() > 512 || t.scalarAt(0) != 1.0) continue;
        if (Q % (2 * t.numel()) != 0 || KV % (2 * t.numel()) != 0 || (inv_freq && inv_freq->numel() >= t.numel())) continue;
        const double ratio = t.scalarAt(1);
        bool geometric = ratio > 0 && ratio < 1;
        for (int64_t i = 2; i < t.numel() && geometric; ++i) geometric = std::abs(t.scalarAt(i) / std::pow(ratio, i) - 1) < 1e-3;
        if (geometric) inv_freq = &t;
    }
    check(inv_freq != nullptr, where + ": no rotary inv_freq constant (1, theta^(-2/D), ...) found; exports with RoPE scaling are not read");
    c.head_dim = 2 * inv_freq->numel();
    c.rope_theta = static_cast<float>(std::pow(inv_freq->scalarAt(1), -static_cast<double>(c.head_dim) / 2));
    check(Q % c.head_dim == 0 && KV % c.head_dim == 0 && Q % KV == 0,
          where + ": q and k projections of " + std::to_string(Q) + " and " + std::to_string(KV) + " outputs do not make heads of " + std::to_string(c.head_dim));
    c.heads = Q / c.head_dim, c.kv_heads = KV / c.head_dim;
    c.intermediate = std::get<0>(linears[4]).dims()[1];
    c.norm_eps = norms[0].eps > 0.f ? norms[0].eps : 1e-5f;
    c.max_positions = 2048;  // not recorded in the graph (rotary positions have no table)
    const int64_t I = c.intermediate;
    auto& w = out.weights;
    w["model.embed_tokens.weight"] = floatTensor(embed->dims(), toFloats(*embed));
    const char* names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const Dims shapes[7] = {{H, Q}, {H, KV}, {H, KV}, {Q, H}, {H, I}, {H, I}, {I, H}};  // [in][out]
    auto feedsSigmoid = [&](const Node* n) {
        for (const Node* c : r.consumers(n->outputs[0]))
            if (c->op_type == "Sigmoid") return true;
        return false;
    };
    for (int64_t l = 0; l < c.layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        w[p + "input_layernorm.weight"] = floatTensor({H}, toFloats(*norms[2 * l].weight));
        w[p + "post_attention_layernorm.weight"] = floatTensor({H}, toFloats(*norms[2 * l + 1].weight));
        auto* layer = &linears[7 * l];
        if (!feedsSigmoid(std::get<2>(layer[4])) && feedsSigmoid(std::get<2>(layer[5]))) std::swap(layer[4], layer[5]);  // up before gate
        check(feedsSigmoid(std::get<2>(layer[4])), where + ": layer " + std::to_string(l) + ": no gate projection feeding a SiLU (Sigmoid) found");
        for (int k = 0; k < 7; ++k) {
            const auto& [weight, bias, node] = layer[k];
            check(weight.dims() == shapes[k], where + ": layer " + std::to_string(l) + "'s " + names[k] + " weight is " + weight.summary() + ", expected [" +
                                                  std::to_string(shapes[k][0]) + "," + std::to_string(shapes[k][1]) + "]");
            for (float v : bias.span<float>())
                check(v == 0.f, where + ": " + node->describe() + ": a bias on " + names[k] + "; Llama-family layers without biases only");
            w[p + names[k] + ".weight"] = transposed2d(weight);  // Hugging Face's [out][in]
        }
    }
    w["model.norm.weight"] = floatTensor({H}, toFloats(*norms.back().weight));
    const Tensor& head = std::get<0>(linears.back());
    check(head.dims() == Dims{H, c.vocab}, where + ": the LM head " + head.summary() + " is not [hidden, vocab]");
    w["lm_head.weight"] = transposed2d(head);
    c.tie_embeddings = false;  // the head is read as its own matrix, tied or not
    return out;
}

}  // namespace

DecoderWeights decoderFromOnnxGraph(const Graph& g, const std::string& where) {
    const GraphReader reader(g, where);
    for (const Node& n : g.nodes)
        if (n.op_type == "LayerNormalization") return readGpt2(reader);
    for (const Node& n : g.nodes)
        if (isRmsNormNode(n) || isRmsNormMean(reader, n)) return readLlama(reader);
    throw Error(where + ": not a GPT-2-style (LayerNormalization) or Llama-style (RMSNorm) decoder; only those are read from ONNX");
}

DecoderWeights loadDecoderWeights(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    // The graph is read for its structure and weights, not run: newer opsets are fine
    // (PyTorch's dynamo exporter writes opset 20).
    if (path.extension() == ".onnx") return decoderFromOnnxGraph(importOnnxModel(path, kReadOnlyMaxOpset), path.string());
    const bool safetensors = fs::exists(path / "model.safetensors") || fs::exists(path / "model.safetensors.index.json");
    if (!safetensors && fs::exists(path / "model.onnx"))
        return decoderFromOnnxGraph(importOnnxModel(path / "model.onnx", kReadOnlyMaxOpset), (path / "model.onnx").string());
    return {DecoderConfig::load(path / "config.json"), readSafetensorsCheckpoint(path)};
}

}  // namespace kiln::llm
