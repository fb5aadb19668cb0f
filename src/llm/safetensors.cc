#include "llm/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "ir/file_write.h"
#include <nlohmann/json.hpp>

namespace kiln::llm {

namespace {

const std::map<std::string, DType>& dtypeNames() {
    static const std::map<std::string, DType> names = {
        {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F64", DType::F64}, {"I64", DType::I64},
        {"I32", DType::I32}, {"I16", DType::I16}, {"I8", DType::I8},    {"U8", DType::U8},   {"BOOL", DType::Bool},
    };
    return names;
}

std::string nameOf(DType t) {
    for (const auto& [name, d] : dtypeNames())
        if (d == t) return name;
    throw Error("safetensors: element type " + std::string(dtypeName(t)) + " cannot be written");
}

}  // namespace

std::map<std::string, Tensor> readSafetensors(const std::filesystem::path& path) {
    const std::string where = path.string();
    std::ifstream in(path, std::ios::binary);
    check(in.good(), where + ": cannot open");
    in.seekg(0, std::ios::end);
    const uint64_t file_size = static_cast<uint64_t>(in.tellg());
    in.seekg(0);
    check(file_size >= 8, where + ": too short for a safetensors file");
    unsigned char len_bytes[8];
    in.read(reinterpret_cast<char*>(len_bytes), 8);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    check(header_len > 0 && header_len <= file_size - 8 && header_len < (100u << 20), where + ": header length " + std::to_string(header_len) + " is invalid");
    std::string header(header_len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    const nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
    check(j.is_object(), where + ": the header is not a JSON object");
    const uint64_t data_size = file_size - 8 - header_len;
    std::map<std::string, Tensor> out;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& [name, info] : j.items()) {
        if (name == "__metadata__") continue;
        const std::string what = where + ": tensor '" + name + "'";
        check(info.is_object() && info.contains("dtype") && info.contains("shape") && info.contains("data_offsets"), what + ": needs dtype, shape and data_offsets");
        check(info["dtype"].is_string() && dtypeNames().count(info["dtype"].get<std::string>()), what + ": unsupported dtype " + info["dtype"].dump());
        const DType dtype = dtypeNames().at(info["dtype"].get<std::string>());
        Dims dims;
        check(info["shape"].is_array(), what + ": shape is not a list");
        uint64_t count = 1;
        for (const auto& d : info["shape"]) {
            check(d.is_number_unsigned() && d.get<uint64_t>() < (uint64_t(1) << 40), what + ": bad dim " + d.dump());
            dims.push_back(static_cast<int64_t>(d.get<uint64_t>()));
            check(count <= (uint64_t(1) << 40) / std::max<uint64_t>(d.get<uint64_t>(), 1), what + ": too many elements");
            count *= d.get<uint64_t>();
        }
        const auto& offsets = info["data_offsets"];
        check(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), what + ": bad data_offsets");
        const uint64_t begin = offsets[0], end = offsets[1];
        check(begin <= end && end <= data_size, what + ": data range [" + std::to_string(begin) + ", " + std::to_string(end) + ") is outside the file");
        check(end - begin == count * dtypeSize(dtype), what + ": " + std::to_string(end - begin) + " bytes for " + std::to_string(count) + " elements of " +
                                                           std::string(dtypeName(dtype)));
        ranges.emplace_back(begin, end);
        Tensor t = Tensor::uninitialized(dtype, dims);
        in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
        in.read(reinterpret_cast<char*>(t.raw()), static_cast<std::streamsize>(end - begin));
        check(in.good(), what + ": read failed");
        out.emplace(name, std::move(t));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) check(ranges[i].first >= ranges[i - 1].second, where + ": tensor data ranges overlap");
    return out;
}

void writeSafetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
        header[name] = {{"dtype", nameOf(t.dtype())}, {"shape", t.dims()}, {"data_offsets", {offset, offset + t.byteSize()}}};
        offset += t.byteSize();
    }
    std::string text = header.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');  // data 8-byte aligned, as the reference writer does
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    bytes += text;
    for (const auto& [name, t] : tensors) bytes.append(reinterpret_cast<const char*>(t.raw()), t.byteSize());
    writeFileAtomically(path, bytes);
}

std::map<std::string, Tensor> readSafetensorsCheckpoint(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    if (fs::exists(dir / "model.safetensors")) return readSafetensors(dir / "model.safetensors");
    const fs::path index = dir / "model.safetensors.index.json";
    check(fs::exists(index), dir.string() + ": neither model.safetensors nor model.safetensors.index.json (sharded weights)");
    std::ifstream in(index);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    check(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string() + ": not a JSON object with a weight_map");
    std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> the tensors the index puts there
    for (const auto& [name, file] : j["weight_map"].items()) {
        check(file.is_string(), index.string() + ": tensor '" + name + "' maps to " + file.dump() + ", not a file name");
        const std::string shard = file.get<std::string>();
        // A plain file name in the folder: an index must not reach elsewhere.
        check(!shard.empty() && fs::path(shard).filename() == shard && shard != "." && shard != "..",
              index.string() + ": shard '" + shard + "' of tensor '" + name + "' is not a file name in the folder");
        by_shard[shard].push_back(name);
    }
    check(!by_shard.empty(), index.string() + ": the weight_map is empty");
    std::map<std::string, Tensor> out;
    for (const auto& [shard, names] : by_shard) {
        std::map<std::string, Tensor> part = readSafetensors(dir / shard);
        for (const auto& name : names) {
            auto it = part.find(name);
            check(it != part.end(), (dir / shard).string() + ": tensor '" + name + "' is missing (" + index.filename().string() + " puts it there)");
            out.emplace(name, std::move(it->second));
        }
    }
    return out;
}

}  // namespace kiln::llm
