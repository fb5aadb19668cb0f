// What the fast CPU conv tactics (conv_fast.cc, conv_depthwise.cc, conv_winograd.cc) share:
// which nodes are 2-D NCHW convolutions, a conv's geometry at run time, the fused epilogue.
// (Their reference fallback is the one every tactic shares: referenceFallback in tactics.h.)
#pragma once
#include <cstdint>

#include "backends/cpu/reference/kernel.h"

namespace kiln {

struct Conv2d {
    int64_t N, C, H, W, M, KH, KW, OH, OW, group, sh, sw, dh, dw, pt, pl;
};

// A Conv or FusedConv node over NCHW data with a 2-D kernel.
bool conv2dNode(const Node& n);
// Geometry of a 2-D conv, or false when the tensors do not fit the fast kernels (f32, rank 4,
// consistent groups, bias of M values, residual of the output's shape).
bool conv2dGeometry(const KernelContext& ctx, Conv2d* g);
// The node's bias, residual and activation over output channels [m0, m0 + mc) and columns
// [c0, c0 + nc) of image n of y.
void blockEpilogue(const KernelContext& ctx, const Conv2d& g, Tensor& y, int64_t n, int64_t m0, int64_t mc, int64_t c0, int64_t nc);

}  // namespace kiln
