// Kernels of the GPU decoder step (f16 storage, f32 math). Token rows of a step come from
// several sequences; per-token metadata (positions, cache slots, which chunk) is read from
// device arrays so that one captured CUDA graph serves every decode step of a batch size.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::llm::cuda {

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

// x[t] = wte[token] (+ wpe[position]), f32 residual stream.
void launchEmbed(int T, int H, const StepMeta& m, const __half* wte, const __half* wpe, float* x, cudaStream_t s);
// For each output row r (token row_map[r], or r): x += add + bias (when add), then
// out[r] = LayerNorm/RMSNorm(x) * w (+ b).
void launchAddNorm(int rows, int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                   float eps, bool rms, __half* out, cudaStream_t s);
// Splits fused q|k|v rows (+ bias), applies rotary embeddings (Llama), writes q to `q`
// and k, v into the paged cache at each token's slot.
void launchQkvToCache(int T, int heads, const __half* qkv, const __half* bias, const StepMeta& m, const KvLayer& kv, bool rope, float theta,
                      __half* q, cudaStream_t s);
// Causal attention of each token over its sequence's cached keys/values up to its
// position, read through the block table; query head h reads kv head h / (heads / kv_heads).
void launchPagedAttention(int T, int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, __half* out, cudaStream_t s);
// y = in * W^T (W f16 [N][K]) for rows <= kSmallGemmMaxRows token rows, the decode case,
// where cuBLAS leaves HBM bandwidth unused; the input comes from a fused prologue and
// the output goes through a fused epilogue, which saves the norm and activation kernels.
constexpr int kSmallGemmMaxRows = 4;
struct SmallGemmInput {
    enum Kind { Plain, Norm, Activation } kind = Plain;
    const __half* x = nullptr;  // Plain: [rows][K]; Activation: [rows][K] (+ bias) or [rows][2K] (SwiGLU)
    const __half* bias = nullptr;
    bool swiglu = false;
    const float* residual = nullptr;  // Norm: rows row_map[r] (or r) of this f32 [T][K] stream
    const int32_t* row_map = nullptr;
    const float *norm_w = nullptr, *norm_b = nullptr;
    float eps = 0.f;
    bool rms = false;
};
struct SmallGemmOutput {
    enum Kind { Half, Float, AddToResidual } kind = Half;
    void* y = nullptr;               // [rows][N]: f16, f32, or the f32 residual stream (+= y + bias)
    const __half* bias = nullptr;    // AddToResidual
};
// Allows the shared memory the largest K needs; false when the device cannot (then the
// caller keeps to cuBLAS). K must be a multiple of 8.
bool prepareSmallGemm(int max_k);
void launchSmallGemm(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int max_blocks, cudaStream_t s);
// GPT-2: out = gelu_tanh(in + bias), in [T][I]. Llama: out = silu(in[:, :I]) * in[:, I:].
void launchMlpActivation(int T, int I, const __half* in, const __half* bias, bool swiglu, __half* out, cudaStream_t s);

}  // namespace kiln::llm::cuda
