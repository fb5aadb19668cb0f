// How the decoder's small GEMM (decoder_kernels.cu) lays out a launch: chunks per task, row
// pairs for short rows, and when a GEMV runs on half the wave to leave room for the next
// kernel. Host and device code, so that the rules are tested where there is no GPU; the
// H200 measurements behind them are in decoder_kernels.cu and bench/results.
#pragma once

#include <cstdint>

#include "llm/cuda/host_device.h"

namespace kiln::llm::cuda {

// Chunks per task of P rows of K halves: each lane loads 8 / P 16-byte pieces of each row
// per chunk, 32 lanes.
KILN_HOST_DEVICE constexpr int smallGemmChunks(int K, int P) { return (K / 8 + 32 * (8 / P) - 1) / (32 * (8 / P)); }

// Whether N rows of K halves go in pairs: when pairs fill more of each lane's loads and
// single rows would give some of the wave's warps more than one chunk.
inline bool rowPairsPay(int64_t N, int K, int64_t wave_warps) {
    auto used = [&](int P) { return double(K / 8) / (smallGemmChunks(K, P) * 32 * (8 / P)); };
    return used(2) > used(1) && N * smallGemmChunks(K, 1) > wave_warps;
}

// Whether a GEMV of `items` task chunks runs on half the wave: when they fit one chunk per
// warp of that half, or two when the next kernel streams at least twice this one's weight
// bytes. mode 1: two chunks whatever comes next; 2: one chunk only; 0: never.
inline bool leaveRoomFits(int64_t items, int64_t half_wave_warps, int64_t own_bytes, int64_t next_bytes, int mode = 3) {
    if (next_bytes <= 0 || mode <= 0) return false;
    if (mode == 1) return items <= 2 * half_wave_warps;
    if (mode == 2) return items <= half_wave_warps;
    return items <= half_wave_warps || (items <= 2 * half_wave_warps && next_bytes >= 2 * own_bytes);
}

}  // namespace kiln::llm::cuda
