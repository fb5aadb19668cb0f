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

Tensor blockChannels(const Tensor& x) {
    check(x.rank() == 4, "blockChannels: the input must be 4-D NCHW, got " + dimsToString(x.dims()));
    const int64_t N = x.dims()[0], C = x.dims()[1], HW = x.dims()[2] * x.dims()[3], CB = channelBlocks(C);
    Tensor y(x.dtype(), {N, CB, x.dims()[2], x.dims()[3], kChannelBlock});  // zero-filled: the padded lanes
    withElementType(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* src = reinterpret_cast<const T*>(x.raw());
        T* dst = reinterpret_cast<T*>(y.raw());
        for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) {
                const T* from = src + (n * C + c) * HW;
                T* to = dst + (n * CB + c / kChannelBlock) * HW * kChannelBlock + c % kChannelBlock;
                for (int64_t p = 0; p < HW; ++p) to[p * kChannelBlock] = from[p];
            }
    });
    return y;
}

Tensor unblockChannels(const Tensor& x, int64_t channels) {
    check(x.rank() == 5 && x.dims()[4] == kChannelBlock, "unblockChannels: the input must be [N, C/8, H, W, 8], got " + dimsToString(x.dims()));
    const int64_t N = x.dims()[0], CB = x.dims()[1], HW = x.dims()[2] * x.dims()[3], C = channels;
    check(C > 0 && channelBlocks(C) == CB, "unblockChannels: " + std::to_string(C) + " channels do not fill " + std::to_string(CB) + " blocks of 8");
    Tensor y = Tensor::uninitialized(x.dtype(), {N, C, x.dims()[2], x.dims()[3]});
    withElementType(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* src = reinterpret_cast<const T*>(x.raw());
        T* dst = reinterpret_cast<T*>(y.raw());
        for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) {
                const T* from = src + (n * CB + c / kChannelBlock) * HW * kChannelBlock + c % kChannelBlock;
                T* to = dst + (n * C + c) * HW;
                for (int64_t p = 0; p < HW; ++p) to[p] = from[p * kChannelBlock];
            }
    });
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
