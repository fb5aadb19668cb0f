// What a Resize / Upsample node computes, decided once from its attributes and inputs: the
// reference kernel and the fast CPU kernel both resize by this plan, so they agree on every
// coordinate mode, rounding rule and output size.
#pragma once
#include <string>
#include <vector>

#include "backends/cpu/reference/kernel.h"

namespace kiln {

struct ResizeOptions {
    std::string mode, coord, nearest;
    double cubic_a = -0.75, extrapolation = 0;
    bool exclude_outside = false;
};

// One source tap of an output coordinate along one axis.
struct Tap {
    int64_t index;  // -1: outside the input (tf_crop_and_resize: the extrapolation value)
    double weight;
};

struct ResizePlan {
    ResizeOptions options;
    std::vector<double> scales;  // one per input dim
    std::vector<double> roi;     // empty, or starts then ends, one per dim
    Dims out_dims;
};

// Reads the node's mode, coordinate transformation, scales or sizes (with opset 18's axes and
// keep_aspect_ratio_policy); fails with the node named on what it cannot do.
ResizePlan planResize(const KernelContext& ctx);

// The taps of output index `out_i` along an axis of `in` inputs and `out` outputs.
std::vector<Tap> axisTaps(const ResizeOptions& o, int64_t out_i, double scale, int64_t in, int64_t out, double roi_start, double roi_end);

}  // namespace kiln
