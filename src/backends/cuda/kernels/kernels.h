// Host-side entry points of Kiln's own CUDA kernels. The kernels live in the .cu files
// beside this header (compiled by nvcc); callers are plain C++ and see only these
// launchers. Every launcher enqueues work on `stream` and checks the launch.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ir/dtype.h"

namespace kiln::cuda {

constexpr int kMaxRank = 6;

// The iteration space of an elementwise kernel: a row-major shape of up to kMaxRank dims.
struct Shape6 {
    int rank = 0;
    int64_t dims[kMaxRank] = {};
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < rank; ++i) n *= dims[i];
        return n;
    }
};

// How one operand is read over a Shape6: element offset + sum(coord[d] * strides[d]).
// Broadcast dims have stride 0. `dense` marks strides equal to the row-major ones of the
// shape (offset i for flat index i). Launchers classify each view (classifyView) so that
// kernels take the cheap common forms without per-dimension index arithmetic.
struct View6 {
    int64_t offset = 0;
    int64_t strides[kMaxRank] = {};
    bool dense = false;
    // Set by classifyView.
    int32_t kind = 0;        // ViewKind
    bool small = false;      // every index fits 32 bits: kernels divide in 32-bit
    int64_t div = 1, mod = 1, stride = 0;
};
enum ViewKind : int32_t { kViewGeneral = 0, kViewDense, kViewScalar, kViewChannel, kViewModulo };
// Picks the cheapest form that reads `v` over `shape`: dense, scalar, one broadcast
// channel ((i / div) % mod * stride), a dense suffix (i % mod), or general.
View6 classifyView(View6 v, const Shape6& shape);

enum class UnaryOp : int32_t {
    Identity, Relu, Sigmoid, Tanh, LeakyRelu, Clip, HardSigmoid, HardSwish, Gelu, GeluTanh, Softplus,
    Exp, Log, Sqrt, Neg, Abs, Erf, Reciprocal, Floor, Ceil, Sin, Cos, Elu, Selu, Softsign, Sign, Round, Silu,
};
struct UnaryFn {
    UnaryOp op = UnaryOp::Identity;
    float a = 0, b = 0;  // alpha/beta, clip bounds
};

enum class BinaryOp : int32_t {
    Add, Sub, Mul, Div, Pow, Max, Min, Mod, Fmod,        // arithmetic: output in the input type (Mod: integers, the divisor's sign)
    Equal, Less, Greater, LessOrEqual, GreaterOrEqual,  // comparisons: Bool output
    And, Or, Xor,                                       // Bool inputs and output
};
inline bool isComparison(BinaryOp op) { return op >= BinaryOp::Equal && op <= BinaryOp::GreaterOrEqual; }
inline bool isLogical(BinaryOp op) { return op >= BinaryOp::And; }

// Types the float kernels take: F32, F16, BF16. Others raise Error in the launcher.
bool isDeviceFloat(DType t);

// y = f(x), n elements.
void launchUnary(DType t, UnaryFn f, const void* x, void* y, int64_t n, cudaStream_t s);
// y = Abs/Neg/Sign(x) over I32 or I64, n elements.
void launchIntegerUnary(DType t, UnaryOp op, const void* x, void* y, int64_t n, cudaStream_t s);
// y = !x over Bool, n elements.
void launchNot(const void* x, void* y, int64_t n, cudaStream_t s);
// y = post(a op b) over `shape`. Arithmetic: a, b, y of type t (float or I32/I64 for
// Add/Sub/Mul/Div/Max/Min/Mod/Fmod; integer division and modulo by zero give 0);
// comparisons: y Bool; logical: all Bool.
void launchBinary(DType t, BinaryOp op, const void* a, const View6& va, const void* b, const View6& vb, void* y, const Shape6& shape,
                  UnaryFn post, cudaStream_t s);
// Element type conversion between any two of F32/F16/BF16/F64/I8/I16/I32/I64/U8/Bool.
void launchCast(DType from, DType to, const void* x, void* y, int64_t n, cudaStream_t s);
// out = cond ? x : y (cond Bool), elements of `elem` bytes.
void launchWhere(size_t elem, const void* cond, const View6& vc, const void* x, const View6& vx, const void* y, const View6& vy, void* out,
                 const Shape6& shape, cudaStream_t s);
// dst[dv(i)] = src[sv(i)] over `shape`: Transpose, Concat, Split, Slice, Expand, Tile.
void launchStridedCopy(size_t elem, const void* src, const View6& sv, void* dst, const View6& dv, const Shape6& shape, cudaStream_t s);
// out[o, j, i] = data[o, idx[j], i] with negative indices wrapped (indices I32 or I64);
// out-of-range indices are clamped (the CPU path reports them).
void launchGather(size_t elem, const void* data, DType index_type, const void* indices, void* out, int64_t outer, int64_t axis_len,
                  int64_t n_indices, int64_t inner, cudaStream_t s);

// Pad: output coordinate c reads input coordinate c - begin, per mode outside the input
// (the constant value, the edge, a reflection without repeating the edge, or a wrap). Tile
// is not this: it is a strided copy.
enum class PadMode : int32_t { Constant, Reflect, Edge, Wrap };
struct PadSpec {
    PadMode mode = PadMode::Constant;
    int64_t begin[kMaxRank] = {};
};
// `value` points at one element of `elem` bytes (Constant mode).
void launchPad(size_t elem, const void* src, const Shape6& in, void* dst, const Shape6& out, const PadSpec& spec, const void* value, cudaStream_t s);
// Inclusive (or exclusive) running sums along the middle axis of [outer, len, inner], from
// the end when `reverse`; F32/F16/BF16 (summed in f32), I32/I64.
void launchCumSum(DType t, const void* x, void* y, int64_t outer, int64_t len, int64_t inner, bool exclusive, bool reverse, cudaStream_t s);
// GatherND: output element i is element i % slice of the slice that index tuple i / slice
// (k values, negatives wrapped, out-of-range clamped) picks inside its batch.
constexpr int kMaxGatherNdIndex = kMaxRank;
struct GatherNdSpec {
    int k = 0;
    int64_t slice = 1, tuples_per_batch = 1, batch_stride = 0;
    int64_t dims[kMaxGatherNdIndex] = {}, strides[kMaxGatherNdIndex] = {};  // of the indexed data axes
};
void launchGatherNd(size_t elem, const void* data, const GatherNdSpec& g, DType index_type, const void* indices, void* out, int64_t n, cudaStream_t s);
// GatherElements: out[i] = data at i's coordinates over `shape` (the indices' and the
// output's), the one on `axis` replaced by indices[i] (negatives wrapped, out-of-range
// clamped); `data_strides` are data's element strides.
void launchGatherElements(size_t elem, const void* data, const View6& data_strides, int axis, int64_t axis_len, DType index_type, const void* indices,
                          void* out, const Shape6& shape, cudaStream_t s);

// A fused elementwise chain (kiln ElementwiseChain): value = input 0, then each step
// applies a unary function or a binary op with another input; rounded to T between steps.
constexpr int kMaxChainSteps = 16;
constexpr int kMaxChainInputs = 8;
struct ChainProgram {
    int steps = 0;
    int inputs = 0;
    BinaryOp op[kMaxChainSteps] = {};
    UnaryFn unary[kMaxChainSteps] = {};
    int32_t operand[kMaxChainSteps] = {};  // -1: unary step
    int32_t swapped[kMaxChainSteps] = {};
    View6 views[kMaxChainInputs] = {};
    const void* data[kMaxChainInputs] = {};
};
void launchChain(DType t, const ChainProgram& program, void* out, const Shape6& shape, cudaStream_t s);

// y = act(y + z + z2) in place (rounded to T after each add); z and z2 read through their
// views over y's shape (bias, residual); either may be null.
void launchEpilogue(DType t, void* y, const Shape6& shape, const void* z, const View6& vz, UnaryFn act, cudaStream_t s,
                    const void* z2 = nullptr, const View6& vz2 = View6{});

// LayerNormalization over the last `cols` elements of each row; scale/bias of type pt
// (may differ from t), bias may be null. Accumulates in f32. With `row_channels`, scale and
// bias hold one value per row instead, row r taking value r % row_channels
// (InstanceNormalization over [n * c, inner] rows).
void launchLayerNorm(DType t, DType pt, const void* x, const void* scale, const void* bias, void* y, int64_t rows, int64_t cols, float eps,
                     cudaStream_t s, int64_t row_channels = 0);
// Softmax (or LogSoftmax) over rows of `cols` contiguous elements.
void launchSoftmax(DType t, const void* x, void* y, int64_t rows, int64_t cols, bool log, cudaStream_t s);
// P = softmax(scores * scale + mask) for attention: scores f32 [rows, cols]; mask (type mt,
// may be null) read through vm over the shape [batch dims..., S, T]; P of type t.
void launchScaledMaskedSoftmax(DType t, const float* scores, float scale, DType mt, const void* mask, const View6& vm, const Shape6& shape,
                               void* p, cudaStream_t s);

// Fused attention: out = softmax(Q Kt * scale + mask) V per (batch, head), keys in tiles
// with an online softmax (any key count). The geometry gives each operand's strides:
// canonical Q [BH,S,D], Kt [BH,D,T], V [BH,T,E], out [BH,S,E], or "bshd" Q [B,S,H,D],
// K [B,T,H,D], V [B,T,H,E], out [B,S,H,E]. The mask (as in launchScaledMaskedSoftmax) is
// read over the score shape [B, H, S, T] (canonical: [batch dims..., S, T]).
constexpr int64_t kFusedAttentionMaxHead = 256;
struct AttentionGeometry {
    int64_t batch = 1, heads = 1, S = 0, T = 0, D = 0, E = 0;
    int64_t q_batch = 0, q_head = 0, q_row = 0;
    int64_t k_batch = 0, k_head = 0, k_key = 0, k_dim = 0;  // K element (t, d) at t * k_key + d * k_dim
    int64_t v_batch = 0, v_head = 0, v_row = 0;
    int64_t out_batch = 0, out_head = 0, out_row = 0;
};
template <typename Elem>
struct AttentionOperands : AttentionGeometry {
    const Elem *q = nullptr, *k = nullptr, *v = nullptr;
    Elem* out = nullptr;
    float scale = 1.f;
};
AttentionGeometry attentionGeometry(bool bshd, int64_t batch, int64_t heads, int64_t S, int64_t T, int64_t D, int64_t E);
void launchFusedAttention(DType t, const AttentionGeometry& g, const void* q, const void* k, const void* v, DType mt, const void* mask,
                          const View6& vm, const Shape6& score_shape, void* out, float scale, cudaStream_t s);
// The same on tensor cores (FlashAttention-2 style): f16 and bf16, head sizes up to 128.
constexpr int64_t kFlashAttentionMaxHead = 128;
bool flashAttentionSupports(DType t, const AttentionGeometry& g);
void launchFlashAttention(DType t, const AttentionGeometry& g, const void* q, const void* k, const void* v, DType mt, const void* mask,
                          const View6& vm, const Shape6& score_shape, void* out, float scale, cudaStream_t s);

// Pooling on NCHW (or NHWC when channels_last) 2-D data.
struct Pool2d {
    int64_t n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
    bool max, count_include_pad, channels_last;
};
void launchPool2d(DType t, const Pool2d& p, const void* x, void* y, cudaStream_t s);
// Reductions over the middle axis of [outer, r, inner] data; f32 accumulation, NaN kept by
// Max and Min.
enum class ReduceOp : int32_t { Sum, Mean, Max, Min };
void launchReduce(DType t, ReduceOp op, const void* x, void* y, int64_t outer, int64_t r, int64_t inner, cudaStream_t s);
// ArgMax (is_max) or ArgMin over the R axis of [outer, R, inner] float data into int64 y
// [outer, inner]; `last` picks the last extreme (select_last_index).
void launchArgExtreme(DType t, bool is_max, bool last, const void* x, int64_t* y, int64_t outer, int64_t r, int64_t inner, cudaStream_t s);

// Selection by value. Rows up to kMaxSortLength are sorted in one block's shared memory,
// longer ones in global memory (scratch: topKScratchBytes, nmsScratchBytes).
constexpr int64_t kMaxSortLength = 16384;
// TopK along the middle axis of [outer, len, inner] float data: the k largest (or smallest)
// values and their int64 indices, sorted, ties by the lower index. `scratch` holds
// topKScratchBytes (none for rows up to kMaxSortLength).
size_t topKScratchBytes(int64_t outer, int64_t len, int64_t inner);
void launchTopK(DType t, const void* x, void* values, int64_t* indices, int64_t outer, int64_t len, int64_t inner, int64_t k, bool largest,
                void* scratch, cudaStream_t s);
// NonZero in two steps around the host's read of the count: the select writes the count
// (int64) at the start of `scratch` (nonZeroScratchBytes of it) and returns the flat indices
// of the nonzero elements, in order; the unravel writes them as coordinates, out[d, count].
size_t nonZeroScratchBytes(DType t, int64_t n);
int64_t* launchNonZeroSelect(DType t, const void* x, int64_t n, void* scratch, cudaStream_t s);
void launchUnravel(const int64_t* flat, int64_t count, const Shape6& shape, int64_t* out, cudaStream_t s);
// NonMaxSuppression as the reference does it, per (batch, class) in one block: boxes
// [batches, spatial, 4], scores [batches, classes, spatial], at most max_keep boxes kept per
// class (max_keep >= 1, batches * classes >= 1). The kernel leaves each class's triples in
// `scratch` (nmsScratchBytes) and returns where in it the per-class counts (int32) are; the
// pack writes the triples one class after another into out [sum of counts, 3].
struct NmsProblem {
    int64_t batches = 0, classes = 0, spatial = 0, max_keep = 0;
    bool center_point_box = false, has_score_threshold = false;
    float iou_threshold = 0, score_threshold = 0;
};
size_t nmsScratchBytes(const NmsProblem& p);
const int32_t* launchNonMaxSuppression(DType t, const NmsProblem& p, const void* boxes, const void* scores, void* scratch, cudaStream_t s);
void launchPackSelected(const NmsProblem& p, const void* scratch, int64_t* out, cudaStream_t s);

// One step of LSTM, GRU or RNN (default activations) over all directions: xw holds x·W^T
// for every step (f32 rows of D * gates * H, in X's row order), hr the step's h·R^T
// [D, B, gates * H], bias the node's B ([D, 2 * gates * H], may be null); h and cell are the
// f32 [D, B, H] states, updated in place; y (type t, may be null) receives the step's
// output in the node's Y layout. GRU without linear_before_reset takes two launches:
// GruResetGate writes rh = r ⊙ h, and after the product hn = rh·Rh^T, Gru finishes the step.
enum class RecurrentKind : int32_t { Lstm, Gru, GruLinearBeforeReset, GruResetGate, Rnn };
struct RecurrentCell {
    RecurrentKind kind = RecurrentKind::Lstm;
    int64_t gates = 4, S = 0, B = 0, H = 0, D = 1;
    bool batch_major = false;   // layout=1: X rows and Y are batch-major
    bool reverse_first = false;  // direction "reverse": direction 0 runs backwards (bidirectional: direction 1)
};
void launchRecurrentCell(DType t, const RecurrentCell& c, int64_t step, const float* xw, const float* hr, const float* hn, const float* bias,
                         float* h, float* cell, float* rh, void* y, cudaStream_t s);
// Moves a state between the node's layout ([D, B, H], batch-major [B, D, H]) in type t and
// the f32 [D, B, H] state: to_state reads the node's, else writes it.
void launchRecurrentState(DType t, bool to_state, bool batch_major, int64_t D, int64_t B, int64_t H, const void* src, void* dst, cudaStream_t s);

// BatchNormalization in inference: y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]
// over [n, c, inner] data; the four parameters of type pt.
void launchBatchNorm(DType t, DType pt, const void* x, const void* scale, const void* bias, const void* mean, const void* var, void* y,
                     int64_t n, int64_t c, int64_t inner, float eps, cudaStream_t s);

// Resize of the last two axes of [planes, h.in, w.in] data to [planes, h.out, w.out].
enum ResizeMode : int32_t { kResizeNearest, kResizeLinear, kResizeCubic };
enum ResizeCoord : int32_t { kCoordHalfPixel, kCoordHalfPixelSymmetric, kCoordTfHalfPixelForNn, kCoordPytorchHalfPixel, kCoordAlignCorners, kCoordAsymmetric };
enum ResizeNearest : int32_t { kNearestRoundPreferFloor, kNearestRoundPreferCeil, kNearestFloor, kNearestCeil };
struct ResizeAxis {
    int64_t in = 1, out = 1;
    double scale = 1;  // as given (or out / in from sizes): the coordinate maps use it unrounded
};
struct Resize2d {
    int64_t planes = 0;
    ResizeAxis h, w;
    int32_t mode = kResizeNearest, coord = kCoordHalfPixel, nearest = kNearestRoundPreferFloor;
    float cubic_a = -0.75f;
    bool exclude_outside = false;
};
void launchResize2d(DType t, const Resize2d& p, const void* x, void* y, cudaStream_t s);

}  // namespace kiln::cuda
