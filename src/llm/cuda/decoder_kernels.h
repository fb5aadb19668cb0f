// Kernels of the GPU decoder step (f16 storage, f32 math). Token rows of a step come from
// several sequences; per-token metadata (positions, cache slots, which chunk) is read from
// device arrays so that one captured CUDA graph serves every decode step of a batch size.
//
// Weight rows the kernels pair up are stored interleaved: the fused q|k|v projection as
// rows (h*D + i, h*D + i + D/2) for each head h and i < D/2, so one warp of the small GEMM
// holds both halves RoPE rotates together, and Llama's gate|up as rows (gate j, up j), so
// the SwiGLU product is made where the two dot products end.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "llm/cuda/decoder_knobs.h"

namespace kiln::llm::cuda {

// The knobs of the step this thread is enqueueing (or capturing): the model's, set by a
// StepKnobs for the span of its step; the defaults outside one.
const DecoderKnobs& stepKnobs();
class StepKnobs {
public:
    explicit StepKnobs(const DecoderKnobs& knobs);
    ~StepKnobs();
    StepKnobs(const StepKnobs&) = delete;
    StepKnobs& operator=(const StepKnobs&) = delete;

private:
    const DecoderKnobs* previous_;
};

// Device arrays describing one step: T tokens from S chunks.
struct StepMeta {
    const int32_t* tokens;        // [T]
    const int32_t* positions;     // [T] position in its sequence
    const int32_t* slots;         // [T] cache slot: block * block_size + offset
    const int32_t* token_chunk;   // [T] chunk of each token
    const int32_t* last_token;    // [S] row of each chunk's last token
    const int32_t* block_tables;  // [S][max_blocks]
    int max_blocks;
};

struct KvLayer {
    __half *k, *v;  // [block][kv_head][slot][head_dim]
    int kv_heads, head_dim, block_size;
};

// Where a step's q|k|v go: q rows to `q`, k and v into the paged cache at each token's slot,
// with rotary embeddings on q and k (Llama) and the projection's bias (GPT-2, may be null).
struct QkvDestination {
    StepMeta meta;
    KvLayer kv;
    int heads = 0;
    bool rope = false;
    float theta = 0.f;
    const __half* bias = nullptr;  // [(heads + 2 kv_heads) * D], in the original row order
    __half* q = nullptr;
};

// Kernels launched after the first of a step may start early (programmatic dependent
// launch, Hopper and later): each waits for its predecessor before reading its output, and
// meanwhile its launch and (in the small GEMM) its first weight loads overlap the
// predecessor's tail. On by default; llm.cuda.pdl=off turns it off.
bool programmaticLaunchEnabled();

// The decode step's timeline (KILN_LLM_PROFILE=timeline, step_timeline.h): thread 0 of each
// CTA of the decoder's kernels notes, in %globaltimer ns, when the CTA started, when its
// wait for the previous kernel returned and when it ended. Off (no sink) by default.
struct CtaTraceRecord {
    unsigned long long start, waited, end;
    int kind, n, k, grid;  // kind: CtaKind; n, k: the GEMM's N and K, or heads and tokens
};
enum CtaKind { kCtaEmbed = 1, kCtaAddNorm, kCtaSmallGemm, kCtaQkvToCache, kCtaAttention, kCtaMlpActivation, kCtaArgmax };
// Records go to records[atomicAdd(used, 1)] while below capacity; null records: off.
void setTraceSink(CtaTraceRecord* records, unsigned* used, unsigned capacity);

// x[t] = wte[token] (+ wpe[position]), f32 residual stream. The step's first kernel.
void launchEmbed(int T, int H, const StepMeta& m, const __half* wte, const __half* wpe, float* x, cudaStream_t s);
// For each output row r (token row_map[r], or r): x += add + bias (when add), then
// out[r] = LayerNorm/RMSNorm(x) * w (+ b).
void launchAddNorm(int rows, int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                   float eps, bool rms, __half* out, cudaStream_t s);
// Splits pair-interleaved q|k|v rows [T][(heads + 2 kv_heads) * D] (+ bias), applies
// rotary embeddings, writes q and the cache.
void launchQkvToCache(int T, const __half* qkv, const QkvDestination& d, cudaStream_t s);
// Causal attention of each token over its sequence's cached keys/values up to its
// position, read through the block table; query head h reads kv head h / (heads / kv_heads).
// With few (token, head) pairs the keys split over several blocks (flash-decoding); their
// partial results meet in `partials` and the last block of a pair combines them.
struct AttentionScratch {
    float* partials = nullptr;  // [capacity][kMaxAttentionSplits][head_dim + 2]
    int* counters = nullptr;    // [capacity], zero between launches
    int capacity = 0;           // (token, head) pairs that may split
    int sms = 0;
};
constexpr int kMaxAttentionSplits = 16;
static_assert(DecoderKnobs{}.attention_splits == kMaxAttentionSplits);
void launchPagedAttention(int T, int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, const AttentionScratch& scratch,
                          __half* out, cudaStream_t s);
// y = in * W^T (W f16 [N][K]) for rows <= kSmallGemmMaxRows token rows, the decode case,
// where cuBLAS leaves HBM bandwidth unused; the input comes from a fused prologue and
// the output goes through a fused epilogue, which saves the norm, activation and
// RoPE/cache kernels.
constexpr int kSmallGemmMaxRows = 4;
struct SmallGemmInput {
    enum Kind { Plain, Norm } kind = Plain;
    const __half* x = nullptr;        // Plain: [rows][K]
    const float* residual = nullptr;  // Norm: rows row_map[r] (or r) of this f32 [T][K] stream
    const int32_t* row_map = nullptr;
    const float *norm_w = nullptr, *norm_b = nullptr;
    float eps = 0.f;
    bool rms = false;
};
struct SmallGemmOutput {
    // Half/Float: [rows][N]; AddToResidual: the f32 stream += y + bias; GeluBias: f16
    // gelu_tanh(y + bias); SwiGlu (interleaved gate|up): f16 [rows][N/2] silu(gate) * up;
    // Qkv (interleaved q|k|v): to `qkv` as launchQkvToCache does.
    enum Kind { Half, Float, AddToResidual, GeluBias, SwiGlu, Qkv } kind = Half;
    void* y = nullptr;
    const __half* bias = nullptr;
    QkvDestination qkv;
    // Float: also each row's argmax, by atomicMax of argmax_key.h's keys into these [rows]
    // zeroed ones.
    unsigned long long* argmax_keys = nullptr;
};

// Allows the shared memory the largest K needs, and a norm's weights for the norm prologue's
// K (the hidden size); false when the device cannot (then the caller keeps to cuBLAS). K
// must be a multiple of 8.
bool prepareSmallGemm(int max_k, int norm_k);
// next_weights: bytes of weights the next kernel streams (0: none); when they are many and
// this one's few, fewer CTAs run it so that the next one's start loading while it computes.
void launchSmallGemm(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int64_t next_weights, int sms,
                     cudaStream_t s);
// ids[r] = the index of row r's largest value (the lowest on ties), rows [rows][n]; NaNs never win.
void launchArgmax(int rows, int n, const float* x, int32_t* ids, cudaStream_t s);
// GPT-2: out = gelu_tanh(in + bias), in [T][I]. Llama: out = silu(gate) * up from the
// interleaved [T][2I] gate|up rows.
void launchMlpActivation(int T, int I, const __half* in, const __half* bias, bool swiglu, __half* out, cudaStream_t s);

}  // namespace kiln::llm::cuda
