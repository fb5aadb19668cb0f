// LSTM, GRU and RNN. The input projection of all steps is one product on the preferred
// sgemm. The recurrence of LSTM and GRU cells with their standard activations runs on AVX2
// in one OpenMP region for the whole sequence: the directions in parallel, each direction's
// hidden units split among its threads, so that each thread keeps its rows of R in its own
// cache from step to step (a product per step, as the reference does, streams all of R
// through every thread each step), and the steps meet at one barrier each. Other cells (any
// activations, clip, peepholes, sequence_lens) run the shared recurrence with sgemm.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/fast/sgemm.h"
#include "backends/cpu/fast/simd_math.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/recurrent.h"

namespace kiln {

namespace {

void sgemmAccumulate(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    if (M == 0 || N == 0 || K == 0) return;
    kPreferredSgemm(false, true, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
}

// LSTM or GRU whose activations are the defaults, with no clip, peepholes, input_forget or
// short rows: what exporters of torch.nn.LSTM/GRU write.
bool standardCell(const KernelContext& ctx, const RecurrentProblem& p) {
    if (!(p.lstm || p.gru) || ctx.attrs().has("clip") || ctx.attrs().getInt("input_forget", 0) != 0 || ctx.optionalInput(7)) return false;
    for (int64_t len : p.lens)
        if (len != p.S) return false;
    if (ctx.attrs().has("activations")) {
        const std::vector<std::string> want = p.lstm ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"} : std::vector<std::string>{"Sigmoid", "Tanh"};
        const auto names = ctx.attrs().getStrings("activations");
        for (size_t k = 0; k < names.size(); ++k) {
            std::string n = names[k];
            std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            std::string w = want[k % want.size()];
            std::transform(w.begin(), w.end(), w.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            if (n != w) return false;
        }
    }
    return true;
}

__attribute__((target("avx2,fma"))) inline float horizontalSum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// out[r * stride] += dot(h, rows + r * H) for r < 4 (n rows, n <= 4), h and each row H long.
__attribute__((target("avx2,fma"))) void dotRows(const float* h, const float* rows, int n, int64_t H, float* out, int64_t stride) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t whole = H / 8 * 8;
    for (int64_t k = 0; k < whole; k += 8) {
        const __m256 hv = _mm256_loadu_ps(h + k);
        for (int r = 0; r < n; ++r) acc[r] = _mm256_fmadd_ps(hv, _mm256_loadu_ps(rows + r * H + k), acc[r]);
    }
    for (int r = 0; r < n; ++r) {
        float s = horizontalSum(acc[r]);
        for (int64_t k = whole; k < H; ++k) s += h[k] * rows[r * H + k];
        out[r * stride] += s;
    }
}

float sigmoidScalar(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// One direction's share of the recurrence: hidden units [j0, j1) of every batch row.
struct Share {
    const RecurrentProblem* p;
    const float* xw;      // [S, B, G*H] input projection with the biases outside the recurrence
    const float* r;       // [G*H, H]
    const float* rb_h;    // GRU with linear_before_reset: R's h-gate bias, inside the recurrence
    bool reverse, linear_before_reset;
    float* h[2];          // [B, H] state, double-buffered by step parity
    float* c;             // [B, H] (LSTM)
    float* rh;            // [B, H] GRU without linear_before_reset: r * h, shared by the direction
    float* y;             // [S, D, B, H]
    int64_t d, j0, j1;
};

// Pre-activations pre[b][g][j - j0] = xw + h R^T for gates `g0 <= g < g1` of the share's units,
// from state `h` ([B, H]).
__attribute__((target("avx2,fma"))) void gatePreactivations(const Share& s, int64_t t, const float* h, int64_t g0, int64_t g1, float* pre) {
    const RecurrentProblem& p = *s.p;
    const int64_t n = s.j1 - s.j0, GH = p.G * p.H;
    for (int64_t b = 0; b < p.B; ++b)
        for (int64_t g = g0; g < g1; ++g) std::memcpy(pre + (b * p.G + g) * n, s.xw + (t * p.B + b) * GH + g * p.H + s.j0, static_cast<size_t>(n) * sizeof(float));
    for (int64_t g = g0; g < g1; ++g)
        for (int64_t j = s.j0; j < s.j1; j += 4) {
            const int rows = static_cast<int>(std::min<int64_t>(4, s.j1 - j));
            for (int64_t b = 0; b < p.B; ++b) dotRows(h + b * p.H, s.r + (g * p.H + j) * p.H, rows, p.H, pre + (b * p.G + g) * n + (j - s.j0), 1);
        }
}

// One step of the share: reads s.h[step & 1], writes s.h[~step & 1], c, y. `sync` waits for
// every thread of the region (GRU without linear_before_reset needs all of r * h first).
template <typename Sync>
__attribute__((target("avx2,fma"))) void step(const Share& s, int64_t stepi, float* pre, float* hn_gate, Sync&& sync) {
    const RecurrentProblem& p = *s.p;
    const int64_t H = p.H, B = p.B, n = s.j1 - s.j0, t = s.reverse ? p.S - 1 - stepi : stepi;
    const float* h = s.h[stepi & 1];
    float* hnext = s.h[(stepi + 1) & 1];
    const int64_t vec = n / 8 * 8;
    if (p.lstm) {
        gatePreactivations(s, t, h, 0, 4, pre);
        for (int64_t b = 0; b < B; ++b) {
            // ONNX gate order: input, output, forget, cell.
            const float *pi = pre + (b * 4 + 0) * n, *po = pre + (b * 4 + 1) * n, *pf = pre + (b * 4 + 2) * n, *pc = pre + (b * 4 + 3) * n;
            float* c = s.c + b * H + s.j0;
            float* ho = hnext + b * H + s.j0;
            for (int64_t k = 0; k < vec; k += 8) {
                const __m256 i = sigmoidAvx2(_mm256_loadu_ps(pi + k)), o = sigmoidAvx2(_mm256_loadu_ps(po + k)), f = sigmoidAvx2(_mm256_loadu_ps(pf + k));
                const __m256 cn = _mm256_fmadd_ps(f, _mm256_loadu_ps(c + k), _mm256_mul_ps(i, tanhAvx2(_mm256_loadu_ps(pc + k))));
                _mm256_storeu_ps(c + k, cn);
                _mm256_storeu_ps(ho + k, _mm256_mul_ps(o, tanhAvx2(cn)));
            }
            for (int64_t k = vec; k < n; ++k) {
                const float cn = sigmoidScalar(pf[k]) * c[k] + sigmoidScalar(pi[k]) * std::tanh(pc[k]);
                c[k] = cn;
                ho[k] = sigmoidScalar(po[k]) * std::tanh(cn);
            }
        }
    } else if (s.linear_before_reset) {
        gatePreactivations(s, t, h, 0, 2, pre);
        // The h gate: xw_h + r * (h R_h^T + Rb_h), the product kept apart from xw.
        for (int64_t b = 0; b < B; ++b) std::memcpy(hn_gate + b * n, s.rb_h + s.j0, static_cast<size_t>(n) * sizeof(float));
        for (int64_t j = s.j0; j < s.j1; j += 4) {
            const int rows = static_cast<int>(std::min<int64_t>(4, s.j1 - j));
            for (int64_t b = 0; b < B; ++b) dotRows(h + b * H, s.r + (2 * H + j) * H, rows, H, hn_gate + b * n + (j - s.j0), 1);
        }
        for (int64_t b = 0; b < B; ++b) {
            const float *pz = pre + (b * 3 + 0) * n, *pr = pre + (b * 3 + 1) * n, *hg = hn_gate + b * n;
            const float* xh = s.xw + (t * B + b) * 3 * H + 2 * H + s.j0;
            const float* hp = h + b * H + s.j0;
            float* ho = hnext + b * H + s.j0;
            for (int64_t k = 0; k < vec; k += 8) {
                const __m256 z = sigmoidAvx2(_mm256_loadu_ps(pz + k)), r = sigmoidAvx2(_mm256_loadu_ps(pr + k));
                const __m256 cand = tanhAvx2(_mm256_fmadd_ps(r, _mm256_loadu_ps(hg + k), _mm256_loadu_ps(xh + k)));
                // (1 - z) cand + z h = cand + z (h - cand)
                _mm256_storeu_ps(ho + k, _mm256_fmadd_ps(z, _mm256_sub_ps(_mm256_loadu_ps(hp + k), cand), cand));
            }
            for (int64_t k = vec; k < n; ++k) {
                const float z = sigmoidScalar(pz[k]), cand = std::tanh(xh[k] + sigmoidScalar(pr[k]) * hg[k]);
                ho[k] = (1.0f - z) * cand + z * hp[k];
            }
        }
    } else {
        gatePreactivations(s, t, h, 0, 2, pre);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t k = 0; k < n; ++k) s.rh[b * H + s.j0 + k] = sigmoidScalar(pre[(b * 3 + 1) * n + k]) * h[b * H + s.j0 + k];
        sync();  // every unit's r * h before the h gate's product
        for (int64_t b = 0; b < B; ++b) std::memcpy(hn_gate + b * n, s.xw + (t * B + b) * 3 * H + 2 * H + s.j0, static_cast<size_t>(n) * sizeof(float));
        for (int64_t j = s.j0; j < s.j1; j += 4) {
            const int rows = static_cast<int>(std::min<int64_t>(4, s.j1 - j));
            for (int64_t b = 0; b < B; ++b) dotRows(s.rh + b * H, s.r + (2 * H + j) * H, rows, H, hn_gate + b * n + (j - s.j0), 1);
        }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t k = 0; k < n; ++k) {
                const float z = sigmoidScalar(pre[(b * 3) * n + k]), cand = std::tanh(hn_gate[b * n + k]);
                hnext[b * H + s.j0 + k] = (1.0f - z) * cand + z * h[b * H + s.j0 + k];
            }
    }
    for (int64_t b = 0; b < B; ++b)
        std::memcpy(s.y + ((t * p.D + s.d) * B + b) * H + s.j0, hnext + b * H + s.j0, static_cast<size_t>(n) * sizeof(float));
}

std::vector<Tensor> fastRecurrent(const KernelContext& ctx) {
    RecurrentProblem p = recurrentProblem(ctx);
    if (!cpuHasAvx2Fma() || !standardCell(ctx, p) || p.S == 0 || p.B == 0) return recurrentKernel(ctx, sgemmAccumulate);
    const int64_t S = p.S, B = p.B, I = p.I, D = p.D, H = p.H, G = p.G, GH = G * H;
    const bool lbr = p.gru && ctx.attrs().getInt("linear_before_reset", 0) != 0;
    const float* w = ctx.input(1).data<float>();
    const float* r = ctx.input(2).data<float>();
    const Tensor* bias = ctx.optionalInput(3);
    // Input projections with the biases that add outside the recurrence (all but a
    // linear_before_reset GRU's R h-gate bias).
    std::vector<float> xw(static_cast<size_t>(D * S * B * GH)), zeros(static_cast<size_t>(GH), 0.0f);
    std::vector<float> h(static_cast<size_t>(2 * D * B * H)), rh(static_cast<size_t>(D * B * H));
    for (int64_t d = 0; d < D; ++d) {
        const float* wb = bias ? bias->data<float>() + d * 2 * GH : nullptr;
        float* out = xw.data() + d * S * B * GH;
        float* first = out;
        for (int64_t j = 0; j < GH; ++j) first[j] = wb ? wb[j] + (lbr && j >= 2 * H ? 0.0f : wb[GH + j]) : 0.0f;
        for (int64_t row = 1; row < S * B; ++row) std::memcpy(out + row * GH, first, static_cast<size_t>(GH) * sizeof(float));
        sgemmAccumulate(S * B, GH, I, p.xs.data(), I, w + d * GH * I, I, out, GH);
        std::memcpy(h.data() + 2 * d * B * H, p.h.data() + d * B * H, static_cast<size_t>(B * H) * sizeof(float));
    }
    std::vector<float> y(static_cast<size_t>(S * D * B * H));
    // Threads per direction: each with 64k multiply-adds a step or more (a parallel region
    // and its barriers cost microseconds: Silero's one 128-unit step runs faster alone), and
    // hidden units in chunks of at least 16.
    const int threads = std::max(1, cpuThreads());
    const int64_t work = G * H * H * B;  // per direction and step
    const int64_t per_dir = std::max<int64_t>(1, std::min({threads / D, work / 65536, (H + 15) / 16}));
    const bool together = threads >= D && work >= 32768;  // both directions at once, else one after the other
    const int64_t team = together ? per_dir * D : per_dir;
    const int64_t chunk = (H + per_dir - 1) / per_dir;
    const bool needs_sync_inside = p.gru && !lbr;
    auto makeShare = [&](int64_t d, int64_t part) {
        Share s{&p, xw.data() + d * S * B * GH, r + d * GH * H, bias && lbr ? bias->data<float>() + d * 2 * GH + GH + 2 * H : zeros.data(),
                p.direction == "reverse" || d == 1, lbr, {h.data() + 2 * d * B * H, h.data() + (2 * d + 1) * B * H},
                p.lstm ? p.c.data() + d * B * H : nullptr, rh.data() + d * B * H, y.data(), d, std::min(H, part * chunk), std::min(H, (part + 1) * chunk)};
        return s;
    };
    auto runDirections = [&](int64_t first_d, int64_t dirs) {
        if (team == 1) {
            for (int64_t d = first_d; d < first_d + dirs; ++d) {
                const Share s = makeShare(d, 0);
                std::vector<float> pre(static_cast<size_t>(B * G * H)), hg(static_cast<size_t>(B * H));
                for (int64_t k = 0; k < S; ++k) step(s, k, pre.data(), hg.data(), [] {});
            }
            return;
        }
#pragma omp parallel num_threads(static_cast<int>(team))
        {
            const int64_t tid = omp_get_thread_num();
            const Share s = makeShare(first_d + tid / per_dir, tid % per_dir);
            std::vector<float> pre(static_cast<size_t>(B * G * std::max<int64_t>(s.j1 - s.j0, 1))), hg(static_cast<size_t>(B * std::max<int64_t>(s.j1 - s.j0, 1)));
            for (int64_t k = 0; k < S; ++k) {
                if (s.j1 > s.j0) {
                    step(s, k, pre.data(), hg.data(), [] {
#pragma omp barrier
                    });
                } else if (needs_sync_inside) {
#pragma omp barrier
                }
#pragma omp barrier
            }
        }
    };
    if (together) runDirections(0, D);
    else
        for (int64_t d = 0; d < D; ++d) runDirections(d, 1);
    for (int64_t d = 0; d < D; ++d)  // the final state: the buffer the last step wrote
        std::memcpy(p.h.data() + d * B * H, h.data() + (2 * d + (S & 1)) * B * H, static_cast<size_t>(B * H) * sizeof(float));
    return recurrentOutputs(p, y);
}

}  // namespace

void addRecurrentTactics(std::vector<Tactic>& t) { t.push_back({"blas", "rnn", {"LSTM", "GRU", "RNN"}, supportsAnyNode, fastRecurrent}); }

}  // namespace kiln
