// Channel-blocked ("NCHW8c") activations and the packed conv weights that go with them: the
// layout oneDNN's AVX2 convolutions run on without a transpose between layers. A blocked
// activation of logical shape [N, C, H, W] is stored as [N, ceil(C/8), H, W, 8], channel c at
// block c / 8, lane c % 8; lanes past C hold zeros. The layout pass (passes/
// layout_assignment.cc) rewrites conv chains onto it; these helpers are the layout's
// definition, used by the pass (packing), the reference kernels and the tests.
#pragma once
#include <cstdint>
#include <string>

#include "ir/tensor.h"

namespace kiln {

constexpr int64_t kChannelBlock = 8;

inline int64_t channelBlocks(int64_t channels) { return (channels + kChannelBlock - 1) / kChannelBlock; }

// [N, C, H, W] -> [N, ceil(C/8), H, W, 8], padded lanes zero. Any element type.
Tensor blockChannels(const Tensor& x);
// [N, ceil(C/8), H, W, 8] -> [N, C, H, W] (C = channels, which must fit the blocks).
Tensor unblockChannels(const Tensor& x, int64_t channels);

// Packed conv weights. Names follow oneDNN's format tags (the packed buffer is what oneDNN
// reads for that tag): "OIhw8i8o" (group 1 over blocked input), "Ohwi8o" (group 1 over a
// plain NCHW input with few channels: a network's first conv), "Goihw8g" (depthwise: group
// = C = O, one filter per channel). `weights` is the ONNX [O, C/group, KH, KW] f32 tensor.
Tensor packConvWeights(const Tensor& weights, const std::string& layout);
// The inverse: the ONNX [O, I, KH, KW] weights from a packed tensor (dims = [O, I, KH, KW]).
Tensor unpackConvWeights(const Tensor& packed, const std::string& layout, const Dims& dims);
// Whether `layout` is one of the packed weight layouts above.
bool isPackedConvWeightLayout(const std::string& layout);

}  // namespace kiln
