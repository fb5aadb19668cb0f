// What the CPU Kiln runs on can execute: the fast kernels compiled for AVX2 + FMA and
// AVX-512 are chosen at run time (the library itself targets generic x86-64), and the
// layout pass picks the channel block that the AVX-512 kernels want.
#pragma once

namespace kiln {

// Whether this CPU runs the kernels compiled for AVX2 + FMA.
bool cpuHasAvx2Fma();
// Whether it also runs the AVX-512 (F) kernels.
bool cpuHasAvx512();
// Whether it computes f16 (AVX512-FP16) and bf16 (AVX512-BF16 or AMX-BF16) natively:
// without, oneDNN emulates them, two orders of magnitude slower than f32.
bool cpuHasNativeF16();
bool cpuHasNativeBf16();

}  // namespace kiln
