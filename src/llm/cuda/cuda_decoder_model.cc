#include "llm/cuda/cuda_decoder_model.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/cuda_executor.h"
#include "ir/half.h"
#include "llm/cuda/argmax_key.h"
#include "llm/cuda/decoder_kernels.h"
#include "llm/cuda/step_profiler.h"
#include "llm/cuda/step_timeline.h"
#include "llm/decoder_model.h"
#include "llm/onnx_decoder.h"

namespace kiln::llm {

namespace {

#define KILN_BLAS_CHECK(call)                                                                                        \
    do {                                                                                                             \
        const cublasStatus_t kiln_blas_ = (call);                                                                    \
        if (kiln_blas_ != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS error in ") + #call + ": " + cublasGetStatusString(kiln_blas_)); \
    } while (0)

using ::kiln::cuda::DeviceBuffer;
using ::kiln::cuda::PinnedBuffer;

// A weight in f16, optionally transposed from [rows][cols] to [cols][rows].
std::vector<uint16_t> halfBits(const Tensor& t, bool transpose = false) {
    const int64_t n = t.numel();
    std::vector<uint16_t> out(static_cast<size_t>(n));
    if (t.dtype() == DType::F16 && !transpose) {
        std::memcpy(out.data(), t.raw(), out.size() * 2);
        return out;
    }
    const int64_t rows = transpose ? t.dims()[0] : 1, cols = transpose ? t.dims()[1] : n;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[transpose ? c * rows + r : r * cols + c] = Half::fromFloat(static_cast<float>(t.scalarAt(r * cols + c)));
    return out;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T));
    KILN_CUDA_CHECK(cudaMemcpy(b.ptr, host.data(), b.bytes, cudaMemcpyHostToDevice));
    return b;
}

std::vector<uint16_t> concatRows(std::initializer_list<std::vector<uint16_t>> parts) {
    std::vector<uint16_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

// Rows of a [rows][cols] matrix in pairs: new rows 2p and 2p + 1 are old rows first(p) and
// second(p), the interleaved order the decoder kernels read (decoder_kernels.h).
template <class First, class Second>
std::vector<uint16_t> interleaveRows(const std::vector<uint16_t>& m, int64_t cols, int64_t pairs, First first, Second second) {
    std::vector<uint16_t> out(m.size());
    for (int64_t p = 0; p < pairs; ++p) {
        std::memcpy(out.data() + (2 * p) * cols, m.data() + first(p) * cols, cols * 2);
        std::memcpy(out.data() + (2 * p + 1) * cols, m.data() + second(p) * cols, cols * 2);
    }
    return out;
}

// q|k|v rows (heads of size D) as (h*D + i, h*D + i + D/2) pairs.
std::vector<uint16_t> interleaveHeadHalves(const std::vector<uint16_t>& m, int64_t cols, int64_t D) {
    const int64_t half = D / 2, pairs = static_cast<int64_t>(m.size()) / cols / 2;
    return interleaveRows(m, cols, pairs, [&](int64_t p) { return p / half * D + p % half; }, [&](int64_t p) { return p / half * D + p % half + half; });
}

// gate|up rows ([2I][cols]) as (gate j, up j) pairs.
std::vector<uint16_t> interleaveGateUp(const std::vector<uint16_t>& m, int64_t cols, int64_t I) {
    return interleaveRows(m, cols, I, [](int64_t j) { return j; }, [&](int64_t j) { return I + j; });
}

struct LayerWeights {
    DeviceBuffer norm1_w, norm1_b, norm2_w, norm2_b;  // f32
    DeviceBuffer qkv, qkv_b, o, o_b, up, up_b, down, down_b;  // f16, matrices [out][in]
};

// Per-step activation buffers, sized for a token and chunk capacity.
struct Activations {
    int64_t tokens = 0, chunks = 0;
    DeviceBuffer x, h, qkv, q, att, proj, mlp, mlp_act, logits, ids, meta;
};

class CudaDecoderModel : public LanguageModel {
public:
    CudaDecoderModel(const DecoderConfig& c, const std::map<std::string, Tensor>& w, CudaDecoderOptions options) : config_(c), options_(options) {
        std::string why;
        check(::kiln::cuda::deviceAvailable(&why), "--target cuda: " + why);
        check(c.head_dim == 64 || c.head_dim == 128, "the GPU decoder supports head_dim 64 or 128, this model has " + std::to_string(c.head_dim));
        check(c.heads % c.kv_heads == 0, "heads must be a multiple of kv_heads");
        cudaDeviceProp prop{};
        KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        device_ = prop.name;
        KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        KILN_BLAS_CHECK(cublasCreate(&blas_));
        KILN_BLAS_CHECK(cublasSetStream(blas_, stream_));
        blas_workspace_ = DeviceBuffer(32u << 20);  // fixed, so captured graphs never see cuBLAS allocate
        KILN_BLAS_CHECK(cublasSetWorkspace(blas_, blas_workspace_.ptr, blas_workspace_.bytes));
        loadWeights(w);
        // The fused small GEMM needs 16-byte rows and its input rows in shared memory.
        const int64_t max_k = std::max({c.hidden, c.heads * c.head_dim, c.intermediate});
        small_gemm_ = options.small_gemm && c.hidden % 8 == 0 && (c.heads * c.head_dim) % 8 == 0 && c.intermediate % 8 == 0 &&
                      cuda::prepareSmallGemm(static_cast<int>(max_k), static_cast<int>(c.hidden));
        sms_ = prop.multiProcessorCount;
        // Split-key attention applies below two CTAs per SM: (token, head) pairs up to 2 x SMs.
        attention_scratch_.sms = prop.multiProcessorCount;
        attention_scratch_.capacity = 2 * prop.multiProcessorCount;
        attention_partials_ = DeviceBuffer(size_t(attention_scratch_.capacity) * cuda::kMaxAttentionSplits * (c.head_dim + 2) * 4);
        attention_counters_ = DeviceBuffer(size_t(attention_scratch_.capacity) * 4);
        KILN_CUDA_CHECK(cudaMemset(attention_counters_.ptr, 0, attention_counters_.bytes));
        attention_scratch_.partials = attention_partials_.as<float>();
        attention_scratch_.counters = attention_counters_.as<int>();
    }
    ~CudaDecoderModel() override {
        for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g.exec);
        if (blas_) cublasDestroy(blas_);
        if (stream_) cudaStreamDestroy(stream_);
    }

    const DecoderConfig& config() const override { return config_; }
    std::string device() const override { return device_; }

    PagedKvCache makeCache(int64_t block_size, int64_t num_blocks) const override {
        PagedKvCache cache(config_.layers, config_.kv_heads, config_.head_dim, block_size, num_blocks, false);
        const size_t bytes = static_cast<size_t>(config_.layers * 2 * num_blocks * config_.kv_heads * block_size * config_.head_dim) * 2;
        void* p = nullptr;
        KILN_CUDA_CHECK(cudaMalloc(&p, bytes));
        cache.device_storage = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
        return cache;
    }

    std::vector<float> forwardBatch(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const override {
        const int64_t S = run(cache, chunks, false);
        const size_t V = static_cast<size_t>(config_.vocab);
        const float* logits = pinned_logits_.as<float>();
        return std::vector<float>(logits, logits + S * V);
    }

    std::vector<int64_t> forwardBatchArgmax(PagedKvCache& cache, std::span<const SequenceChunk> chunks) const override {
        const int64_t S = run(cache, chunks, true);
        std::vector<int64_t> out(static_cast<size_t>(S));
        for (int64_t r = 0; r < S; ++r)
            out[r] = argmax_keys_ ? cuda::argmaxKeyIndex(pinned_logits_.as<unsigned long long>()[r]) : pinned_logits_.as<int32_t>()[r];
        return out;
    }

private:
    // One step: uploads the metadata, runs (or replays) the step and copies back the logits,
    // or with `argmax` each chunk's argmax id, to pinned_logits_; appends the chunks to the
    // cache. Returns the chunk count.
    int64_t run(PagedKvCache& cache, std::span<const SequenceChunk> chunks, bool argmax) const {
        check(cache.device_storage != nullptr, "the GPU decoder needs a KV cache made by its makeCache");
        const int64_t S = static_cast<int64_t>(chunks.size());
        int64_t T = 0;
        for (const auto& c : chunks) T += static_cast<int64_t>(c.tokens.size());
        check(S > 0 && T > 0, "forwardBatch needs at least one token");
        const int64_t bs = cache.blockSize();
        const int max_blocks = static_cast<int>(std::min<int64_t>((config_.max_positions + bs - 1) / bs, cache.numBlocks()));
        ensureCapacity(T, S, max_blocks);
        // Metadata, one int32 upload: tokens, positions, slots, token_chunk [T], last [S], tables [S][max_blocks].
        int32_t* tok = pinned_meta_.as<int32_t>();
        int32_t *pos = tok + T, *slot = pos + T, *chunk_of = slot + T, *last = chunk_of + T, *tables = last + S;
        int64_t row = 0;
        for (int64_t s = 0; s < S; ++s) {
            const auto& c = chunks[s];
            const int64_t start = cache.length(c.seq);
            const auto table = cache.blockTable(c.seq);
            checkChunk(config_, cache, c.seq, c.tokens, true);  // block tables hold max_positions tokens
            check(static_cast<int64_t>(table.size()) <= max_blocks, "sequence needs more KV blocks than a block table holds");
            for (size_t i = 0; i < c.tokens.size(); ++i, ++row) {
                const int64_t p = start + static_cast<int64_t>(i);
                tok[row] = static_cast<int32_t>(c.tokens[i]);
                pos[row] = static_cast<int32_t>(p);
                slot[row] = static_cast<int32_t>(table[p / bs] * bs + p % bs);
                chunk_of[row] = static_cast<int32_t>(s);
            }
            last[s] = static_cast<int32_t>(row - 1);
            std::memset(tables + s * max_blocks, 0, sizeof(int32_t) * max_blocks);
            std::memcpy(tables + s * max_blocks, table.data(), sizeof(int32_t) * table.size());
        }
        const size_t meta_ints = static_cast<size_t>(4 * T + S + S * max_blocks);
        profiler_.stepBegin(stream_);
        timeline_.stepBegin(stream_);
        KILN_CUDA_CHECK(cudaMemcpyAsync(act_.meta.ptr, pinned_meta_.ptr, meta_ints * 4, cudaMemcpyHostToDevice, stream_));
        const bool decode_only = T == S;
        void* pool = cache.device_storage.get();
        // A batch size's first decode step runs eagerly (kernels and cuBLAS load lazily, which a
        // capture must not see); the second is captured, later ones replay.
        const std::pair<int64_t, bool> shape{S, argmax};  // graphs and first runs per (batch size, argmax)
        const bool replay = decode_only && options_.cuda_graphs && profiler_.mode() != cuda::StepProfiler::Mode::Stages && !eager_sizes_.insert(shape).second;
        if (replay) {
            auto it = graphs_.find(shape);
            if (it == graphs_.end() || it->second.pool != pool || it->second.max_blocks != max_blocks || it->second.block_size != bs) {
                if (it != graphs_.end()) cudaGraphExecDestroy(it->second.exec), graphs_.erase(it);
                cudaGraph_t graph;
                KILN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
                try {
                    compute(T, S, max_blocks, bs, pool, cache.numBlocks(), argmax);
                } catch (...) {
                    cudaStreamEndCapture(stream_, &graph);
                    throw;
                }
                KILN_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
                Captured cap{nullptr, pool, max_blocks, bs};
                KILN_CUDA_CHECK(cudaGraphInstantiate(&cap.exec, graph, 0));
                cudaGraphDestroy(graph);
                it = graphs_.emplace(shape, cap).first;
            }
            KILN_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
        } else {
            compute(T, S, max_blocks, bs, pool, cache.numBlocks(), argmax);
        }
        const size_t V = static_cast<size_t>(config_.vocab);
        profiler_.stage(stream_, "logits copy");
        argmax_keys_ = argmax && fusedArgmax(T);
        KILN_CUDA_CHECK(cudaMemcpyAsync(pinned_logits_.ptr, argmax ? act_.ids.ptr : act_.logits.ptr, argmax ? S * (argmax_keys_ ? 8 : 4) : S * V * 4,
                                        cudaMemcpyDeviceToHost, stream_));
        profiler_.stepEnd(stream_);
        KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
        profiler_.stepDone(decode_only);
        timeline_.stepDone(decode_only);
        for (const auto& c : chunks) cache.append(c.seq, c.tokens);
        return S;
    }

    struct Captured {
        cudaGraphExec_t exec;
        void* pool;
        int max_blocks;
        int64_t block_size;
    };

    void gemm(int64_t rows, int64_t out, int64_t in, const DeviceBuffer& w, const void* x, void* y, bool f32_out = false) const {
        const float one = 1.f, zero = 0.f;
        // y[rows][out] = x[rows][in] * w[out][in]^T (column-major: y^T = w * x^T)
        KILN_BLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows), static_cast<int>(in), &one, w.ptr,
                                     CUDA_R_16F, static_cast<int>(in), x, CUDA_R_16F, static_cast<int>(in), &zero, y, f32_out ? CUDA_R_32F : CUDA_R_16F,
                                     static_cast<int>(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }

    // A linear layer's input: a norm of residual-stream rows, or f16 rows.
    struct LinearIn {
        cuda::SmallGemmInput::Kind kind;
        const void* x;  // the f32 stream for Norm, else f16 rows
        const float *norm_w = nullptr, *norm_b = nullptr;
        const int32_t* row_map = nullptr;
    };

    // One linear layer of `rows` token rows. Decode-size batches run the fused small GEMM
    // (prologue and epilogue inside); larger ones run the norm kernel, cuBLAS, then the
    // epilogue's kernel (q|k|v to the cache, MLP activation), and leave a residual add
    // pending for the next norm, which adds it in the same pass. `small` is decided once
    // per step: the two paths leave the residual stream in different states.
    // next_weights: the bytes of weights the next kernel streams (0: it streams none).
    void linear(bool small, int64_t rows, int64_t N, int64_t K, const DeviceBuffer& W, const LinearIn& in, const cuda::SmallGemmOutput& out,
                const char* stage, int64_t next_weights = 0) const {
        using Out = cuda::SmallGemmOutput;
        const DecoderConfig& c = config_;
        const bool llama = c.family == Family::Llama;
        profiler_.stage(stream_, stage);
        if (skipped(stage)) return;
        if (small) {
            cuda::SmallGemmInput si;
            si.kind = in.kind;
            if (in.kind == cuda::SmallGemmInput::Norm) {
                si.residual = static_cast<const float*>(in.x), si.row_map = in.row_map, si.norm_w = in.norm_w, si.norm_b = in.norm_b;
                si.eps = c.norm_eps, si.rms = llama;
            } else {
                si.x = static_cast<const __half*>(in.x);
            }
            cuda::launchSmallGemm(static_cast<int>(rows), static_cast<int>(N), static_cast<int>(K), W.as<__half>(), si, out, next_weights, sms_, stream_);
            return;
        }
        const void* x = in.x;
        if (in.kind == cuda::SmallGemmInput::Norm) {
            cuda::launchAddNorm(static_cast<int>(rows), static_cast<int>(K), in.row_map, act_.x.as<float>(), pending_.add, pending_.bias, in.norm_w,
                                in.norm_b, c.norm_eps, llama, act_.h.as<__half>(), stream_);
            pending_ = {};
            x = act_.h.ptr;
        }
        switch (out.kind) {
            case Out::Half: gemm(rows, N, K, W, x, out.y); break;
            case Out::Float: gemm(rows, N, K, W, x, out.y, true); break;
            case Out::AddToResidual:
                gemm(rows, N, K, W, x, act_.proj.ptr);
                pending_ = {act_.proj.as<__half>(), out.bias};
                break;
            case Out::Qkv:
                gemm(rows, N, K, W, x, act_.qkv.ptr);
                cuda::launchQkvToCache(static_cast<int>(rows), act_.qkv.as<__half>(), out.qkv, stream_);
                break;
            case Out::GeluBias:
            case Out::SwiGlu: {
                const bool swiglu = out.kind == Out::SwiGlu;
                gemm(rows, N, K, W, x, act_.mlp.ptr);
                cuda::launchMlpActivation(static_cast<int>(rows), static_cast<int>(swiglu ? N / 2 : N), act_.mlp.as<__half>(), out.bias, swiglu,
                                          static_cast<__half*>(out.y), stream_);
                break;
            }
        }
    }

    static cuda::SmallGemmOutput outputTo(cuda::SmallGemmOutput::Kind kind, void* y, const __half* bias = nullptr) {
        cuda::SmallGemmOutput out;
        out.kind = kind, out.y = y, out.bias = bias;
        return out;
    }

    // Steps of a few tokens run the fused small GEMMs (decided per step: see linear).
    bool smallSteps(int64_t T) const { return T <= cuda::kSmallGemmMaxRows && small_gemm_; }
    // Their greedy steps take the argmax in the LM head's epilogue instead of a kernel of its
    // own (llm.cuda.fused_argmax=off keeps the kernel).
    bool fusedArgmax(int64_t T) const { return options_.knobs.fused_argmax && smallSteps(T); }

    // The whole step on stream_, reading metadata from act_.meta (capturable).
    void compute(int64_t T, int64_t S, int max_blocks, int64_t bs, void* pool, int64_t num_blocks, bool argmax) const {
        const cuda::StepKnobs knobs(options_.knobs);  // the launches below read them
        using In = cuda::SmallGemmInput;
        using Out = cuda::SmallGemmOutput;
        const DecoderConfig& c = config_;
        const int64_t H = c.hidden, D = c.head_dim, Q = c.heads * D, KV = c.kv_heads * D, I = c.intermediate;
        const bool llama = c.family == Family::Llama;
        const int32_t* meta = act_.meta.as<int32_t>();
        cuda::StepMeta m{meta, meta + T, meta + 2 * T, meta + 3 * T, meta + 4 * T, meta + 4 * T + S, max_blocks};
        const int Ti = static_cast<int>(T);
        float* x = act_.x.as<float>();
        pending_ = {};
        const bool small = smallSteps(T);
        const bool fused_argmax = argmax && fusedArgmax(T);
        if (fused_argmax) KILN_CUDA_CHECK(cudaMemsetAsync(act_.ids.ptr, 0, S * 8, stream_));  // the LM head's argmax keys
        profiler_.stage(stream_, "embed");
        cuda::launchEmbed(Ti, static_cast<int>(H), m, embed_.as<__half>(), llama ? nullptr : positions_.as<__half>(), x, stream_);
        const size_t layer_elems = static_cast<size_t>(num_blocks * c.kv_heads * bs * D);  // keys (or values) of one layer
        for (int64_t l = 0; l < c.layers; ++l) {
            const LayerWeights& L = layers_[l];
            __half* base = static_cast<__half*>(pool) + 2 * l * layer_elems;
            Out qkv = outputTo(Out::Qkv, nullptr);
            qkv.qkv = {m, {base, base + layer_elems, static_cast<int>(c.kv_heads), static_cast<int>(D), static_cast<int>(bs)}, static_cast<int>(c.heads),
                       llama, c.rope_theta, L.qkv_b.as<__half>(), act_.q.as<__half>()};
            linear(small, T, Q + 2 * KV, H, L.qkv, {In::Norm, x, L.norm1_w.as<float>(), L.norm1_b.as<float>()}, qkv, "qkv+rope+cache");
            profiler_.stage(stream_, "attention");
            if (!skipped("attention"))
                cuda::launchPagedAttention(Ti, static_cast<int>(c.heads), act_.q.as<__half>(), m, qkv.qkv.kv, 1.f / std::sqrt(static_cast<float>(D)),
                                           attention_scratch_, act_.att.as<__half>(), stream_);
            linear(small, T, H, Q, L.o, {In::Plain, act_.att.ptr}, outputTo(Out::AddToResidual, x, L.o_b.as<__half>()), "o", L.up.bytes);
            linear(small, T, llama ? 2 * I : I, H, L.up, {In::Norm, x, L.norm2_w.as<float>(), L.norm2_b.as<float>()},
                   outputTo(llama ? Out::SwiGlu : Out::GeluBias, act_.mlp_act.ptr, L.up_b.as<__half>()), "up+activation", L.down.bytes);
            linear(small, T, H, I, L.down, {In::Plain, act_.mlp_act.ptr}, outputTo(Out::AddToResidual, x, L.down_b.as<__half>()), "down",
                   l + 1 < c.layers ? layers_[l + 1].qkv.bytes : lm_head_->bytes);
        }
        // Only each chunk's last token needs logits: final norm of those rows, LM head.
        Out logits = outputTo(Out::Float, act_.logits.ptr);
        if (fused_argmax) logits.argmax_keys = act_.ids.as<unsigned long long>();
        linear(small, S, c.vocab, H, *lm_head_, {In::Norm, x, final_w_.as<float>(), final_b_.as<float>(), m.last_token}, logits, "lm head");
        if (argmax && !fused_argmax) cuda::launchArgmax(static_cast<int>(S), static_cast<int>(c.vocab), act_.logits.as<float>(), act_.ids.as<int32_t>(), stream_);
        KILN_CUDA_CHECK(cudaGetLastError());
    }

    // Stages left out of the step for timing experiments (KILN_LLM_SKIP=attention,o,...):
    // the output is wrong then; the difference in step time is what the stage costs.
    static bool skipped(const std::string& stage) {
        static const std::string skip = [] {
            const char* v = std::getenv("KILN_LLM_SKIP");
            return v && *v ? "," + std::string(v) + "," : std::string();
        }();
        return !skip.empty() && skip.find("," + stage + ",") != std::string::npos;
    }

    void ensureCapacity(int64_t T, int64_t S, int max_blocks) const {
        const DecoderConfig& c = config_;
        if (T > act_.tokens || S > act_.chunks || max_blocks > max_blocks_) {
            const int64_t t = std::max({T, 2 * act_.tokens, int64_t{64}}), s = std::max({S, 2 * act_.chunks, int64_t{8}});
            const int64_t H = c.hidden, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim, I = c.intermediate;
            for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g.exec);
            graphs_.clear();
            eager_sizes_.clear();
            KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
            act_ = Activations{};
            act_.tokens = t, act_.chunks = s;
            act_.x = DeviceBuffer(t * H * 4);
            act_.h = DeviceBuffer(t * H * 2);
            act_.qkv = DeviceBuffer(t * (Q + 2 * KV) * 2);
            act_.q = DeviceBuffer(t * Q * 2);
            act_.att = DeviceBuffer(t * Q * 2);
            act_.proj = DeviceBuffer(t * H * 2);
            act_.mlp = DeviceBuffer(t * 2 * I * 2);
            act_.mlp_act = DeviceBuffer(t * I * 2);
            act_.logits = DeviceBuffer(s * c.vocab * 4);
            act_.ids = DeviceBuffer(s * 8);  // int32 ids, or the LM head's 64-bit argmax keys
            max_blocks_ = std::max(max_blocks_, max_blocks);
            act_.meta = DeviceBuffer((4 * t + s + s * max_blocks_) * 4);
            pinned_meta_.ensure((4 * t + s + s * max_blocks_) * 4);
            pinned_logits_.ensure(s * c.vocab * 4);
        }
    }

    void loadWeights(const std::map<std::string, Tensor>& w) {
        const DecoderConfig& c = config_;
        const int64_t H = c.hidden, D = c.head_dim, Q = c.heads * D, KV = c.kv_heads * D, I = c.intermediate;
        if (c.family == Family::Gpt2) {
            const std::vector<std::string> p = {"transformer.", ""};
            embed_ = upload(halfBits(findWeight(w, p, "wte.weight", {c.vocab, H})));
            positions_ = upload(halfBits(findWeight(w, p, "wpe.weight", {c.max_positions, H})));
            final_w_ = upload(toFloats(findWeight(w, p, "ln_f.weight", {H})));
            final_b_ = upload(toFloats(findWeight(w, p, "ln_f.bias", {H})));
            for (int64_t l = 0; l < c.layers; ++l) {
                const std::string n = "h." + std::to_string(l) + ".";
                LayerWeights L;
                L.norm1_w = upload(toFloats(findWeight(w, p, n + "ln_1.weight", {H})));
                L.norm1_b = upload(toFloats(findWeight(w, p, n + "ln_1.bias", {H})));
                L.norm2_w = upload(toFloats(findWeight(w, p, n + "ln_2.weight", {H})));
                L.norm2_b = upload(toFloats(findWeight(w, p, n + "ln_2.bias", {H})));
                // GPT-2's Conv1D stores [in][out]: transposed to [out][in] (q|k|v rows stay in order).
                L.qkv = upload(interleaveHeadHalves(halfBits(findWeight(w, p, n + "attn.c_attn.weight", {H, 3 * H}), true), H, D));
                L.qkv_b = upload(halfBits(findWeight(w, p, n + "attn.c_attn.bias", {3 * H})));
                L.o = upload(halfBits(findWeight(w, p, n + "attn.c_proj.weight", {H, H}), true));
                L.o_b = upload(halfBits(findWeight(w, p, n + "attn.c_proj.bias", {H})));
                L.up = upload(halfBits(findWeight(w, p, n + "mlp.c_fc.weight", {H, I}), true));
                L.up_b = upload(halfBits(findWeight(w, p, n + "mlp.c_fc.bias", {I})));
                L.down = upload(halfBits(findWeight(w, p, n + "mlp.c_proj.weight", {I, H}), true));
                L.down_b = upload(halfBits(findWeight(w, p, n + "mlp.c_proj.bias", {H})));
                layers_.push_back(std::move(L));
            }
            lm_head_ = &embed_;  // tied
        } else {
            const std::vector<std::string> p = {"model.", ""};
            embed_ = upload(halfBits(findWeight(w, p, "embed_tokens.weight", {c.vocab, H})));
            final_w_ = upload(toFloats(findWeight(w, p, "norm.weight", {H})));
            for (int64_t l = 0; l < c.layers; ++l) {
                const std::string n = "layers." + std::to_string(l) + ".";
                LayerWeights L;
                L.norm1_w = upload(toFloats(findWeight(w, p, n + "input_layernorm.weight", {H})));
                L.norm2_w = upload(toFloats(findWeight(w, p, n + "post_attention_layernorm.weight", {H})));
                L.qkv = upload(interleaveHeadHalves(concatRows({halfBits(findWeight(w, p, n + "self_attn.q_proj.weight", {Q, H})),
                                                                halfBits(findWeight(w, p, n + "self_attn.k_proj.weight", {KV, H})),
                                                                halfBits(findWeight(w, p, n + "self_attn.v_proj.weight", {KV, H}))}),
                                                    H, D));
                L.o = upload(halfBits(findWeight(w, p, n + "self_attn.o_proj.weight", {H, Q})));
                L.up = upload(interleaveGateUp(concatRows({halfBits(findWeight(w, p, n + "mlp.gate_proj.weight", {I, H})),
                                                           halfBits(findWeight(w, p, n + "mlp.up_proj.weight", {I, H}))}),
                                               H, I));
                L.down = upload(halfBits(findWeight(w, p, n + "mlp.down_proj.weight", {H, I})));
                layers_.push_back(std::move(L));
            }
            const bool tied = c.tie_embeddings || !w.count("lm_head.weight");
            if (tied) lm_head_ = &embed_;
            else separate_head_ = upload(halfBits(findWeight(w, {""}, "lm_head.weight", {c.vocab, H}))), lm_head_ = &separate_head_;
        }
    }

    DecoderConfig config_;
    CudaDecoderOptions options_;
    std::string device_;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    DeviceBuffer blas_workspace_, embed_, positions_, final_w_, final_b_, separate_head_;
    const DeviceBuffer* lm_head_ = nullptr;
    std::vector<LayerWeights> layers_;
    // Step state: the scheduler runs one step at a time.
    mutable Activations act_;
    mutable int max_blocks_ = 0;
    mutable PinnedBuffer pinned_meta_, pinned_logits_;
    mutable std::map<std::pair<int64_t, bool>, Captured> graphs_;  // by (batch size, argmax)
    mutable std::set<std::pair<int64_t, bool>> eager_sizes_;      // decode shapes that ran once without a graph
    mutable cuda::StepProfiler profiler_;
    mutable cuda::StepTimeline timeline_;
    // The cuBLAS path's residual add not yet done: the next norm adds it.
    struct PendingAdd {
        const __half* add = nullptr;
        const __half* bias = nullptr;
    };
    mutable PendingAdd pending_;
    bool small_gemm_ = false;
    mutable bool argmax_keys_ = false;  // the last argmax step left keys (fused), not ids
    int sms_ = 0;
    DeviceBuffer attention_partials_, attention_counters_;
    cuda::AttentionScratch attention_scratch_;
};

}  // namespace

std::unique_ptr<LanguageModel> makeCudaDecoderModel(const DecoderConfig& config, const std::map<std::string, Tensor>& weights, CudaDecoderOptions options) {
    return std::make_unique<CudaDecoderModel>(config, weights, options);
}

std::unique_ptr<LanguageModel> loadCudaDecoderModel(const std::filesystem::path& dir, CudaDecoderOptions options) {
    DecoderWeights w = loadDecoderWeights(dir);
    return makeCudaDecoderModel(w.config, w.weights, options);
}

}  // namespace kiln::llm
