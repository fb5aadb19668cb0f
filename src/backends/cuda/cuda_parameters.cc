#include "backends/cuda/cuda_parameters.h"

namespace kiln::cuda {

std::vector<ParameterSpec> cudaParameters() {
    const std::string owner = "backends/cuda";
    return {
        {"tactic.cuda.gemm", {"auto", "heuristic"}, "auto", owner, "cuBLASLt algorithm per GEMM: timed at build time, or cuBLASLt's first heuristic pick", false,
         {"Gemm", "MatMul", "FusedMatMul"}},
        // heuristic by default: on the H200 it ran ResNet-50 in 0.69 ms against 1.3-1.6 ms for
        // the algorithms timed one convolution at a time (bench/results, 2026-12-02).
        {"tactic.cuda.conv", {"heuristic", "auto"}, "heuristic", owner, "cuDNN forward algorithm per convolution: cuDNN's heuristic, or timed at build time", false,
         {"Conv", "FusedConv", "ConvTranspose"}},
        {"tactic.cuda.attention", {"auto", "flash", "fused", "gemm"}, "auto", owner,
         "Attention kernel: flash (tensor cores, scores stay on chip; f16/bf16, heads up to 128), fused (f32 math on chip), two tensor-core GEMMs around a softmax, or timed", false, {"Attention"}},
        {"runtime.cuda_graph", {"on", "off"}, "on", owner, "Capture each input shape's run in a CUDA graph and replay it"},
        {"precision.activations", {"auto", "f32", "f16", "bf16"}, "auto", owner,
         "GPU storage/compute type of float values (auto: f16, f32 accumulation); the CPU always computes f32"},
        {"precision.tf32", {"off", "on"}, "off", owner, "Allow TF32 tensor-core math for f32 GEMMs and convolutions on the GPU"},
    };
}

}  // namespace kiln::cuda
