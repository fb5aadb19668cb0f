#include "onnx_import/npy.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>

#include "ir/file_write.h"

namespace kiln {

namespace {
struct NpyType {
    DType dtype;
    const char* descr;
};
constexpr NpyType kNpyTypes[] = {
    {DType::F32, "<f4"}, {DType::F16, "<f2"}, {DType::F64, "<f8"}, {DType::I8, "|i1"},  {DType::I16, "<i2"},
    {DType::I32, "<i4"}, {DType::I64, "<i8"}, {DType::U8, "|u1"},  {DType::U16, "<u2"}, {DType::U32, "<u4"},
    {DType::U64, "<u8"}, {DType::Bool, "|b1"},
};
}  // namespace

Tensor loadNpy(const std::filesystem::path& path) {
    std::error_code ec;
    check(std::filesystem::is_regular_file(path, ec), path.string() + ": not a regular file");
    std::ifstream in(path, std::ios::binary);
    check(in.good(), path.string() + ": cannot open file");
    char magic[8] = {};
    in.read(magic, 8);
    check(in.gcount() == 8 && std::memcmp(magic, "\x93NUMPY", 6) == 0, path.string() + ": not a .npy file");
    uint32_t header_len = 0;
    if (magic[6] == 1) {
        unsigned char b[2] = {};
        in.read(reinterpret_cast<char*>(b), 2);
        header_len = b[0] | (b[1] << 8);
    } else {
        unsigned char b[4] = {};
        in.read(reinterpret_cast<char*>(b), 4);
        header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
    }
    check(in.good() && header_len < (1u << 20), path.string() + ": bad .npy header");
    std::string header(header_len, '\0');
    in.read(header.data(), header_len);
    check(in.good(), path.string() + ": truncated .npy header");

    std::smatch m;
    check(std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'")), path.string() + ": .npy header has no descr");
    std::string descr = m[1];
    if (descr == "<b1") descr = "|b1";
    if (descr == "<i1") descr = "|i1";
    if (descr == "<u1") descr = "|u1";
    DType dtype = DType::Undefined;
    for (const auto& t : kNpyTypes)
        if (descr == t.descr) dtype = t.dtype;
    check(dtype != DType::Undefined, path.string() + ": unsupported .npy dtype '" + descr + "'");
    check(!std::regex_search(header, std::regex("'fortran_order':\\s*True")), path.string() + ": Fortran-order .npy files are not supported");
    check(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), path.string() + ": .npy header has no shape");
    Dims dims;
    std::string shape_text = m[1];
    std::regex num("\\d+");
    for (auto it = std::sregex_iterator(shape_text.begin(), shape_text.end(), num); it != std::sregex_iterator(); ++it) {
        errno = 0;
        const unsigned long long d = std::strtoull(it->str().c_str(), nullptr, 10);
        check(errno == 0 && d <= static_cast<unsigned long long>(INT64_MAX), path.string() + ": .npy dimension " + it->str() + " is too large");
        dims.push_back(static_cast<int64_t>(d));
    }
    // The size is checked against the limit and the file before anything is allocated.
    const size_t bytes = tensorBytes(dtype, dims, path.string());
    const auto data_at = static_cast<uintmax_t>(in.tellg());
    const uintmax_t file_size = std::filesystem::file_size(path, ec);
    check(!ec && file_size >= data_at && file_size - data_at >= bytes,
          path.string() + ": truncated .npy data (expected " + std::to_string(bytes) + " bytes for " + std::string(dtypeName(dtype)) + dimsToString(dims) + ")");
    Tensor t = Tensor::uninitialized(dtype, dims);
    in.read(reinterpret_cast<char*>(t.raw()), static_cast<std::streamsize>(t.byteSize()));
    check(static_cast<size_t>(in.gcount()) == t.byteSize(), path.string() + ": truncated .npy data (expected " + std::to_string(t.byteSize()) + " bytes for " + t.summary() + ")");
    return t;
}

void saveNpy(const Tensor& t, const std::filesystem::path& path) {
    const char* descr = nullptr;
    for (const auto& n : kNpyTypes)
        if (n.dtype == t.dtype()) descr = n.descr;
    check(descr != nullptr, path.string() + ": cannot write " + t.summary() + " as .npy");
    std::string shape = "(";
    for (size_t i = 0; i < t.rank(); ++i) shape += std::to_string(t.dims()[i]) + (t.rank() == 1 ? "," : (i + 1 < t.rank() ? ", " : ""));
    shape += ")";
    std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    const uint16_t len = static_cast<uint16_t>(header.size());
    std::string bytes("\x93NUMPY\x01\x00", 8);
    bytes += static_cast<char>(len & 0xff);
    bytes += static_cast<char>(len >> 8);
    bytes += header;
    bytes.append(reinterpret_cast<const char*>(t.raw()), t.byteSize());
    writeFileAtomically(path, bytes);
}

}  // namespace kiln
