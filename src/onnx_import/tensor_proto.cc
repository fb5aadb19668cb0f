#include "onnx_import/tensor_proto.h"

#include <onnx/onnx_pb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "onnx_import/npy.h"
#include "ir/file_write.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {
struct OnnxType {
    int onnx;
    DType dtype;
};
constexpr OnnxType kOnnxTypes[] = {
    {onnx::TensorProto::FLOAT, DType::F32},   {onnx::TensorProto::UINT8, DType::U8},    {onnx::TensorProto::INT8, DType::I8},
    {onnx::TensorProto::UINT16, DType::U16},  {onnx::TensorProto::INT16, DType::I16},   {onnx::TensorProto::INT32, DType::I32},
    {onnx::TensorProto::INT64, DType::I64},   {onnx::TensorProto::BOOL, DType::Bool},   {onnx::TensorProto::FLOAT16, DType::F16},
    {onnx::TensorProto::DOUBLE, DType::F64},  {onnx::TensorProto::UINT32, DType::U32},  {onnx::TensorProto::UINT64, DType::U64},
    {onnx::TensorProto::BFLOAT16, DType::BF16},
};

// Resolves an external-data location inside `base_dir`; refuses absolute paths and `..` escapes.
fs::path resolveInside(const fs::path& base_dir, const std::string& location, const std::string& tensor) {
    fs::path rel(location);
    check(!location.empty() && rel.is_relative(), "tensor '" + tensor + "': external data location '" + location + "' must be a relative path");
    fs::path base = fs::weakly_canonical(base_dir.empty() ? fs::path(".") : base_dir);
    fs::path full = fs::weakly_canonical(base / rel);
    auto [b, f] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
    check(b == base.end(), "tensor '" + tensor + "': external data location '" + location + "' escapes the model's folder");
    return full;
}

int64_t externalNumber(const std::string& value, const std::string& key, const std::string& tensor) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    check(!value.empty() && *end == 0 && errno == 0 && v >= 0, "tensor '" + tensor + "': external data " + key + " '" + value + "' is not a non-negative integer");
    return v;
}

// Reads `bytes` (the checked size of dtype x dims) of external data into a new tensor.
Tensor readExternal(const onnx::TensorProto& proto, const fs::path& base_dir, DType dtype, const Dims& dims, size_t bytes) {
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& kv : proto.external_data()) {
        if (kv.key() == "location") location = kv.value();
        else if (kv.key() == "offset") offset = externalNumber(kv.value(), "offset", proto.name());
        else if (kv.key() == "length") length = externalNumber(kv.value(), "length", proto.name());
    }
    fs::path file = resolveInside(base_dir, location, proto.name());
    // Only a regular file: opening a FIFO or a device would block or read without end.
    std::error_code ec;
    check(fs::exists(file, ec), "tensor '" + proto.name() + "': cannot open external data file " + file.string() + " (no such file)");
    check(fs::is_regular_file(file, ec), "tensor '" + proto.name() + "': external data " + file.string() + " is not a regular file");
    const int64_t file_size = static_cast<int64_t>(fs::file_size(file, ec));
    check(!ec, "tensor '" + proto.name() + "': cannot read the size of external data file " + file.string());
    const int64_t want = static_cast<int64_t>(bytes);
    check(length < 0 || length == want, "tensor '" + proto.name() + "': external data length " + std::to_string(length) + " does not match " +
                                            std::string(dtypeName(dtype)) + dimsToString(dims));
    check(offset <= file_size && want <= file_size - offset, "tensor '" + proto.name() + "': external data file " + file.string() + " is too short");
    std::ifstream in(file, std::ios::binary);
    check(in.good(), "tensor '" + proto.name() + "': cannot open external data file " + file.string());
    Tensor t = Tensor::uninitialized(dtype, dims);
    in.seekg(offset);
    in.read(reinterpret_cast<char*>(t.raw()), want);
    check(in.good(), "tensor '" + proto.name() + "': failed to read external data from " + file.string());
    return t;
}

template <typename T, typename Field>
void copyField(const Field& field, Tensor& t, const std::string& name) {
    check(static_cast<int64_t>(field.size()) == t.numel(), "tensor '" + name + "': has " + std::to_string(field.size()) + " values for shape " + dimsToString(t.dims()));
    T* p = reinterpret_cast<T*>(t.raw());
    for (int i = 0; i < field.size(); ++i) p[i] = static_cast<T>(field.Get(i));
}
}  // namespace

DType dtypeFromOnnx(int onnx_type, const std::string& what) {
    for (const auto& t : kOnnxTypes)
        if (t.onnx == onnx_type) return t.dtype;
    const auto* desc = onnx::TensorProto::DataType_descriptor()->FindValueByNumber(onnx_type);
    throw Error(what + ": element type " + (desc ? desc->name() : std::to_string(onnx_type)) + " is not supported");
}

int dtypeToOnnx(DType d) {
    for (const auto& t : kOnnxTypes)
        if (t.dtype == d) return t.onnx;
    throw Error("element type " + std::string(dtypeName(d)) + " has no ONNX equivalent");
}

// How many values the proto's typed field for `dtype` holds.
int64_t fieldSize(const onnx::TensorProto& proto, DType dtype) {
    switch (dtype) {
        case DType::F32: return proto.float_data_size();
        case DType::F64: return proto.double_data_size();
        case DType::I64: return proto.int64_data_size();
        case DType::U32:
        case DType::U64: return proto.uint64_data_size();
        default: return proto.int32_data_size();
    }
}

Tensor tensorFromProto(const onnx::TensorProto& proto, const fs::path& base_dir) {
    const std::string& name = proto.name();
    DType dtype = dtypeFromOnnx(proto.data_type(), "tensor '" + name + "'");
    Dims dims(proto.dims().begin(), proto.dims().end());
    for (int64_t d : dims) check(d >= 0, "tensor '" + name + "': negative dimension in " + dimsToString(dims));
    // The size is checked, and matched against the data the proto holds, before any allocation.
    const size_t bytes = tensorBytes(dtype, dims, "tensor '" + name + "'");
    const int64_t numel = numElements(dims);
    if (proto.data_location() == onnx::TensorProto::EXTERNAL) return readExternal(proto, base_dir, dtype, dims, bytes);
    Tensor t;
    if (proto.has_raw_data()) {
        check(proto.raw_data().size() == bytes, "tensor '" + name + "': raw data has " + std::to_string(proto.raw_data().size()) + " bytes, expected " + std::to_string(bytes) +
                                                    " for " + std::string(dtypeName(dtype)) + dimsToString(dims));
        t = Tensor::uninitialized(dtype, dims);
        std::memcpy(t.raw(), proto.raw_data().data(), bytes);
        return t;
    }
    if (numel == 0) return Tensor(dtype, dims);
    check(fieldSize(proto, dtype) == numel, "tensor '" + name + "': has " + std::to_string(fieldSize(proto, dtype)) + " values for shape " + dimsToString(dims));
    t = Tensor::uninitialized(dtype, dims);
    switch (dtype) {
        case DType::F32: copyField<float>(proto.float_data(), t, name); break;
        case DType::F64: copyField<double>(proto.double_data(), t, name); break;
        case DType::I64: copyField<int64_t>(proto.int64_data(), t, name); break;
        case DType::U32: copyField<uint32_t>(proto.uint64_data(), t, name); break;
        case DType::U64: copyField<uint64_t>(proto.uint64_data(), t, name); break;
        case DType::I32: copyField<int32_t>(proto.int32_data(), t, name); break;
        case DType::I16: copyField<int16_t>(proto.int32_data(), t, name); break;
        case DType::I8: copyField<int8_t>(proto.int32_data(), t, name); break;
        case DType::U16:
        case DType::F16:
        case DType::BF16: copyField<uint16_t>(proto.int32_data(), t, name); break;  // 16-bit patterns
        case DType::U8: copyField<uint8_t>(proto.int32_data(), t, name); break;
        case DType::Bool: copyField<bool>(proto.int32_data(), t, name); break;
        case DType::Undefined: break;
    }
    return t;
}

void tensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto& proto) {
    proto.Clear();
    proto.set_name(name);
    proto.set_data_type(dtypeToOnnx(t.dtype()));
    for (int64_t d : t.dims()) proto.add_dims(d);
    proto.set_raw_data(std::string(reinterpret_cast<const char*>(t.raw()), t.byteSize()));
}

Tensor loadTensorFile(const fs::path& path, std::string* name) {
    check(fs::exists(path), path.string() + ": no such file");
    std::error_code ec;
    check(fs::is_regular_file(path, ec), path.string() + ": not a regular file");
    if (path.extension() == ".npy") return loadNpy(path);
    std::ifstream in(path, std::ios::binary);
    check(in.good(), path.string() + ": cannot open file");
    onnx::TensorProto proto;
    check(proto.ParseFromIstream(&in), path.string() + ": not a valid TensorProto (.pb) file");
    if (name) *name = proto.name();
    return tensorFromProto(proto, path.parent_path());
}

void saveTensorFile(const Tensor& t, const std::string& name, const fs::path& path) {
    if (path.extension() == ".npy") return saveNpy(t, path);
    onnx::TensorProto proto;
    tensorToProto(t, name, proto);
    std::string bytes;
    check(proto.SerializeToString(&bytes), path.string() + ": cannot serialize " + t.summary());
    writeFileAtomically(path, bytes);
}

}  // namespace kiln
