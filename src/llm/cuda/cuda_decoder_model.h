// The decoder model on an NVIDIA GPU: f16 weights and paged KV cache in device memory,
// every sequence's chunk of a step computed as one batch (cuBLAS GEMMs with f32
// accumulation, our kernels for norms, rotary embeddings, paged attention and the MLP
// activation). Decode-only steps replay a CUDA graph captured once per batch size.
#pragma once
#include <filesystem>
#include <map>
#include <memory>

#include "ir/tensor.h"
#include "llm/cuda/decoder_knobs.h"
#include "llm/language_model.h"

namespace kiln::llm {

struct CudaDecoderOptions {
    bool cuda_graphs = true;
    bool small_gemm = true;  // fused GEMV kernels for steps of at most 4 tokens (else cuBLAS throughout)
    DecoderKnobs knobs;
};

// Throws Error when Kiln was built without CUDA or no GPU is usable.
std::unique_ptr<LanguageModel> makeCudaDecoderModel(const DecoderConfig& config, const std::map<std::string, Tensor>& weights,
                                                     CudaDecoderOptions options = {});
std::unique_ptr<LanguageModel> loadCudaDecoderModel(const std::filesystem::path& dir, CudaDecoderOptions options = {});

}  // namespace kiln::llm
