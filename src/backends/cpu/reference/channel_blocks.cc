#include "backends/cpu/reference/channel_blocks.h"

#include <cstring>

#include "ir/error.h"

namespace kiln {

namespace {

// Where the element (o, i, h, w) of [O, I, KH, KW] weights sits in the packed layout, and
// the packed tensor's dims.
struct WeightPacking {
    PackedConvWeights kind;
    int64_t b, O, I, KH, KW;

    Dims packedDims() const {
        const int64_t ob = channelBlocks(O, b);
        if (kind == PackedConvWeights::OIhwIO || kind == PackedConvWeights::GOIhwIO) return {ob, channelBlocks(I, b), KH, KW, b, b};
        if (kind == PackedConvWeights::Ohwio) return {ob, KH, KW, I, b};
        if (kind == PackedConvWeights::Goihw) return {O, I, KH, KW};
        return {ob, KH, KW, b};  // Goihw<b>g: I == 1, one filter per group
    }
    int64_t offset(int64_t o, int64_t i, int64_t h, int64_t w) const {
        const int64_t ob = o / b, ol = o % b;
        if (kind == PackedConvWeights::OIhwIO || kind == PackedConvWeights::GOIhwIO) return ((((ob * channelBlocks(I, b) + i / b) * KH + h) * KW + w) * b + i % b) * b + ol;
        if (kind == PackedConvWeights::Ohwio) return (((ob * KH + h) * KW + w) * I + i) * b + ol;
        if (kind == PackedConvWeights::Goihw) return ((o * I + i) * KH + h) * KW + w;
        return ((ob * KH + h) * KW + w) * b + ol;
    }
};

WeightPacking packing(const std::string& layout, const Dims& dims) {
    check(isPackedConvWeightLayout(layout), [&] { return "unknown packed conv weight layout '" + layout + "'"; });
    check(dims.size() == 4, "packed conv weights need [O, I, KH, KW] dims");
    const PackedConvWeights kind = packedConvWeightKind(layout);
    check(kind != PackedConvWeights::Goihwg || dims[1] == 1, [&] { return "depthwise (" + layout + ") weights need one input channel per filter"; });
    return {kind, packedConvWeightBlock(layout), dims[0], dims[1], dims[2], dims[3]};
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

std::string packedConvWeightLayout(PackedConvWeights kind, int64_t block) {
    const std::string b = std::to_string(block);
    if (kind == PackedConvWeights::OIhwIO) return "OIhw" + b + "i" + b + "o";
    if (kind == PackedConvWeights::GOIhwIO) return "gOIhw" + b + "i" + b + "o";
    if (kind == PackedConvWeights::Ohwio) return "Ohwi" + b + "o";
    if (kind == PackedConvWeights::Goihw) return "goihw" + b;
    return "Goihw" + b + "g";
}

int64_t packedConvWeightBlock(const std::string& layout) {
    for (int64_t b : {kChannelBlock, kWideChannelBlock})
        for (auto kind : {PackedConvWeights::OIhwIO, PackedConvWeights::Ohwio, PackedConvWeights::Goihwg, PackedConvWeights::GOIhwIO, PackedConvWeights::Goihw})
            if (layout == packedConvWeightLayout(kind, b)) return b;
    return 0;
}

PackedConvWeights packedConvWeightKind(const std::string& layout) {
    if (layout.rfind("gOIhw", 0) == 0) return PackedConvWeights::GOIhwIO;
    if (layout.rfind("goihw", 0) == 0) return PackedConvWeights::Goihw;
    return layout.rfind("OIhw", 0) == 0 ? PackedConvWeights::OIhwIO : layout.rfind("Ohwi", 0) == 0 ? PackedConvWeights::Ohwio : PackedConvWeights::Goihwg;
}

bool isPackedConvWeightLayout(const std::string& layout) { return packedConvWeightBlock(layout) != 0; }

int64_t blockedDataLayoutBlock(const std::string& data_layout) {
    return data_layout == "NCHW8c" ? kChannelBlock : data_layout == "NCHW16c" ? kWideChannelBlock : 0;
}

std::string blockedDataLayout(int64_t block) { return "NCHW" + std::to_string(block) + "c"; }

namespace {

// Copies `from` into `to`: NCHW [N, C, HW] into blocked [N, C/b, HW, b] when `to_blocked`,
// else back. Padded lanes are left as they are.
void moveChannels(const Tensor& from, Tensor& to, int64_t N, int64_t C, int64_t HW, int64_t b, bool to_blocked) {
    const int64_t CB = channelBlocks(C, b);
    withElementType(from.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* src = reinterpret_cast<const T*>(from.raw());
        T* dst = reinterpret_cast<T*>(to.raw());
        for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) {
                const int64_t plain = (n * C + c) * HW, blocked = (n * CB + c / b) * HW * b + c % b;
                for (int64_t p = 0; p < HW; ++p) {
                    if (to_blocked) dst[blocked + p * b] = src[plain + p];
                    else dst[plain + p] = src[blocked + p * b];
                }
            }
    });
}

}  // namespace

Tensor blockChannels(const Tensor& x, int64_t block) {
    check(x.rank() == 4, [&] { return "blockChannels: the input must be 4-D NCHW, got " + dimsToString(x.dims()); });
    check(isChannelBlock(block), [&] { return "blockChannels: blocks of " + std::to_string(block) + " channels (8 or 16 are defined)"; });
    Tensor y(x.dtype(), {x.dims()[0], channelBlocks(x.dims()[1], block), x.dims()[2], x.dims()[3], block});  // zero-filled: the padded lanes
    moveChannels(x, y, x.dims()[0], x.dims()[1], x.dims()[2] * x.dims()[3], block, true);
    return y;
}

Tensor unblockChannels(const Tensor& x, int64_t channels) {
    check(x.rank() == 5 && isChannelBlock(x.dims()[4]), [&] { return "unblockChannels: the input must be [N, C/b, H, W, b] with b 8 or 16, got " + dimsToString(x.dims()); });
    const int64_t b = x.dims()[4];
    check(channels > 0 && channelBlocks(channels, b) == x.dims()[1],
          [&] { return "unblockChannels: " + std::to_string(channels) + " channels do not fill " + std::to_string(x.dims()[1]) + " blocks of " + std::to_string(b); });
    Tensor y = Tensor::uninitialized(x.dtype(), {x.dims()[0], channels, x.dims()[2], x.dims()[3]});
    moveChannels(x, y, x.dims()[0], channels, x.dims()[2] * x.dims()[3], b, false);
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
    check(packed.dims() == pk.packedDims(), [&] { return "packed " + layout + " weights have dims " + dimsToString(packed.dims()) + ", expected " +
                                                dimsToString(pk.packedDims()) + " for " + dimsToString(dims); });
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
