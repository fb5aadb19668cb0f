// 16-bit float storage types. Arithmetic goes through float, which is exact for
// conversion and is what a reference runtime wants.
#pragma once
#include <cstdint>
#include <cstring>

namespace kiln {

inline float bitsToFloat(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}
inline uint32_t floatToBits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

// IEEE 754 binary16, round-to-nearest-even on conversion from float.
struct Half {
    uint16_t bits = 0;
    Half() = default;
    Half(float f) : bits(fromFloat(f)) {}  // NOLINT: implicit by design, like a numeric type
    operator float() const { return toFloat(bits); }

    static uint16_t fromFloat(float f) {
        uint32_t x = floatToBits(f);
        uint32_t sign = (x >> 16) & 0x8000u;
        uint32_t absx = x & 0x7fffffffu;
        if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
        if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
        if (absx < 0x38800000u) {                                             // subnormal or zero
            // Scale into the subnormal range with float arithmetic (exact rounding by the FPU).
            float scaled = bitsToFloat(absx) * 16777216.0f;  // 2^24
            uint32_t m = static_cast<uint32_t>(scaled);
            float rem = scaled - static_cast<float>(m);
            if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
            return static_cast<uint16_t>(sign | m);
        }
        uint32_t mant = absx & 0x7fffffu;
        uint32_t exp = (absx >> 23) - 112;
        uint32_t h = (exp << 10) | (mant >> 13);
        uint32_t rest = mant & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
        return static_cast<uint16_t>(sign | h);
    }
    static float toFloat(uint16_t h) {
        uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
        uint32_t exp = (h >> 10) & 0x1fu;
        uint32_t mant = h & 0x3ffu;
        if (exp == 0) {
            float v = static_cast<float>(mant) / 16777216.0f;
            return sign ? -v : v;
        }
        if (exp == 31) return bitsToFloat(sign | 0x7f800000u | (mant << 13));
        return bitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
    }
};

// bfloat16: the top half of a float, round-to-nearest-even.
struct BFloat16 {
    uint16_t bits = 0;
    BFloat16() = default;
    BFloat16(float f) : bits(fromFloat(f)) {}  // NOLINT
    operator float() const { return bitsToFloat(static_cast<uint32_t>(bits) << 16); }

    static uint16_t fromFloat(float f) {
        uint32_t x = floatToBits(f);
        if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
        uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
        return static_cast<uint16_t>((x + rounding) >> 16);
    }
};

}  // namespace kiln
