#include "ir/dtype.h"

#include <array>

namespace kiln {

namespace {
struct DTypeInfo {
    DType type;
    std::string_view name;
    size_t size;
};
constexpr std::array<DTypeInfo, 14> kDTypes = {{
    {DType::Undefined, "undefined", 0},
    {DType::F32, "f32", 4},
    {DType::F16, "f16", 2},
    {DType::BF16, "bf16", 2},
    {DType::F64, "f64", 8},
    {DType::I8, "i8", 1},
    {DType::I16, "i16", 2},
    {DType::I32, "i32", 4},
    {DType::I64, "i64", 8},
    {DType::U8, "u8", 1},
    {DType::U16, "u16", 2},
    {DType::U32, "u32", 4},
    {DType::U64, "u64", 8},
    {DType::Bool, "bool", 1},
}};
const DTypeInfo& info(DType t) { return kDTypes.at(static_cast<size_t>(t)); }
}  // namespace

size_t dtypeSize(DType t) { return info(t).size; }
std::string_view dtypeName(DType t) { return info(t).name; }

DType parseDType(std::string_view name) {
    for (const auto& d : kDTypes)
        if (d.name == name && d.type != DType::Undefined) return d.type;
    throw Error("unknown element type '" + std::string(name) + "' (expected f32, f16, bf16, f64, i8, i16, i32, i64, u8, u16, u32, u64 or bool)");
}

bool isFloating(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }
bool isSignedInteger(DType t) { return t == DType::I8 || t == DType::I16 || t == DType::I32 || t == DType::I64; }
bool isUnsignedInteger(DType t) { return t == DType::U8 || t == DType::U16 || t == DType::U32 || t == DType::U64; }

}  // namespace kiln
