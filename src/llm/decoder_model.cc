#include "llm/decoder_model.h"

#include <algorithm>
#include <cmath>

#include "ir/error.h"
#include "llm/onnx_decoder.h"

namespace kiln::llm {

std::vector<float> transposed(const Tensor& t) {
    const int64_t rows = t.dims()[0], cols = t.dims()[1];
    std::vector<float> src = toFloats(t), out(src.size());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = src[r * cols + c];
    return out;
}

namespace {

// y[out] (+)= x[in] * w[in][out]
void matvec(const float* x, const std::vector<float>& w, const std::vector<float>* bias, int64_t in, int64_t out, float* y) {
    for (int64_t o = 0; o < out; ++o) y[o] = bias && !bias->empty() ? (*bias)[o] : 0.f;
    for (int64_t i = 0; i < in; ++i) {
        const float xi = x[i];
        const float* row = w.data() + i * out;
        for (int64_t o = 0; o < out; ++o) y[o] += xi * row[o];
    }
}

void layerNorm(const float* x, const std::vector<float>& w, const std::vector<float>& b, int64_t n, float eps, bool rms, float* y) {
    double mean = 0, var = 0;
    if (!rms) {
        for (int64_t i = 0; i < n; ++i) mean += x[i];
        mean /= static_cast<double>(n);
    }
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>((x[i] - mean) * inv) * w[i] + (b.empty() ? 0.f : b[i]);
}

void rope(float* v, int64_t heads, int64_t dim, int64_t pos, float theta) {
    const int64_t half = dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        float* x = v + h * dim;
        for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(pos) * std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(dim));
            const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
            const float a = x[i], b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }
}

}  // namespace

std::vector<int64_t> LanguageModel::forwardBatchArgmax(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const {
    const std::vector<float> logits = forwardBatch(cache, chunks);
    const auto vocab = static_cast<std::ptrdiff_t>(config().vocab);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < chunks.size(); ++i) {
        const auto row = logits.begin() + static_cast<std::ptrdiff_t>(i) * vocab;
        ids.push_back(std::max_element(row, row + vocab) - row);
    }
    return ids;
}

void checkChunk(const DecoderConfig& c, const PagedKvCache& cache, int64_t seq, std::span<const int64_t> tokens, bool positions_bounded) {
    const int64_t start = cache.length(seq), n = static_cast<int64_t>(tokens.size());
    check(n > 0, "a chunk needs at least one token");
    check(static_cast<int64_t>(cache.blockTable(seq).size()) * cache.blockSize() >= start + n, "the KV cache has no room reserved for these tokens");
    check(!positions_bounded || start + n <= c.max_positions, "sequence longer than the model's " + std::to_string(c.max_positions) + " positions");
    for (int64_t t : tokens) check(t >= 0 && t < c.vocab, "token id " + std::to_string(t) + " outside the vocabulary of " + std::to_string(c.vocab));
}

std::vector<float> toFloats(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<float>(t.scalarAt(i));
    return v;
}

std::string findWeightName(const std::map<std::string, Tensor>& w, const std::vector<std::string>& prefixes, const std::string& name) {
    for (const auto& p : prefixes)
        if (w.count(p + name)) return p + name;
    throw Error("missing weight '" + prefixes.front() + name + "'");
}

const Tensor& findWeight(const std::map<std::string, Tensor>& w, const std::vector<std::string>& prefixes, const std::string& name, const Dims& dims) {
    const std::string full = findWeightName(w, prefixes, name);
    const Tensor& t = w.at(full);
    check(t.dims() == dims, "weight '" + full + "' has shape " + dimsToString(t.dims()) + ", the config implies " + dimsToString(dims));
    check(isFloating(t.dtype()), "weight '" + full + "' is not a float tensor");
    return t;
}

DecoderModel::DecoderModel(DecoderConfig config, const std::map<std::string, Tensor>& w) : config_(config) {
    const DecoderConfig& c = config_;
    const int64_t H = c.hidden, D = c.head_dim, Q = c.heads * D, KV = c.kv_heads * D, I = c.intermediate;
    if (c.family == Family::Gpt2) {
        const std::vector<std::string> p = {"transformer.", ""};
        embed_ = toFloats(findWeight(w, p, "wte.weight", {c.vocab, H}));
        positions_ = toFloats(findWeight(w, p, "wpe.weight", {c.max_positions, H}));
        final_w_ = toFloats(findWeight(w, p, "ln_f.weight", {H}));
        final_b_ = toFloats(findWeight(w, p, "ln_f.bias", {H}));
        for (int64_t l = 0; l < c.layers; ++l) {
            const std::string n = "h." + std::to_string(l) + ".";
            Layer L;
            L.norm1_w = toFloats(findWeight(w, p, n + "ln_1.weight", {H}));
            L.norm1_b = toFloats(findWeight(w, p, n + "ln_1.bias", {H}));
            L.norm2_w = toFloats(findWeight(w, p, n + "ln_2.weight", {H}));
            L.norm2_b = toFloats(findWeight(w, p, n + "ln_2.bias", {H}));
            // GPT-2's Conv1D stores [in][out]; c_attn packs q, k, v along out.
            // Q = H except in a tensor-parallel shard, which holds heads / world of them.
            const std::vector<float> qkv = toFloats(findWeight(w, p, n + "attn.c_attn.weight", {H, 3 * Q}));
            const std::vector<float> qkv_b = toFloats(findWeight(w, p, n + "attn.c_attn.bias", {3 * Q}));
            for (auto* m : {&L.wq, &L.wk, &L.wv}) m->resize(H * Q);
            for (int64_t i = 0; i < H; ++i)
                for (int64_t o = 0; o < Q; ++o) {
                    L.wq[i * Q + o] = qkv[i * 3 * Q + o];
                    L.wk[i * Q + o] = qkv[i * 3 * Q + Q + o];
                    L.wv[i * Q + o] = qkv[i * 3 * Q + 2 * Q + o];
                }
            L.bq.assign(qkv_b.begin(), qkv_b.begin() + Q);
            L.bk.assign(qkv_b.begin() + Q, qkv_b.begin() + 2 * Q);
            L.bv.assign(qkv_b.begin() + 2 * Q, qkv_b.end());
            L.wo = toFloats(findWeight(w, p, n + "attn.c_proj.weight", {Q, H}));
            L.bo = toFloats(findWeight(w, p, n + "attn.c_proj.bias", {H}));
            L.w_up = toFloats(findWeight(w, p, n + "mlp.c_fc.weight", {H, I}));
            L.b_up = toFloats(findWeight(w, p, n + "mlp.c_fc.bias", {I}));
            L.w_down = toFloats(findWeight(w, p, n + "mlp.c_proj.weight", {I, H}));
            L.b_down = toFloats(findWeight(w, p, n + "mlp.c_proj.bias", {H}));
            layers_.push_back(std::move(L));
        }
        lm_head_ = transposed(findWeight(w, p, "wte.weight", {c.vocab, H}));
    } else {
        const std::vector<std::string> p = {"model.", ""};
        embed_ = toFloats(findWeight(w, p, "embed_tokens.weight", {c.vocab, H}));
        final_w_ = toFloats(findWeight(w, p, "norm.weight", {H}));
        for (int64_t l = 0; l < c.layers; ++l) {
            const std::string n = "layers." + std::to_string(l) + ".";
            Layer L;
            L.norm1_w = toFloats(findWeight(w, p, n + "input_layernorm.weight", {H}));
            L.norm2_w = toFloats(findWeight(w, p, n + "post_attention_layernorm.weight", {H}));
            L.wq = transposed(findWeight(w, p, n + "self_attn.q_proj.weight", {Q, H}));
            L.wk = transposed(findWeight(w, p, n + "self_attn.k_proj.weight", {KV, H}));
            L.wv = transposed(findWeight(w, p, n + "self_attn.v_proj.weight", {KV, H}));
            L.wo = transposed(findWeight(w, p, n + "self_attn.o_proj.weight", {H, Q}));
            L.w_gate = transposed(findWeight(w, p, n + "mlp.gate_proj.weight", {I, H}));
            L.w_up = transposed(findWeight(w, p, n + "mlp.up_proj.weight", {I, H}));
            L.w_down = transposed(findWeight(w, p, n + "mlp.down_proj.weight", {H, I}));
            layers_.push_back(std::move(L));
        }
        const bool tied = c.tie_embeddings || !w.count("lm_head.weight");
        lm_head_ = tied ? transposed(findWeight(w, p, "embed_tokens.weight", {c.vocab, H})) : transposed(findWeight(w, {""}, "lm_head.weight", {c.vocab, H}));
    }
}

DecoderModel DecoderModel::load(const std::filesystem::path& dir) {
    DecoderWeights w = loadDecoderWeights(dir);
    return DecoderModel(w.config, w.weights);
}

PagedKvCache DecoderModel::makeCache(int64_t block_size, int64_t num_blocks) const {
    return PagedKvCache(config_.layers, config_.kv_heads, config_.head_dim, block_size, num_blocks);
}

std::vector<float> DecoderModel::forwardBatch(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const {
    std::vector<float> logits;
    logits.reserve(chunks.size() * static_cast<size_t>(config_.vocab));
    for (const auto& c : chunks) {
        const auto l = forward(cache, c.seq, c.tokens);
        logits.insert(logits.end(), l.begin(), l.end());
    }
    return logits;
}

// Paged attention for one query (all heads) at position `pos`: keys/values of positions
// 0..pos read through the block table; query head h uses key/value head h / group.
void DecoderModel::attention(PagedKvCache& cache, int64_t seq, int64_t layer, int64_t pos, const float* q, float* out) const {
    const int64_t D = config_.head_dim, group = config_.heads / config_.kv_heads;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    std::vector<float> scores(static_cast<size_t>(pos + 1));
    for (int64_t h = 0; h < config_.heads; ++h) {
        const float* qh = q + h * D;
        float mx = -INFINITY;
        for (int64_t t = 0; t <= pos; ++t) {
            const float* k = cache.key(seq, layer, shard_.kv_head_offset + h / group, t);
            float s = 0;
            for (int64_t d = 0; d < D; ++d) s += qh[d] * k[d];
            scores[t] = s * scale;
            mx = std::max(mx, scores[t]);
        }
        double sum = 0;
        for (int64_t t = 0; t <= pos; ++t) sum += (scores[t] = std::exp(scores[t] - mx));
        float* oh = out + h * D;
        for (int64_t d = 0; d < D; ++d) oh[d] = 0;
        for (int64_t t = 0; t <= pos; ++t) {
            const float p = static_cast<float>(scores[t] / sum);
            const float* v = cache.value(seq, layer, shard_.kv_head_offset + h / group, t);
            for (int64_t d = 0; d < D; ++d) oh[d] += p * v[d];
        }
    }
}

std::vector<float> DecoderModel::forward(PagedKvCache& cache, int64_t seq, std::span<const int64_t> tokens, bool all_logits) const {
    const DecoderConfig& c = config_;
    const int64_t H = c.hidden, D = c.head_dim, Q = c.heads * D, KV = c.kv_heads * D, I = c.intermediate, n = static_cast<int64_t>(tokens.size());
    const int64_t start = cache.length(seq);
    checkChunk(c, cache, seq, tokens, c.family == Family::Gpt2);
    const bool rms = c.family == Family::Llama;
    std::vector<float> x(n * H), h(H), q(Q), k(KV), v(KV), att(Q), proj(H), up(I), gate(I);
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < H; ++j) x[i * H + j] = embed_[tokens[i] * H + j] + (rms ? 0.f : positions_[(start + i) * H + j]);
    }
    for (int64_t l = 0; l < c.layers; ++l) {
        const Layer& L = layers_[l];
        // Keys and values of all new tokens first, so token i attends to tokens 0..start+i.
        std::vector<float> queries(n * Q);
        for (int64_t i = 0; i < n; ++i) {
            layerNorm(&x[i * H], L.norm1_w, L.norm1_b, H, c.norm_eps, rms, h.data());
            matvec(h.data(), L.wq, &L.bq, H, Q, &queries[i * Q]);
            matvec(h.data(), L.wk, &L.bk, H, KV, k.data());
            matvec(h.data(), L.wv, &L.bv, H, KV, v.data());
            if (rms) {
                rope(&queries[i * Q], c.heads, D, start + i, c.rope_theta);
                rope(k.data(), c.kv_heads, D, start + i, c.rope_theta);
            }
            for (int64_t kh = 0; kh < c.kv_heads; ++kh) {
                std::copy(k.begin() + kh * D, k.begin() + (kh + 1) * D, cache.key(seq, l, shard_.kv_head_offset + kh, start + i));
                std::copy(v.begin() + kh * D, v.begin() + (kh + 1) * D, cache.value(seq, l, shard_.kv_head_offset + kh, start + i));
            }
        }
        for (int64_t i = 0; i < n; ++i) {
            float* xi = &x[i * H];
            attention(cache, seq, l, start + i, &queries[i * Q], att.data());
            matvec(att.data(), L.wo, &L.bo, Q, H, proj.data());
            if (shard_.all_reduce) shard_.all_reduce(proj);  // tensor parallel: sum the shards' partial outputs
            for (int64_t j = 0; j < H; ++j) xi[j] += proj[j];
            layerNorm(xi, L.norm2_w, L.norm2_b, H, c.norm_eps, rms, h.data());
            if (rms) {  // SwiGLU
                matvec(h.data(), L.w_gate, nullptr, H, I, gate.data());
                matvec(h.data(), L.w_up, nullptr, H, I, up.data());
                for (int64_t j = 0; j < I; ++j) up[j] *= gate[j] / (1.f + std::exp(-gate[j]));
            } else {  // GELU (tanh approximation, GPT-2's gelu_new)
                matvec(h.data(), L.w_up, &L.b_up, H, I, up.data());
                for (int64_t j = 0; j < I; ++j) up[j] = 0.5f * up[j] * (1.f + std::tanh(0.7978845608f * (up[j] + 0.044715f * up[j] * up[j] * up[j])));
            }
            matvec(up.data(), L.w_down, &L.b_down, I, H, proj.data());
            if (shard_.all_reduce) shard_.all_reduce(proj);
            for (int64_t j = 0; j < H; ++j) xi[j] += proj[j];
        }
    }
    if (shard_.appends) cache.append(seq, tokens);
    const int64_t first = all_logits ? 0 : n - 1;
    std::vector<float> logits((n - first) * c.vocab);
    for (int64_t i = first; i < n; ++i) {
        layerNorm(&x[i * H], final_w_, final_b_, H, c.norm_eps, rms, h.data());
        matvec(h.data(), lm_head_, nullptr, H, c.vocab, &logits[(i - first) * c.vocab]);
    }
    return logits;
}

}  // namespace kiln::llm
