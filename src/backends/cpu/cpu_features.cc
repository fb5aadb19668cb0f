#include "backends/cpu/cpu_features.h"

namespace kiln {

bool cpuHasAvx2Fma() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
#else
    return false;
#endif
}

bool cpuHasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool yes = cpuHasAvx2Fma() && __builtin_cpu_supports("avx512f");
    return yes;
#else
    return false;
#endif
}

bool cpuHasNativeF16() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool yes = __builtin_cpu_supports("avx512fp16");
    return yes;
#else
    return false;
#endif
}

bool cpuHasNativeBf16() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool yes = __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
    return yes;
#else
    return false;
#endif
}

}  // namespace kiln
