// Winograd F(2x2, 3x3) convolutions (3x3, stride 1, no dilation, one group, NCHW f32): each
// 2x2 output tile comes from a 4x4 input tile, and in the transformed domain the conv is 16
// independent [M x C] x [C x tiles] products (one sgemm each): 2.25x fewer multiplies than a
// direct 3x3 conv, paid for with the input and output transforms, so it wins where channels
// are many and planes large. `auto` times it against the other conv tactics per node.
#include <algorithm>
#include <vector>

#include "backends/cpu/fast/conv_geometry.h"
#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/sgemm.h"
#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/tactics.h"

namespace kiln {

namespace {

constexpr int64_t kTile = 16;  // 4x4 transformed values per tile

bool supportsWinograd(const Node& n, const Graph& g) {
    if (!conv2dNode(n) || n.attrs.getInt("group", 1) != 1 || n.attrs.getInts("strides", {1, 1}) != std::vector<int64_t>{1, 1} ||
        n.attrs.getInts("dilations", {1, 1}) != std::vector<int64_t>{1, 1})
        return false;
    if (auto k = n.attrs.getInts("kernel_shape"); !k.empty()) return k == std::vector<int64_t>{3, 3};
    auto w = n.inputs.size() > 1 ? g.initializers.find(n.inputs[1]) : g.initializers.end();
    return w != g.initializers.end() && w->second.rank() == 4 && w->second.dims()[2] == 3 && w->second.dims()[3] == 3;
}

// u = G g G^T for one 3x3 filter g (G rows: [1 0 0], [1/2 1/2 1/2], [1/2 -1/2 1/2], [0 0 1]).
void transformFilter(const float* g, float* u, int64_t stride) {
    float gg[4][3];
    for (int j = 0; j < 3; ++j) {
        gg[0][j] = g[j];
        gg[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
        gg[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
        gg[3][j] = g[6 + j];
    }
    for (int i = 0; i < 4; ++i) {
        const float a = gg[i][0], b = gg[i][1], c = gg[i][2];
        const float row[4] = {a, 0.5f * (a + b + c), 0.5f * (a - b + c), c};
        for (int j = 0; j < 4; ++j) u[(i * 4 + j) * stride] = row[j];
    }
}

// v = B^T d B for one 4x4 input tile d (B^T rows: [1 0 -1 0], [0 1 1 0], [0 -1 1 0], [0 1 0 -1]).
void transformInput(const float (&d)[4][4], float* v, int64_t stride) {
    float t[4][4];
    for (int j = 0; j < 4; ++j) {
        t[0][j] = d[0][j] - d[2][j];
        t[1][j] = d[1][j] + d[2][j];
        t[2][j] = d[2][j] - d[1][j];
        t[3][j] = d[1][j] - d[3][j];
    }
    for (int i = 0; i < 4; ++i) {
        const float r[4] = {t[i][0] - t[i][2], t[i][1] + t[i][2], t[i][2] - t[i][1], t[i][1] - t[i][3]};
        for (int j = 0; j < 4; ++j) v[(i * 4 + j) * stride] = r[j];
    }
}

std::vector<Tensor> winogradConv(const KernelContext& ctx) {
    Conv2d g;
    if (!conv2dGeometry(ctx, &g) || g.KH != 3 || g.KW != 3 || g.group != 1 || g.sh != 1 || g.sw != 1 || g.dh != 1 || g.dw != 1)
        return referenceFallback(ctx);
    const int64_t N = g.N, C = g.C, H = g.H, W = g.W, M = g.M, OH = g.OH, OW = g.OW, pt = g.pt, pl = g.pl;
    const Tensor* b = ctx.optionalInput(2);
    const Tensor* z = ctx.node.op_type == "FusedConv" ? ctx.optionalInput(3) : nullptr;
    const int64_t TH = (OH + 1) / 2, TW = (OW + 1) / 2, per_image = TH * TW, tiles = N * per_image;
    // U[16][M][C] once; then blocks of tiles, each block's V[16][C][tiles] and products
    // P[16][M][tiles] about 8 MB at most whatever the input size.
    const int64_t block = std::min(tiles, std::max<int64_t>(64, (int64_t{1} << 21) / (kTile * std::max(C, M))));
    std::vector<float> U(static_cast<size_t>(kTile * M * C)), V(static_cast<size_t>(kTile * C * block)), P(static_cast<size_t>(kTile * M * block));
    const float* wd = ctx.input(1).data<float>();
    parallelFor(M * C, M * C > 256, [&](int64_t mc) { transformFilter(wd + mc * 9, U.data() + mc, M * C); });
    const float* xd = ctx.input(0).data<float>();
    Tensor y = ctx.output(0, DType::F32, {N, M, OH, OW});
    float* yd = y.data<float>();
    for (int64_t t0 = 0; t0 < tiles; t0 += block) {
        const int64_t nt = std::min(block, tiles - t0);
#pragma omp parallel for schedule(static) collapse(2)
        for (int64_t c = 0; c < C; ++c)
            for (int64_t t = 0; t < nt; ++t) {
                const int64_t tile = t0 + t, n = tile / per_image, th = tile % per_image / TW, tw = tile % TW;
                const float* plane = xd + (n * C + c) * H * W;
                float d[4][4];
                for (int i = 0; i < 4; ++i) {
                    const int64_t ih = th * 2 - pt + i;
                    for (int j = 0; j < 4; ++j) {
                        const int64_t iw = tw * 2 - pl + j;
                        d[i][j] = ih >= 0 && ih < H && iw >= 0 && iw < W ? plane[ih * W + iw] : 0.0f;
                    }
                }
                transformInput(d, V.data() + c * nt + t, C * nt);
            }
        for (int64_t k = 0; k < kTile; ++k)
            kPreferredSgemm(false, false, M, nt, C, 1.0f, U.data() + k * M * C, C, V.data() + k * C * nt, nt, 0.0f, P.data() + k * M * nt, nt);
        // y = A^T p A for each tile (A^T rows: [1 1 1 0], [0 1 -1 -1]); tiles past the edge
        // keep only their inside outputs.
        const int64_t stride = M * nt;
#pragma omp parallel for schedule(static) collapse(2)
        for (int64_t m = 0; m < M; ++m)
            for (int64_t t = 0; t < nt; ++t) {
                const int64_t tile = t0 + t, n = tile / per_image, th = tile % per_image / TW, tw = tile % TW;
                const float* p = P.data() + m * nt + t;
                float s[2][4];
                for (int j = 0; j < 4; ++j) {
                    s[0][j] = p[j * stride] + p[(4 + j) * stride] + p[(8 + j) * stride];
                    s[1][j] = p[(4 + j) * stride] - p[(8 + j) * stride] - p[(12 + j) * stride];
                }
                float* out = yd + ((n * M + m) * OH + th * 2) * OW + tw * 2;
                for (int i = 0; i < 2 && th * 2 + i < OH; ++i) {
                    out[i * OW] = s[i][0] + s[i][1] + s[i][2];
                    if (tw * 2 + 1 < OW) out[i * OW + 1] = s[i][1] - s[i][2] - s[i][3];
                }
            }
    }
    const Activation act = ctx.node.op_type == "FusedConv" ? Activation::fromNode(ctx.node) : Activation{};
    for (int64_t n = 0; n < N; ++n)
        applyEpilogue(yd + n * M * OH * OW, M, OH * OW, b ? b->data<float>() : nullptr, true, z ? z->data<float>() + n * M * OH * OW : nullptr, act);
    return {y};
}

}  // namespace

void addWinogradConvTactics(std::vector<Tactic>& t) { t.push_back({"winograd", "conv", {"Conv", "FusedConv"}, supportsWinograd, winogradConv}); }

}  // namespace kiln
