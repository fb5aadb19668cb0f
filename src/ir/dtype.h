// Element types of tensors, with sizes and names, and a dispatcher that turns a runtime
// DType into a compile-time C++ type for kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ir/error.h"
#include "ir/half.h"

namespace kiln {

enum class DType : uint8_t {
    Undefined,
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
};

size_t dtypeSize(DType t);
std::string_view dtypeName(DType t);
// Parses a name such as "f32"; throws Error naming the text otherwise.
DType parseDType(std::string_view name);
bool isFloating(DType t);
bool isSignedInteger(DType t);
bool isUnsignedInteger(DType t);
inline bool isInteger(DType t) { return isSignedInteger(t) || isUnsignedInteger(t); }
// int8 or uint8: the types of quantized tensors that the int8 kernels take.
inline bool isEightBitInteger(DType t) { return t == DType::I8 || t == DType::U8; }

template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::F16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::BF16; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::I8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::I16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::U16; };
template <> struct DTypeOf<uint32_t> { static constexpr DType value = DType::U32; };
template <> struct DTypeOf<uint64_t> { static constexpr DType value = DType::U64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };

template <typename T>
struct TypeTag {
    using type = T;
};

// Calls fn(TypeTag<T>{}) for the C++ type T of `t`. `what` names the caller in errors.
template <typename Fn>
decltype(auto) dispatchDType(DType t, std::string_view what, Fn&& fn) {
    switch (t) {
        case DType::F32: return fn(TypeTag<float>{});
        case DType::F16: return fn(TypeTag<Half>{});
        case DType::BF16: return fn(TypeTag<BFloat16>{});
        case DType::F64: return fn(TypeTag<double>{});
        case DType::I8: return fn(TypeTag<int8_t>{});
        case DType::I16: return fn(TypeTag<int16_t>{});
        case DType::I32: return fn(TypeTag<int32_t>{});
        case DType::I64: return fn(TypeTag<int64_t>{});
        case DType::U8: return fn(TypeTag<uint8_t>{});
        case DType::U16: return fn(TypeTag<uint16_t>{});
        case DType::U32: return fn(TypeTag<uint32_t>{});
        case DType::U64: return fn(TypeTag<uint64_t>{});
        case DType::Bool: return fn(TypeTag<bool>{});
        case DType::Undefined: break;
    }
    throw Error(std::string(what) + ": unsupported element type " + std::string(dtypeName(t)));
}

// Like dispatchDType but only for numeric (non-bool) types.
template <typename Fn>
decltype(auto) dispatchNumeric(DType t, std::string_view what, Fn&& fn) {
    if (t == DType::Bool) throw Error(std::string(what) + ": bool tensors are not supported here");
    return dispatchDType(t, what, std::forward<Fn>(fn));
}

// Only floating types (f32, f16, bf16, f64).
template <typename Fn>
decltype(auto) dispatchFloat(DType t, std::string_view what, Fn&& fn) {
    switch (t) {
        case DType::F32: return fn(TypeTag<float>{});
        case DType::F16: return fn(TypeTag<Half>{});
        case DType::BF16: return fn(TypeTag<BFloat16>{});
        case DType::F64: return fn(TypeTag<double>{});
        default: break;
    }
    throw Error(std::string(what) + ": expected a floating-point tensor, got " + std::string(dtypeName(t)));
}

}  // namespace kiln
