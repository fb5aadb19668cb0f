// Ops that select elements by value: TopK (a bitonic sort of each row in shared memory),
// NonZero (CUB's DeviceSelect over the flat indices) and NonMaxSuppression (one block per
// batch and class: a sort of its candidates, then the greedy pass with the block testing
// each candidate against the kept boxes together). Rows longer than shared memory holds
// (kMaxSortLength) are sorted in global memory by CUB's segmented stable sort instead.
// Orders and ties follow the reference kernels, so the results are the same indices.
#include <cub/device/device_segmented_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <cfloat>
#include <climits>

#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

constexpr int kSortThreads = 1024;

int pow2AtLeast(int64_t n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// Whether (va, ia) comes before (vb, ib): the larger (or smaller) value first, ties by the
// lower index. Indices are unique, so this is a strict total order.
__device__ __forceinline__ bool before(bool largest, float va, int ia, float vb, int ib) {
    if (va != vb) return largest ? va > vb : va < vb;
    return ia < ib;
}

// Sorts n2 (a power of two) pairs in shared memory; every thread of the block takes part.
__device__ void bitonicSort(float* key, int* idx, int n2, bool largest) {
    for (int k = 2; k <= n2; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n2; i += blockDim.x) {
                const int p = i ^ j;
                if (p <= i) continue;
                // Ascending runs (in `before` order) where bit k of i is clear.
                const bool want_i_first = (i & k) == 0;
                const bool i_first = before(largest, key[i], idx[i], key[p], idx[p]);
                if (i_first != want_i_first) {
                    const float tk = key[i];
                    key[i] = key[p], key[p] = tk;
                    const int ti = idx[i];
                    idx[i] = idx[p], idx[p] = ti;
                }
            }
            __syncthreads();
        }
}

// One block per (outer, inner) row of [outer, len, inner].
template <typename T>
__global__ void topKKernel(const T* x, T* values, int64_t* indices, int64_t len, int64_t inner, int64_t k, bool largest, int n2) {
    extern __shared__ unsigned char smem[];
    float* key = reinterpret_cast<float*>(smem);
    int* idx = reinterpret_cast<int*>(key + n2);
    const int64_t o = blockIdx.x / inner, in = blockIdx.x % inner;
    const T* row = x + o * len * inner + in;
    // Padding sorts last: the worst value and an index above every real one.
    const float pad = largest ? -INFINITY : INFINITY;
    for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        key[i] = i < len ? toFloat(row[i * inner]) : pad;
        idx[i] = i < len ? i : INT_MAX;
    }
    __syncthreads();
    bitonicSort(key, idx, n2, largest);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int64_t dst = (o * k + j) * inner + in;
        values[dst] = row[static_cast<int64_t>(idx[j]) * inner];
        indices[dst] = idx[j];
    }
}

template <typename T>
struct NonZeroAt {
    const T* x;
    __device__ bool operator()(int64_t i) const { return x[i] != T(0); }
};
template <>
struct NonZeroAt<__half> {
    const __half* x;
    __device__ bool operator()(int64_t i) const { return __half2float(x[i]) != 0.f; }
};
template <>
struct NonZeroAt<__nv_bfloat16> {
    const __nv_bfloat16* x;
    __device__ bool operator()(int64_t i) const { return __bfloat162float(x[i]) != 0.f; }
};

// Flat indices -> coordinates: out[d * count + h] is coordinate d of hit h.
__global__ void unravelKernel(const int64_t* flat, int64_t count, Shape6 shape, int64_t* out) {
    for (int64_t h = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; h < count; h += int64_t(gridDim.x) * blockDim.x) {
        int64_t i = flat[h];
        for (int d = shape.rank - 1; d >= 0; --d) {
            out[d * count + h] = i % shape.dims[d];
            i /= shape.dims[d];
        }
    }
}

template <typename F>
void dispatchNonZero(DType t, F&& f) {
    switch (t) {
        case DType::F32: f(static_cast<float*>(nullptr)); return;
        case DType::F16: f(static_cast<__half*>(nullptr)); return;
        case DType::BF16: f(static_cast<__nv_bfloat16*>(nullptr)); return;
        case DType::F64: f(static_cast<double*>(nullptr)); return;
        case DType::Bool:
        case DType::U8: f(static_cast<uint8_t*>(nullptr)); return;
        case DType::I8: f(static_cast<int8_t*>(nullptr)); return;
        case DType::I16: f(static_cast<int16_t*>(nullptr)); return;
        case DType::I32: f(static_cast<int32_t*>(nullptr)); return;
        case DType::I64: f(static_cast<int64_t*>(nullptr)); return;
        default: throw Error(std::string("NonZero: element type ") + std::string(dtypeName(t)) + " is not supported on CUDA");
    }
}

struct Corners {
    float y1, x1, y2, x2;
};

template <typename T>
__device__ Corners cornersAt(const T* b, bool center) {
    const float b0 = toFloat(b[0]), b1 = toFloat(b[1]), b2 = toFloat(b[2]), b3 = toFloat(b[3]);
    if (center) {  // [x_center, y_center, width, height]
        const float hw = b2 / 2, hh = b3 / 2;
        return {b1 - hh, b0 - hw, b1 + hh, b0 + hw};
    }
    return {fminf(b0, b2), fminf(b1, b3), fmaxf(b0, b2), fmaxf(b1, b3)};
}

// The reference's test, in the same float operations: b suppresses a when their IoU is
// above the threshold; empty boxes never suppress.
__device__ bool suppresses(const Corners& a, const Corners& b, float iou_threshold) {
    const float ih = fminf(a.y2, b.y2) - fmaxf(a.y1, b.y1), iw = fminf(a.x2, b.x2) - fmaxf(a.x1, b.x1);
    if (ih <= 0 || iw <= 0) return false;
    const float inter = __fmul_rn(ih, iw);
    const float area_a = __fmul_rn(a.y2 - a.y1, a.x2 - a.x1), area_b = __fmul_rn(b.y2 - b.y1, b.x2 - b.x1);
    const float uni = area_a + area_b - inter;
    if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
    return __fdiv_rn(inter, uni) > iou_threshold;
}

// The greedy pass of one (batch, class) over its `valid` candidates idx[0, valid), in
// descending score order: each is kept unless a kept box suppresses it. Writes up to
// max_keep (batch, class, box) triples at selected[bc * max_keep] and their count at
// counts[bc]; kept holds the kept boxes' corners.
//
// One candidate at a time costs a round of memory latency and a vote per candidate, times
// the kept boxes (yolo's 8400 candidates with thousands kept took 100 ms). So the block takes
// kNmsTile candidates at once: each thread tests its own against the boxes kept before the
// tile, then marks which later candidates of the tile it would suppress; one thread then
// settles the tile in order over those bits. The result is the one-at-a-time pass's.
constexpr int kNmsTile = 256;  // the block size of both NMS kernels
constexpr int kNmsWords = kNmsTile / 32;

template <typename T>
__device__ void greedyPass(const T* boxes, const int* idx, int valid, int64_t bc, int64_t classes, int64_t spatial, bool center, int64_t max_keep,
                           float iou_threshold, int64_t* selected, int32_t* counts, Corners* kept) {
    __shared__ Corners tile_box[kNmsTile];
    __shared__ int tile_idx[kNmsTile];
    __shared__ uint32_t later[kNmsTile][kNmsWords];  // bit u of row t: candidate t suppresses u
    __shared__ uint32_t alive[kNmsWords];             // not suppressed by a box kept before the tile
    __shared__ int new_pos[kNmsTile];
    __shared__ int n_new;
    const int t = static_cast<int>(threadIdx.x);
    const int64_t b = bc / classes, c = bc % classes;
    Corners* my_kept = kept + bc * max_keep;
    int64_t* out = selected + bc * max_keep * 3;
    const T* batch_boxes = boxes + b * spatial * 4;
    int64_t n_kept = 0;  // the same in every thread
    for (int base = 0; base < valid && n_kept < max_keep; base += kNmsTile) {
        const int tile = min(kNmsTile, valid - base);
        const bool mine = t < tile;
        Corners box{};
        if (mine) {
            tile_idx[t] = idx[base + t];
            box = cornersAt(batch_boxes + int64_t(tile_idx[t]) * 4, center);
        }
        tile_box[t] = box;
        bool hit = !mine;
        for (int64_t q = 0; q < n_kept && !hit; ++q) hit = suppresses(box, my_kept[q], iou_threshold);
        const uint32_t vote = __ballot_sync(0xffffffffu, !hit);
        if (t % 32 == 0) alive[t / 32] = vote;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < kNmsWords; ++w) {
            uint32_t bits = 0;
            for (int lane = 0; lane < 32 && !hit; ++lane) {
                const int u = w * 32 + lane;
                if (u > t && u < tile && suppresses(tile_box[u], box, iou_threshold)) bits |= 1u << lane;
            }
            later[t][w] = bits;
        }
        __syncthreads();
        if (t == 0) {
            uint32_t removed[kNmsWords] = {};
            int k = 0;
            const int64_t room = max_keep - n_kept;
#pragma unroll
            for (int w = 0; w < kNmsWords; ++w) {
                uint32_t pending = alive[w] & ~removed[w];
                while (pending && k < room) {
                    const int u = w * 32 + __ffs(pending) - 1;
                    new_pos[k++] = u;
#pragma unroll
                    for (int w2 = 0; w2 < kNmsWords; ++w2) removed[w2] |= later[u][w2];
                    pending &= pending - 1;
                    pending &= ~removed[w];
                }
            }
            n_new = k;
        }
        __syncthreads();
        if (t < n_new) {
            const int u = new_pos[t];
            my_kept[n_kept + t] = tile_box[u];
            int64_t* o = out + (n_kept + t) * 3;
            o[0] = b, o[1] = c, o[2] = tile_idx[u];
        }
        n_kept += n_new;
        __syncthreads();  // the new boxes are visible, and the tile's shared memory free, before the next tile
    }
    if (t == 0) counts[bc] = static_cast<int32_t>(n_kept);
}

// One block per (batch, class): the candidates (scores above the threshold) sorted in shared
// memory by descending score, ties by the lower index, then the greedy pass.
template <typename T>
__global__ void nmsKernel(const T* boxes, const T* scores, int64_t classes, int64_t spatial, bool center, int64_t max_keep, float iou_threshold,
                          bool has_score_threshold, float score_threshold, int n2, int64_t* selected, int32_t* counts, Corners* kept) {
    extern __shared__ unsigned char smem[];
    float* key = reinterpret_cast<float*>(smem);
    int* idx = reinterpret_cast<int*>(key + n2);
    __shared__ int valid;
    const int64_t bc = blockIdx.x;
    const T* s = scores + bc * spatial;
    if (threadIdx.x == 0) valid = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        const float v = i < spatial ? toFloat(s[i]) : -INFINITY;
        const bool ok = i < spatial && (!has_score_threshold || v > score_threshold);
        // Rejected boxes and padding sort after every candidate.
        key[i] = ok ? v : -INFINITY;
        idx[i] = ok ? i : (i < spatial ? int(spatial) + i : INT_MAX);
        if (ok) atomicAdd(&valid, 1);
    }
    __syncthreads();
    bitonicSort(key, idx, n2, true);
    greedyPass(boxes, idx, valid, bc, classes, spatial, center, max_keep, iou_threshold, selected, counts, kept);
}

// Long rows: the keys of every (batch, class), rejected boxes at -inf (after every candidate
// once sorted), and the count of candidates per (batch, class) in valid[] (zeroed before).
template <typename T>
__global__ void nmsKeysKernel(const T* scores, int64_t n, int64_t spatial, bool has_score_threshold, float score_threshold, float* keys, int* idx,
                              int* valid) {
    const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const float v = toFloat(scores[e]);
    const bool ok = !has_score_threshold || v > score_threshold;
    keys[e] = ok ? v : -INFINITY;
    idx[e] = int(e % spatial);
    if (ok) atomicAdd(&valid[e / spatial], 1);
}

// Long rows: the greedy pass over the candidates sorted in global memory.
template <typename T>
__global__ void nmsSortedKernel(const T* boxes, const int* sorted_idx, const int* valid, int64_t classes, int64_t spatial, bool center, int64_t max_keep,
                                float iou_threshold, int64_t* selected, int32_t* counts, Corners* kept) {
    const int64_t bc = blockIdx.x;
    greedyPass(boxes, sorted_idx + bc * spatial, valid[bc], bc, classes, spatial, center, max_keep, iou_threshold, selected, counts, kept);
}

// Packs each (batch, class)'s triples after those of the ones before it.
__global__ void packSelectedKernel(const int64_t* selected, const int32_t* counts, int64_t max_keep, int64_t* out) {
    __shared__ int64_t offset;
    if (threadIdx.x == 0) {
        int64_t o = 0;
        for (unsigned j = 0; j < blockIdx.x; ++j) o += counts[j];
        offset = o;
    }
    __syncthreads();
    const int64_t n = int64_t(counts[blockIdx.x]) * 3;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) out[offset * 3 + e] = selected[blockIdx.x * max_keep * 3 + e];
}

size_t sortBytes(int n2) { return static_cast<size_t>(n2) * (sizeof(float) + sizeof(int)); }

// Rows sorted in global memory: keys and indices in, the same sorted out, the segments'
// offsets, and CUB's temporary storage, carved out of one scratch buffer.
struct RowSort {
    float *keys_in, *keys;
    int *idx_in, *idx, *offsets;
    void* temp;
    size_t temp_bytes;
};

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

size_t rowSortTempBytes(int64_t rows, int64_t len) {
    size_t asc = 0, desc = 0;
    const int n = static_cast<int>(rows * len), segments = static_cast<int>(rows);
    cub::DeviceSegmentedSort::StableSortPairs(nullptr, asc, static_cast<const float*>(nullptr), static_cast<float*>(nullptr), static_cast<const int*>(nullptr),
                                              static_cast<int*>(nullptr), n, segments, static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
    cub::DeviceSegmentedSort::StableSortPairsDescending(nullptr, desc, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
                                                        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), n, segments,
                                                        static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
    return std::max(asc, desc);
}

size_t rowSortBytes(int64_t rows, int64_t len) {
    const size_t items = static_cast<size_t>(rows * len);
    return 4 * align256(items * 4) + align256(static_cast<size_t>(rows + 1) * 4) + align256(rowSortTempBytes(rows, len));
}

RowSort carveRowSort(void* scratch, int64_t rows, int64_t len) {
    const size_t items = align256(static_cast<size_t>(rows * len) * 4);
    char* p = static_cast<char*>(scratch);
    RowSort r;
    r.keys_in = reinterpret_cast<float*>(p), p += items;
    r.keys = reinterpret_cast<float*>(p), p += items;
    r.idx_in = reinterpret_cast<int*>(p), p += items;
    r.idx = reinterpret_cast<int*>(p), p += items;
    r.offsets = reinterpret_cast<int*>(p), p += align256(static_cast<size_t>(rows + 1) * 4);
    r.temp = p;
    r.temp_bytes = align256(rowSortTempBytes(rows, len));
    return r;
}

__global__ void rowOffsetsKernel(int* offsets, int64_t rows, int64_t len) {
    const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (r <= rows) offsets[r] = static_cast<int>(r * len);
}

// Sorts each row of keys_in (with idx_in along) into keys/idx, stably: equal keys keep their
// order, so indices filled in ascending order break ties by the lower index.
void sortRows(RowSort& r, int64_t rows, int64_t len, bool descending, cudaStream_t s) {
    rowOffsetsKernel<<<gridFor(rows + 1, 256), 256, 0, s>>>(r.offsets, rows, len);
    const int n = static_cast<int>(rows * len), segments = static_cast<int>(rows);
    cudaError_t e = descending ? cub::DeviceSegmentedSort::StableSortPairsDescending(r.temp, r.temp_bytes, r.keys_in, r.keys, r.idx_in, r.idx, n, segments,
                                                                                       r.offsets, r.offsets + 1, s)
                               : cub::DeviceSegmentedSort::StableSortPairs(r.temp, r.temp_bytes, r.keys_in, r.keys, r.idx_in, r.idx, n, segments, r.offsets,
                                                                           r.offsets + 1, s);
    if (e != cudaSuccess) throw Error(std::string("segmented sort failed: ") + cudaGetErrorString(e));
}

// Long TopK rows: row r = (o, in) of [outer, len, inner] gathered into keys[r * len + j].
template <typename T>
__global__ void topKKeysKernel(const T* x, int64_t len, int64_t inner, int64_t n, float* keys, int* idx) {
    const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int64_t r = e / len, j = e % len, o = r / inner, in = r % inner;
    keys[e] = toFloat(x[(o * len + j) * inner + in]);
    idx[e] = static_cast<int>(j);
}

template <typename T>
__global__ void topKWriteKernel(const T* x, const int* sorted_idx, int64_t len, int64_t inner, int64_t k, int64_t n, T* values, int64_t* indices) {
    const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int64_t r = e / k, j = e % k, o = r / inner, in = r % inner;
    const int64_t src = sorted_idx[r * len + j];
    values[(o * k + j) * inner + in] = x[(o * len + src) * inner + in];
    indices[(o * k + j) * inner + in] = src;
}

template <typename K>
void allowSharedMemory(K kernel, size_t bytes) {
    if (bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace

size_t topKScratchBytes(int64_t outer, int64_t len, int64_t inner) { return len > kMaxSortLength ? rowSortBytes(outer * inner, len) : 0; }

void launchTopK(DType t, const void* x, void* values, int64_t* indices, int64_t outer, int64_t len, int64_t inner, int64_t k, bool largest,
                void* scratch, cudaStream_t s) {
    if (outer * inner == 0 || k == 0) return;
    clearStaleError();
    if (len > kMaxSortLength) {
        const int64_t rows = outer * inner, n = rows * len;
        RowSort r = carveRowSort(scratch, rows, len);
        dispatchDeviceFloat(t, "TopK", [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            topKKeysKernel<T><<<gridFor(n, 256), 256, 0, s>>>(static_cast<const T*>(x), len, inner, n, r.keys_in, r.idx_in);
            sortRows(r, rows, len, largest, s);
            topKWriteKernel<T><<<gridFor(rows * k, 256), 256, 0, s>>>(static_cast<const T*>(x), r.idx, len, inner, k, rows * k, static_cast<T*>(values),
                                                                     indices);
        });
        checkLaunch("TopK");
        return;
    }
    const int n2 = pow2AtLeast(len);
    const size_t bytes = sortBytes(n2);
    dispatchDeviceFloat(t, "TopK", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        allowSharedMemory(topKKernel<T>, bytes);
        topKKernel<T><<<static_cast<unsigned>(outer * inner), kSortThreads, bytes, s>>>(static_cast<const T*>(x), static_cast<T*>(values), indices, len,
                                                                                        inner, k, largest, n2);
    });
    checkLaunch("TopK");
}

size_t nonZeroScratchBytes(DType t, int64_t n) {
    size_t temp = 0;
    dispatchNonZero(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        cub::DeviceSelect::If(nullptr, temp, thrust::counting_iterator<int64_t>(0), static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n,
                              NonZeroAt<T>{nullptr});
    });
    return 256 + static_cast<size_t>(n) * sizeof(int64_t) + temp;
}

int64_t* launchNonZeroSelect(DType t, const void* x, int64_t n, void* scratch, cudaStream_t s) {
    auto* count = static_cast<int64_t*>(scratch);
    int64_t* flat = reinterpret_cast<int64_t*>(static_cast<char*>(scratch) + 256);
    void* temp = flat + n;
    size_t temp_bytes = nonZeroScratchBytes(t, n) - 256 - static_cast<size_t>(n) * sizeof(int64_t);
    clearStaleError();
    dispatchNonZero(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<int64_t>(0), flat, count, n, NonZeroAt<T>{static_cast<const T*>(x)}, s);
    });
    checkLaunch("NonZero");
    return flat;
}

void launchUnravel(const int64_t* flat, int64_t count, const Shape6& shape, int64_t* out, cudaStream_t s) {
    if (count == 0) return;
    clearStaleError();
    unravelKernel<<<gridFor(count, 256), 256, 0, s>>>(flat, count, shape, out);
    checkLaunch("NonZero unravel");
}

size_t nmsScratchBytes(const NmsProblem& p) {
    const int64_t pairs = p.batches * p.classes;
    const size_t own = align256(static_cast<size_t>(pairs * p.max_keep) * (3 * sizeof(int64_t) + sizeof(Corners)) + static_cast<size_t>(pairs) * sizeof(int32_t));
    if (p.spatial <= kMaxSortLength) return own;
    return own + align256(static_cast<size_t>(pairs) * sizeof(int)) + rowSortBytes(pairs, p.spatial);
}

const int32_t* launchNonMaxSuppression(DType t, const NmsProblem& p, const void* boxes, const void* scores, void* scratch, cudaStream_t s) {
    clearStaleError();
    const int64_t pairs = p.batches * p.classes;
    auto* selected = static_cast<int64_t*>(scratch);
    auto* kept = reinterpret_cast<Corners*>(selected + pairs * p.max_keep * 3);
    auto* counts = reinterpret_cast<int32_t*>(kept + pairs * p.max_keep);
    if (p.spatial > kMaxSortLength) {
        NmsProblem own = p;
        own.spatial = 0;  // the size of the part before the sort's
        char* after = static_cast<char*>(scratch) + nmsScratchBytes(own);
        int* valid = reinterpret_cast<int*>(after);
        RowSort r = carveRowSort(after + align256(static_cast<size_t>(pairs) * sizeof(int)), pairs, p.spatial);
        const int64_t n = pairs * p.spatial;
        if (cudaMemsetAsync(valid, 0, static_cast<size_t>(pairs) * sizeof(int), s) != cudaSuccess) throw Error("NonMaxSuppression: cudaMemsetAsync failed");
        dispatchDeviceFloat(t, "NonMaxSuppression", [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            nmsKeysKernel<T><<<gridFor(n, 256), 256, 0, s>>>(static_cast<const T*>(scores), n, p.spatial, p.has_score_threshold, p.score_threshold, r.keys_in,
                                                             r.idx_in, valid);
            sortRows(r, pairs, p.spatial, true, s);
            nmsSortedKernel<T><<<static_cast<unsigned>(pairs), kNmsTile, 0, s>>>(static_cast<const T*>(boxes), r.idx, valid, p.classes, p.spatial,
                                                                            p.center_point_box, p.max_keep, p.iou_threshold, selected, counts, kept);
        });
        checkLaunch("NonMaxSuppression");
        return counts;
    }
    const int n2 = pow2AtLeast(p.spatial);
    const size_t bytes = sortBytes(n2);
    dispatchDeviceFloat(t, "NonMaxSuppression", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        allowSharedMemory(nmsKernel<T>, bytes);
        nmsKernel<T><<<static_cast<unsigned>(pairs), kNmsTile, bytes, s>>>(static_cast<const T*>(boxes), static_cast<const T*>(scores), p.classes, p.spatial,
                                                                      p.center_point_box, p.max_keep, p.iou_threshold, p.has_score_threshold,
                                                                      p.score_threshold, n2, selected, counts, kept);
    });
    checkLaunch("NonMaxSuppression");
    return counts;
}

void launchPackSelected(const NmsProblem& p, const void* scratch, int64_t* out, cudaStream_t s) {
    const int64_t pairs = p.batches * p.classes;
    auto* selected = static_cast<const int64_t*>(scratch);
    auto* counts = reinterpret_cast<const int32_t*>(reinterpret_cast<const Corners*>(selected + pairs * p.max_keep * 3) + pairs * p.max_keep);
    clearStaleError();
    packSelectedKernel<<<static_cast<unsigned>(pairs), 128, 0, s>>>(selected, counts, p.max_keep, out);
    checkLaunch("NonMaxSuppression pack");
}

}  // namespace kiln::cuda
