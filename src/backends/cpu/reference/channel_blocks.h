// Channel-blocked ("NCHW8c", "NCHW16c") activations and the packed conv weights that go with
// them: the layouts oneDNN's AVX2 (8 lanes) and AVX-512 (16 lanes) convolutions run on
// without a transpose between layers. A blocked activation of logical shape [N, C, H, W] is
// stored as [N, ceil(C/b), H, W, b], channel c at block c / b, lane c % b; lanes past C hold
// zeros. The block size b is the tensor's last dim. The layout pass (passes/
// layout_assignment.cc) rewrites conv chains onto it; these helpers are the layout's
// definition, used by the pass (packing), the reference kernels and the tests.
#pragma once
#include <cstdint>
#include <string>

#include "ir/tensor.h"

namespace kiln {

constexpr int64_t kChannelBlock = 8;       // AVX2: one 8-float vector per pixel
constexpr int64_t kWideChannelBlock = 16;  // AVX-512: one 16-float vector per pixel
inline bool isChannelBlock(int64_t b) { return b == kChannelBlock || b == kWideChannelBlock; }

inline int64_t channelBlocks(int64_t channels, int64_t block = kChannelBlock) { return (channels + block - 1) / block; }

// "NCHW8c" -> 8, "NCHW16c" -> 16; 0 for any other data layout.
int64_t blockedDataLayoutBlock(const std::string& data_layout);
std::string blockedDataLayout(int64_t block);  // 8 -> "NCHW8c", 16 -> "NCHW16c"

// [N, C, H, W] -> [N, ceil(C/b), H, W, b], padded lanes zero. Any element type.
Tensor blockChannels(const Tensor& x, int64_t block = kChannelBlock);
// [N, ceil(C/b), H, W, b] -> [N, C, H, W] (C = channels, which must fit the blocks; b = 8 or 16).
Tensor unblockChannels(const Tensor& x, int64_t channels);

// Packed conv weights. Names follow oneDNN's format tags (the packed buffer is what oneDNN
// reads for that tag), b = 8 or 16: "OIhw<b>i<b>o" (group 1 over blocked input), "Ohwi<b>o"
// (group 1 over a plain NCHW input with few channels: a network's first conv), "Goihw<b>g"
// (depthwise: group = C = O, one filter per channel), "gOIhw<b>i<b>o" (grouped, with each
// group's input and output channels whole blocks: the same buffer as OIhw<b>i<b>o over
// [O, C/group], since the groups' output blocks follow each other), "goihw<b>" (grouped with
// groups smaller than a block, ResNeXt's 4 and 8 channels: the weights as ONNX gives them,
// oneDNN's goihw, for a conv on <b>-blocked data). `weights` is the ONNX [O, C/group, KH, KW]
// f32 tensor.
enum class PackedConvWeights { OIhwIO, Ohwio, Goihwg, GOIhwIO, Goihw };
std::string packedConvWeightLayout(PackedConvWeights kind, int64_t block);
Tensor packConvWeights(const Tensor& weights, const std::string& layout);
// The inverse: the ONNX [O, I, KH, KW] weights from a packed tensor (dims = [O, I, KH, KW]).
Tensor unpackConvWeights(const Tensor& packed, const std::string& layout, const Dims& dims);
// Whether `layout` is one of the packed weight layouts above; its kind and block size.
bool isPackedConvWeightLayout(const std::string& layout);
PackedConvWeights packedConvWeightKind(const std::string& layout);
int64_t packedConvWeightBlock(const std::string& layout);

}  // namespace kiln
