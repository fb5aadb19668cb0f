// Elementwise kernels: unary functions, broadcast binary ops, casts, Where, fused
// elementwise chains and the bias/residual/activation epilogue of GEMMs and convolutions.
#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

bool isDeviceFloat(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

View6 classifyView(View6 v, const Shape6& shape) {
    const int64_t n = shape.numel();
    v.small = n < (int64_t(1) << 31);
    if (v.dense) {
        v.kind = kViewDense;
        return v;
    }
    // Strides of dims of size 1 never matter.
    int64_t st[kMaxRank];
    for (int d = 0; d < shape.rank; ++d) st[d] = shape.dims[d] == 1 ? 0 : v.strides[d];
    int nonzero = 0, first = -1;
    for (int d = 0; d < shape.rank; ++d)
        if (st[d] != 0) {
            ++nonzero;
            if (first < 0) first = d;
        }
    if (nonzero == 0) {
        v.kind = kViewScalar;
        return v;
    }
    // A suffix read contiguously, everything before it broadcast.
    bool suffix = true;
    int64_t expect = 1;
    for (int d = shape.rank - 1; d >= first; --d) {
        if (shape.dims[d] != 1 && st[d] != expect) suffix = false;
        expect *= shape.dims[d];
    }
    if (suffix) {
        v.mod = expect;
        v.kind = first == 0 && v.offset == 0 ? kViewDense : kViewModulo;
        if (v.kind == kViewDense) v.dense = true;
        return v;
    }
    if (nonzero == 1) {
        int64_t inner = 1;
        for (int d = shape.rank - 1; d > first; --d) inner *= shape.dims[d];
        v.kind = kViewChannel;
        v.div = inner;
        v.mod = shape.dims[first];
        v.stride = st[first];
        return v;
    }
    v.kind = kViewGeneral;
    return v;
}

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void unaryKernel(UnaryFn f, const T* x, T* y, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = fromFloat<T>(applyUnary(f, toFloat(x[i])));
}

template <typename T>
__global__ void integerUnaryKernel(UnaryOp op, const T* x, T* y, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const T v = x[i];
        y[i] = op == UnaryOp::Abs ? (v < 0 ? T(-v) : v) : op == UnaryOp::Neg ? T(-v) : T((v > 0) - (v < 0));
    }
}

__global__ void notKernel(const bool* x, bool* y, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) y[i] = !x[i];
}

template <typename T>
__device__ __forceinline__ float arith(BinaryOp op, float a, float b) {
    switch (op) {
        case BinaryOp::Add: return a + b;
        case BinaryOp::Sub: return a - b;
        case BinaryOp::Mul: return a * b;
        case BinaryOp::Div: return a / b;
        case BinaryOp::Pow: return powf(a, b);
        case BinaryOp::Max: return fmaxf(a, b);
        case BinaryOp::Min: return fminf(a, b);
        case BinaryOp::Fmod: return fmodf(a, b);
        default: return 0.f;
    }
}

template <typename T>
__global__ void binaryFloatKernel(BinaryOp op, const T* a, View6 va, const T* b, View6 vb, T* y, Shape6 shape, UnaryFn post, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float x = toFloat(a[viewOffset(va, shape, i)]), z = toFloat(b[viewOffset(vb, shape, i)]);
        y[i] = fromFloat<T>(applyUnary(post, arith<T>(op, x, z)));
    }
}

template <typename T>
__global__ void binaryIntKernel(BinaryOp op, const T* a, View6 va, const T* b, View6 vb, T* y, Shape6 shape, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const T x = a[viewOffset(va, shape, i)], z = b[viewOffset(vb, shape, i)];
        T r = 0;
        switch (op) {
            case BinaryOp::Add: r = x + z; break;
            case BinaryOp::Sub: r = x - z; break;
            case BinaryOp::Mul: r = x * z; break;
            case BinaryOp::Div: {  // ONNX integer Div truncates toward zero; x/0 is left 0
                r = z == 0 ? T(0) : T(x / z);
                break;
            }
            case BinaryOp::Max: r = x > z ? x : z; break;
            case BinaryOp::Min: r = x < z ? x : z; break;
            case BinaryOp::Mod:
            case BinaryOp::Fmod: {  // as the reference: x % -1 is 0 (MIN % -1 traps), Mod takes the divisor's sign
                if (z == 0 || z == T(-1)) break;
                r = T(x % z);
                if (op == BinaryOp::Mod && r != 0 && ((r < 0) != (z < 0))) r = T(r + z);
                break;
            }
            default: break;
        }
        y[i] = r;
    }
}

template <typename T>
__global__ void compareKernel(BinaryOp op, const T* a, View6 va, const T* b, View6 vb, bool* y, Shape6 shape, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const T x = a[viewOffset(va, shape, i)], z = b[viewOffset(vb, shape, i)];
        bool r = false;
        if constexpr (sizeof(T) == 2 && !std::is_integral_v<T>) {
            const float fx = toFloat(x), fz = toFloat(z);
            r = op == BinaryOp::Equal ? fx == fz : op == BinaryOp::Less ? fx < fz : op == BinaryOp::Greater ? fx > fz
                : op == BinaryOp::LessOrEqual ? fx <= fz : fx >= fz;
        } else {
            r = op == BinaryOp::Equal ? x == z : op == BinaryOp::Less ? x < z : op == BinaryOp::Greater ? x > z
                : op == BinaryOp::LessOrEqual ? x <= z : x >= z;
        }
        y[i] = r;
    }
}

__global__ void logicalKernel(BinaryOp op, const bool* a, View6 va, const bool* b, View6 vb, bool* y, Shape6 shape, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const bool x = a[viewOffset(va, shape, i)], z = b[viewOffset(vb, shape, i)];
        y[i] = op == BinaryOp::And ? (x && z) : op == BinaryOp::Or ? (x || z) : (x != z);
    }
}

template <typename From, typename To>
__global__ void castKernel(const From* x, To* y, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        if constexpr (std::is_same_v<To, bool>) {
            y[i] = toFloat(x[i]) != 0.f;
        } else if constexpr (std::is_integral_v<From> && std::is_integral_v<To>) {
            y[i] = static_cast<To>(x[i]);
        } else if constexpr (std::is_same_v<From, double> || std::is_same_v<To, double>) {
            y[i] = fromFloat<To>(static_cast<float>(static_cast<double>(toFloat(x[i]))));
        } else {
            const float v = toFloat(x[i]);
            if constexpr (std::is_integral_v<To>) y[i] = isnan(v) ? To(0) : static_cast<To>(v);
            else y[i] = fromFloat<To>(v);
        }
    }
}

template <typename E>
__global__ void whereKernel(const bool* c, View6 vc, const E* x, View6 vx, const E* y, View6 vy, E* out, Shape6 shape, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = c[viewOffset(vc, shape, i)] ? x[viewOffset(vx, shape, i)] : y[viewOffset(vy, shape, i)];
}

template <typename T>
__global__ void chainKernel(ChainProgram p, T* out, Shape6 shape, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        // Every operand read once, with constant indices into the program (see viewOffset).
        float in[kMaxChainInputs];
#pragma unroll
        for (int k = 0; k < kMaxChainInputs; ++k)
            in[k] = k < p.inputs ? toFloat(static_cast<const T*>(p.data[k])[viewOffset(p.views[k], shape, i)]) : 0.f;
        float v = in[0];
#pragma unroll
        for (int s = 0; s < kMaxChainSteps; ++s) {
            if (s >= p.steps) break;
            if (p.operand[s] < 0) {
                v = applyUnary(p.unary[s], v);
            } else {
                float o = 0.f;
#pragma unroll
                for (int k = 0; k < kMaxChainInputs; ++k)
                    if (k == p.operand[s]) o = in[k];
                v = p.swapped[s] ? arith<T>(p.op[s], o, v) : arith<T>(p.op[s], v, o);
            }
            v = toFloat(fromFloat<T>(v));  // the unfused graph stores every intermediate in T
        }
        out[i] = fromFloat<T>(v);
    }
}

template <typename T>
__global__ void epilogueKernel(T* y, Shape6 shape, const T* z, View6 vz, const T* z2, View6 vz2, UnaryFn act, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        float v = toFloat(y[i]);
        if (z) v = toFloat(fromFloat<T>(v + toFloat(z[viewOffset(vz, shape, i)])));
        if (z2) v = toFloat(fromFloat<T>(v + toFloat(z2[viewOffset(vz2, shape, i)])));
        y[i] = fromFloat<T>(applyUnary(act, v));
    }
}

// Calls f(T*) for the device type of any DType the cast kernel handles.
template <typename F>
void dispatchAny(DType t, F&& f) {
    switch (t) {
        case DType::F32: f(static_cast<float*>(nullptr)); return;
        case DType::F16: f(static_cast<__half*>(nullptr)); return;
        case DType::BF16: f(static_cast<__nv_bfloat16*>(nullptr)); return;
        case DType::F64: f(static_cast<double*>(nullptr)); return;
        case DType::I8: f(static_cast<int8_t*>(nullptr)); return;
        case DType::I16: f(static_cast<int16_t*>(nullptr)); return;
        case DType::I32: f(static_cast<int32_t*>(nullptr)); return;
        case DType::I64: f(static_cast<int64_t*>(nullptr)); return;
        case DType::U8: f(static_cast<uint8_t*>(nullptr)); return;
        case DType::Bool: f(static_cast<bool*>(nullptr)); return;
        default: throw Error("CUDA cast: element type " + std::string(dtypeName(t)) + " is not supported");
    }
}

}  // namespace

void launchUnary(DType t, UnaryFn f, const void* x, void* y, int64_t n, cudaStream_t s) {
    clearStaleError();
    if (n == 0) return;
    dispatchDeviceFloat(t, "unary", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        unaryKernel<T><<<gridFor(n, kThreads), kThreads, 0, s>>>(f, static_cast<const T*>(x), static_cast<T*>(y), n);
    });
    checkLaunch("unary");
}

void launchIntegerUnary(DType t, UnaryOp op, const void* x, void* y, int64_t n, cudaStream_t s) {
    clearStaleError();
    check(op == UnaryOp::Abs || op == UnaryOp::Neg || op == UnaryOp::Sign, "CUDA integer unary op must be Abs, Neg or Sign");
    if (n == 0) return;
    if (t == DType::I64)
        integerUnaryKernel<int64_t><<<gridFor(n, kThreads), kThreads, 0, s>>>(op, static_cast<const int64_t*>(x), static_cast<int64_t*>(y), n);
    else if (t == DType::I32)
        integerUnaryKernel<int32_t><<<gridFor(n, kThreads), kThreads, 0, s>>>(op, static_cast<const int32_t*>(x), static_cast<int32_t*>(y), n);
    else
        check(false, "CUDA integer unary op needs I32 or I64");
    checkLaunch("integer unary");
}

void launchNot(const void* x, void* y, int64_t n, cudaStream_t s) {
    clearStaleError();
    if (n == 0) return;
    notKernel<<<gridFor(n, kThreads), kThreads, 0, s>>>(static_cast<const bool*>(x), static_cast<bool*>(y), n);
    checkLaunch("not");
}

void launchBinary(DType t, BinaryOp op, const void* a, const View6& va, const void* b, const View6& vb, void* y, const Shape6& shape,
                  UnaryFn post, cudaStream_t s) {
    clearStaleError();
    const int64_t n = shape.numel();
    if (n == 0) return;
    const unsigned grid = gridFor(n, kThreads);
    const View6 ca = classifyView(va, shape), cb = classifyView(vb, shape);
    if (isLogical(op)) {
        check(t == DType::Bool, "CUDA logical op needs Bool inputs");
        logicalKernel<<<grid, kThreads, 0, s>>>(op, static_cast<const bool*>(a), ca, static_cast<const bool*>(b), cb, static_cast<bool*>(y), shape, n);
    } else if (isComparison(op)) {
        auto run = [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            compareKernel<T><<<grid, kThreads, 0, s>>>(op, static_cast<const T*>(a), ca, static_cast<const T*>(b), cb, static_cast<bool*>(y), shape, n);
        };
        if (t == DType::I64) run(static_cast<int64_t*>(nullptr));
        else if (t == DType::I32) run(static_cast<int32_t*>(nullptr));
        else dispatchDeviceFloat(t, "comparison", run);
    } else if (t == DType::I64 || t == DType::I32) {
        check(op != BinaryOp::Pow && post.op == UnaryOp::Identity, "CUDA integer Pow is not supported");
        if (t == DType::I64)
            binaryIntKernel<int64_t><<<grid, kThreads, 0, s>>>(op, static_cast<const int64_t*>(a), ca, static_cast<const int64_t*>(b), cb, static_cast<int64_t*>(y), shape, n);
        else
            binaryIntKernel<int32_t><<<grid, kThreads, 0, s>>>(op, static_cast<const int32_t*>(a), ca, static_cast<const int32_t*>(b), cb, static_cast<int32_t*>(y), shape, n);
    } else {
        dispatchDeviceFloat(t, "binary", [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            binaryFloatKernel<T><<<grid, kThreads, 0, s>>>(op, static_cast<const T*>(a), ca, static_cast<const T*>(b), cb, static_cast<T*>(y), shape, post, n);
        });
    }
    checkLaunch("binary");
}

void launchCast(DType from, DType to, const void* x, void* y, int64_t n, cudaStream_t s) {
    clearStaleError();
    if (n == 0) return;
    if (from == to) {
        if (x != y) {
            const cudaError_t e = cudaMemcpyAsync(y, x, n * dtypeSize(from), cudaMemcpyDeviceToDevice, s);
            check(e == cudaSuccess, std::string("CUDA cast copy: ") + cudaGetErrorString(e));
        }
        return;
    }
    dispatchAny(from, [&](auto* ftag) {
        using F = std::remove_pointer_t<decltype(ftag)>;
        dispatchAny(to, [&](auto* ttag) {
            using T = std::remove_pointer_t<decltype(ttag)>;
            castKernel<F, T><<<gridFor(n, kThreads), kThreads, 0, s>>>(static_cast<const F*>(x), static_cast<T*>(y), n);
        });
    });
    checkLaunch("cast");
}

void launchWhere(size_t elem, const void* cond, const View6& vc, const void* x, const View6& vx, const void* y, const View6& vy, void* out,
                 const Shape6& shape, cudaStream_t s) {
    clearStaleError();
    const int64_t n = shape.numel();
    if (n == 0) return;
    const unsigned grid = gridFor(n, kThreads);
    const View6 cc = classifyView(vc, shape), cx = classifyView(vx, shape), cy = classifyView(vy, shape);
    auto run = [&](auto* tag) {
        using E = std::remove_pointer_t<decltype(tag)>;
        whereKernel<E><<<grid, kThreads, 0, s>>>(static_cast<const bool*>(cond), cc, static_cast<const E*>(x), cx, static_cast<const E*>(y), cy,
                                                 static_cast<E*>(out), shape, n);
    };
    switch (elem) {
        case 1: run(static_cast<uint8_t*>(nullptr)); break;
        case 2: run(static_cast<uint16_t*>(nullptr)); break;
        case 4: run(static_cast<uint32_t*>(nullptr)); break;
        case 8: run(static_cast<uint64_t*>(nullptr)); break;
        default: throw Error("CUDA Where: unsupported element size");
    }
    checkLaunch("where");
}

void launchChain(DType t, const ChainProgram& program_in, void* out, const Shape6& shape, cudaStream_t s) {
    clearStaleError();
    const int64_t n = shape.numel();
    if (n == 0) return;
    ChainProgram program = program_in;
    for (int k = 0; k < program.inputs; ++k) program.views[k] = classifyView(program.views[k], shape);
    dispatchDeviceFloat(t, "ElementwiseChain", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        chainKernel<T><<<gridFor(n, kThreads), kThreads, 0, s>>>(program, static_cast<T*>(out), shape, n);
    });
    checkLaunch("chain");
}

void launchEpilogue(DType t, void* y, const Shape6& shape, const void* z, const View6& vz, UnaryFn act, cudaStream_t s, const void* z2,
                    const View6& vz2) {
    clearStaleError();
    const int64_t n = shape.numel();
    if (n == 0 || (!z && !z2 && act.op == UnaryOp::Identity)) return;
    dispatchDeviceFloat(t, "epilogue", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        epilogueKernel<T><<<gridFor(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), shape, static_cast<const T*>(z), classifyView(vz, shape), static_cast<const T*>(z2),
                                                                     classifyView(vz2, shape), act, n);
    });
    checkLaunch("epilogue");
}

}  // namespace kiln::cuda
