#include "backends/cpu/reference/channel_blocks.h"

#include <cstring>

#include "ir/error.h"

namespace kiln {

namespace {

// Where the element (o, i, h, w) of [O, I, KH, KW] weights sits in the packed layout, and
// the packed tensor's dims.
struct WeightPacking {
    std::string layout;
    int64_t O, I, KH, KW;

    Dims packedDims() const {
        const int64_t ob = channelBlocks(O), b = kChannelBlock;
        if (layout == "OIhw8i8o") return {ob, channelBlocks(I), KH, KW, b, b};
        if (layout == "Ohwi8o") return {ob, KH, KW, I, b};
        return {ob, KH, KW, b};  // Goihw8g: I == 1, one filter per group
    }
    int64_t offset(int64_t o, int64_t i, int64_t h, int64_t w) const {
        const int64_t b = kChannelBlock, ob = o / b, ol = o % b;
        if (layout == "OIhw8i8o") return ((((ob * channelBlocks(I) + i / b) * KH + h) * KW + w) * b + i % b) * b + ol;
        if (layout == "Ohwi8o") return (((ob * KH + h) * KW + w) * I + i) * b + ol;
        return ((ob * KH + h) * KW + w) * b + ol;
    }
};

WeightPacking packing(const std::string& layout, const Dims& dims) {
    check(isPackedConvWeightLayout(layout), "unknown packed conv weight layout '" + layout + "'");
    check(dims.size() == 4, "packed conv weights need [O, I, KH, KW] dims");
    check(layout != "Goihw8g" || dims[1] == 1, "depthwise (Goihw8g) weights need one input channel per filter");
    return {layout, dims[0], dims[1], dims[2], dims[3]};
}

// Copies element `from` of src to element `to` of dst (element size `size`).
inline void copyElement(std::byte* dst, int64_t to, const std::byte* src, int64_t from, size_t size) {
    std::memcpy(dst + to * size, src + from * size, size);
}

// Calls f with a value of an unsigned integer type as wide as an element of `dtype` (the
// layout moves elements; it never reads them as numbers).
template <typename F>
void withElementType(DType dtype, F f) {
    switch (dtypeSize(dtype)) {
        case 1: return f(uint8_t{});
        case 2: return f(uint16_t{});
        case 4: return f(uint32_t{});
        case 8: return f(uint64_t{});
        default: throw Error("channel blocks: unsupported element size of " + std::string(dtypeName(dtype)));
    }
}

}  // namespace

bool isPackedConvWeightLayout(const std::string& layout) { return layout == "OIhw8i8o" || layout == "Ohwi8o" || layout == "Goihw8g"; }

namespace {

// Copies `from` into `to`: NCHW [N, C, HW] into blocked [N, C/8, HW, 8] when `to_blocked`,
// else back. Padded lanes are left as they are.
void moveChannels(const Tensor& from, Tensor& to, int64_t N, int64_t C, int64_t HW, bool to_blocked) {
    const int64_t CB = channelBlocks(C);
    withElementType(from.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* src = reinterpret_cast<const T*>(from.raw());
        T* dst = reinterpret_cast<T*>(to.raw());
        for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) {
                const int64_t plain = (n * C + c) * HW, blocked = (n * CB + c / kChannelBlock) * HW * kChannelBlock + c % kChannelBlock;
                for (int64_t p = 0; p < HW; ++p) {
                    if (to_blocked) dst[blocked + p * kChannelBlock] = src[plain + p];
                    else dst[plain + p] = src[blocked + p * kChannelBlock];
                }
            }
    });
}

}  // namespace

Tensor blockChannels(const Tensor& x) {
    check(x.rank() == 4, "blockChannels: the input must be 4-D NCHW, got " + dimsToString(x.dims()));
    Tensor y(x.dtype(), {x.dims()[0], channelBlocks(x.dims()[1]), x.dims()[2], x.dims()[3], kChannelBlock});  // zero-filled: the padded lanes
    moveChannels(x, y, x.dims()[0], x.dims()[1], x.dims()[2] * x.dims()[3], true);
    return y;
}

Tensor unblockChannels(const Tensor& x, int64_t channels) {
    check(x.rank() == 5 && x.dims()[4] == kChannelBlock, "unblockChannels: the input must be [N, C/8, H, W, 8], got " + dimsToString(x.dims()));
    check(channels > 0 && channelBlocks(channels) == x.dims()[1],
          "unblockChannels: " + std::to_string(channels) + " channels do not fill " + std::to_string(x.dims()[1]) + " blocks of 8");
    Tensor y = Tensor::uninitialized(x.dtype(), {x.dims()[0], channels, x.dims()[2], x.dims()[3]});
    moveChannels(x, y, x.dims()[0], channels, x.dims()[2] * x.dims()[3], false);
    return y;
}

Tensor packConvWeights(const Tensor& weights, const std::string& layout) {
    const WeightPacking pk = packing(layout, weights.dims());
    Tensor packed(weights.dtype(), pk.packedDims());  // zero-filled: padded channels stay zero
    const size_t size = dtypeSize(weights.dtype());
    int64_t from = 0;
    for (int64_t o = 0; o < pk.O; ++o)
        for (int64_t i = 0; i < pk.I; ++i)
            for (int64_t h = 0; h < pk.KH; ++h)
                for (int64_t w = 0; w < pk.KW; ++w) copyElement(packed.raw(), pk.offset(o, i, h, w), weights.raw(), from++, size);
    return packed;
}

Tensor unpackConvWeights(const Tensor& packed, const std::string& layout, const Dims& dims) {
    const WeightPacking pk = packing(layout, dims);
    check(packed.dims() == pk.packedDims(), "packed " + layout + " weights have dims " + dimsToString(packed.dims()) + ", expected " +
                                                dimsToString(pk.packedDims()) + " for " + dimsToString(dims));
    Tensor weights = Tensor::uninitialized(packed.dtype(), dims);
    const size_t size = dtypeSize(packed.dtype());
    int64_t to = 0;
    for (int64_t o = 0; o < pk.O; ++o)
        for (int64_t i = 0; i < pk.I; ++i)
            for (int64_t h = 0; h < pk.KH; ++h)
                for (int64_t w = 0; w < pk.KW; ++w) copyElement(weights.raw(), to++, packed.raw(), pk.offset(o, i, h, w), size);
    return weights;
}

}  // namespace kiln
