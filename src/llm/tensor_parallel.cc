#include "llm/tensor_parallel.h"

#include <barrier>
#include <cstring>
#include <thread>

#include "ir/error.h"
#include "llm/onnx_decoder.h"

namespace kiln::llm {

namespace {

using Weights = std::map<std::string, Tensor>;

// Rows [r0, r0 + rows) of a 2-D tensor (or elements of a 1-D one), as f32.
Tensor rowsOf(const Tensor& t, int64_t r0, int64_t rows) {
    const int64_t cols = t.rank() == 2 ? t.dims()[1] : 1;
    Tensor out(DType::F32, t.rank() == 2 ? Dims{rows, cols} : Dims{rows});
    for (int64_t i = 0; i < rows * cols; ++i) out.data<float>()[i] = static_cast<float>(t.scalarAt(r0 * cols + i));
    return out;
}

// Column groups of a 2-D [rows][cols] tensor (or a 1-D one): for each (start, count), those columns, side by side.
Tensor columnsOf(const Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& groups) {
    const bool matrix = t.rank() == 2;
    const int64_t rows = matrix ? t.dims()[0] : 1, cols = matrix ? t.dims()[1] : t.dims()[0];
    int64_t width = 0;
    for (auto [s, n] : groups) width += n;
    Tensor out(DType::F32, matrix ? Dims{rows, width} : Dims{width});
    for (int64_t r = 0; r < rows; ++r) {
        int64_t o = 0;
        for (auto [s, n] : groups)
            for (int64_t c = 0; c < n; ++c) out.data<float>()[r * width + o++] = static_cast<float>(t.scalarAt(r * cols + s + c));
    }
    return out;
}

Tensor zerosLike(const Tensor& t) {
    Tensor out(DType::F32, t.dims());
    std::memset(out.raw(), 0, static_cast<size_t>(out.numel()) * sizeof(float));
    return out;
}

}  // namespace

DecoderConfig shardConfig(const DecoderConfig& c, int world) {
    check(world >= 1, "--tp must be at least 1");
    check(c.heads % world == 0 && c.kv_heads % world == 0 && c.intermediate % world == 0,
          "--tp " + std::to_string(world) + " does not divide the model's " + std::to_string(c.heads) + " heads, " + std::to_string(c.kv_heads) +
              " key/value heads and MLP width " + std::to_string(c.intermediate));
    DecoderConfig s = c;
    s.heads /= world, s.kv_heads /= world, s.intermediate /= world;
    return s;
}

Weights shardWeights(const DecoderConfig& c, const Weights& w, int rank, int world) {
    const DecoderConfig s = shardConfig(c, world);
    const int64_t D = c.head_dim, Q = c.heads * D, Qs = s.heads * D, KVs = s.kv_heads * D, Is = s.intermediate;
    Weights out;
    for (const auto& [k, v] : w) out[k] = v;  // replicated unless replaced below
    auto replace = [&](const std::vector<std::string>& prefixes, const std::string& n, auto make) {
        const std::string name = findWeightName(w, prefixes, n);
        out[name] = make(w.at(name));
    };
    for (int64_t l = 0; l < c.layers; ++l) {
        if (c.family == Family::Gpt2) {
            const std::vector<std::string> p = {"transformer.", ""};
            const std::string n = "h." + std::to_string(l) + ".";
            // Conv1D [in][out]: c_attn's columns are q | k | v, each split by heads.
            const std::vector<std::pair<int64_t, int64_t>> qkv = {{rank * Qs, Qs}, {Q + rank * Qs, Qs}, {2 * Q + rank * Qs, Qs}};
            replace(p, n + "attn.c_attn.weight", [&](const Tensor& t) { return columnsOf(t, qkv); });
            replace(p, n + "attn.c_attn.bias", [&](const Tensor& t) { return columnsOf(t, qkv); });
            replace(p, n + "attn.c_proj.weight", [&](const Tensor& t) { return rowsOf(t, rank * Qs, Qs); });
            replace(p, n + "mlp.c_fc.weight", [&](const Tensor& t) { return columnsOf(t, {{rank * Is, Is}}); });
            replace(p, n + "mlp.c_fc.bias", [&](const Tensor& t) { return columnsOf(t, {{rank * Is, Is}}); });
            replace(p, n + "mlp.c_proj.weight", [&](const Tensor& t) { return rowsOf(t, rank * Is, Is); });
            for (const char* b : {"attn.c_proj.bias", "mlp.c_proj.bias"})
                if (rank > 0) replace(p, n + b, zerosLike);
        } else {
            const std::vector<std::string> p = {"model.", ""};
            const std::string n = "layers." + std::to_string(l) + ".";
            // nn.Linear [out][in]: column-parallel layers take rows, row-parallel ones columns.
            replace(p, n + "self_attn.q_proj.weight", [&](const Tensor& t) { return rowsOf(t, rank * Qs, Qs); });
            replace(p, n + "self_attn.k_proj.weight", [&](const Tensor& t) { return rowsOf(t, rank * KVs, KVs); });
            replace(p, n + "self_attn.v_proj.weight", [&](const Tensor& t) { return rowsOf(t, rank * KVs, KVs); });
            replace(p, n + "self_attn.o_proj.weight", [&](const Tensor& t) { return columnsOf(t, {{rank * Qs, Qs}}); });
            replace(p, n + "mlp.gate_proj.weight", [&](const Tensor& t) { return rowsOf(t, rank * Is, Is); });
            replace(p, n + "mlp.up_proj.weight", [&](const Tensor& t) { return rowsOf(t, rank * Is, Is); });
            replace(p, n + "mlp.down_proj.weight", [&](const Tensor& t) { return columnsOf(t, {{rank * Is, Is}}); });
        }
    }
    return out;
}

// Sum of every shard's buffer, in rank order (so every shard gets bit-identical results).
struct TensorParallelCpuModel::Reducer {
    explicit Reducer(int world) : parts(world), sync(world) {}
    void allReduce(int rank, std::span<float> v) {
        parts[rank].assign(v.begin(), v.end());
        sync.arrive_and_wait();
        for (size_t i = 0; i < v.size(); ++i) {
            float s = 0;
            for (const auto& p : parts) s += p[i];
            v[i] = s;
        }
        sync.arrive_and_wait();  // nobody overwrites its part before all have read
    }
    std::vector<std::vector<float>> parts;
    std::barrier<> sync;
};

TensorParallelCpuModel::TensorParallelCpuModel(const DecoderConfig& c, const Weights& w, int world)
    : config_(c), world_(world), reducer_(std::make_unique<Reducer>(world)) {
    const DecoderConfig s = shardConfig(c, world);
    for (int r = 0; r < world; ++r) {
        shards_.push_back(std::make_unique<DecoderModel>(s, shardWeights(c, w, r, world)));
        shards_.back()->setShardRole({r * s.kv_heads, [this, r](std::span<float> v) { reducer_->allReduce(r, v); }, false});
    }
}

TensorParallelCpuModel::~TensorParallelCpuModel() = default;

std::unique_ptr<TensorParallelCpuModel> TensorParallelCpuModel::load(const std::filesystem::path& dir, int world) {
    DecoderWeights w = loadDecoderWeights(dir);
    return std::make_unique<TensorParallelCpuModel>(w.config, w.weights, world);
}

PagedKvCache TensorParallelCpuModel::makeCache(int64_t block_size, int64_t num_blocks) const {
    return PagedKvCache(config_.layers, config_.kv_heads, config_.head_dim, block_size, num_blocks);
}

// One thread per rank for the whole step (rank 0 on the caller's): the ranks go through the
// chunks together, and a barrier's completion appends each chunk's tokens to the cache
// before any rank starts the next chunk.
std::vector<float> TensorParallelCpuModel::forwardBatch(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const {
    std::vector<std::vector<float>> out(chunks.size());  // rank 0's logits per chunk (every rank has the same)
    std::vector<std::string> errors(world_);
    std::string append_error;
    size_t done = 0;
    std::barrier chunk_done(world_, [&]() noexcept {
        try {
            cache.append(chunks[done].seq, chunks[done].tokens);
        } catch (const std::exception& e) {
            append_error = e.what();
        }
        ++done;
    });
    auto rank = [&](int r) {
        try {
            for (size_t i = 0; i < chunks.size(); ++i) {
                auto logits = shards_[r]->forward(cache, chunks[i].seq, chunks[i].tokens);
                if (r == 0) out[i] = std::move(logits);
                chunk_done.arrive_and_wait();
                if (!append_error.empty()) return;
            }
        } catch (const std::exception& e) {
            errors[r] = e.what();  // checks precede the first all-reduce, so every rank fails alike
        }
    };
    std::vector<std::thread> ranks;
    for (int r = 1; r < world_; ++r) ranks.emplace_back(rank, r);
    rank(0);
    for (auto& t : ranks) t.join();
    for (const auto& e : errors) check(e.empty(), e);
    check(append_error.empty(), append_error);
    std::vector<float> logits;
    for (const auto& o : out) logits.insert(logits.end(), o.begin(), o.end());
    return logits;
}

}  // namespace kiln::llm
