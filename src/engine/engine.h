// An engine: the result of one build, as it is serialized. See engine_file.cc for the byte
// layout.
#pragma once
#include <filesystem>
#include <map>
#include <string>

#include "ir/graph.h"

namespace kiln {

constexpr uint32_t kEngineFormatVersion = 1;

// Allowed input shapes of an engine (trtexec's --minShapes/--optShapes/--maxShapes).
struct ShapeRange {
    Dims min, opt, max;
    // Whether `d` has this range's rank and lies within [min, max] in every dim.
    bool contains(const Dims& d) const {
        if (d.size() != max.size() || d.size() != min.size()) return false;
        for (size_t i = 0; i < d.size(); ++i)
            if (d[i] < min[i] || d[i] > max[i]) return false;
        return true;
    }
};
using ShapeProfile = std::map<std::string, ShapeRange>;

struct Engine {
    std::string kiln_version;
    std::string target;      // target signature, e.g. "cpu/x86_64/reference"
    std::string route;       // canonical build route text
    std::string model_hash;  // FNV-1a 64 of the source model file(s)
    ShapeProfile profile;    // empty: the graph's declared input shapes
    Graph graph;             // optimized, lowered graph
    std::map<std::string, std::string> tactics;  // node name -> chosen tactic
};

// The signature of the machine/backend an engine runs on; loading compares it.
std::string targetSignature(const std::string& target);
// The target kind a signature (or a kind name) stands for: its text before the first slash.
inline std::string targetKind(const std::string& signature) { return signature.substr(0, signature.find('/')); }

// Writes / reads an engine file. Reading validates magic, format version, checksum, every
// length and count, and the target; any problem is an Error naming the file and the fault.
void writeEngine(const Engine& engine, const std::filesystem::path& path);
std::string serializeEngine(const Engine& engine);
Engine readEngine(const std::filesystem::path& path, const std::string& expected_target = "");
Engine deserializeEngine(const std::string& bytes, const std::string& where, const std::string& expected_target = "");
// Recomputes the payload length and checksum of serialized engine bytes after an edit, so that tests and the
// fuzzer reach the loader's checks of what lies behind the checksum.
void resealEngineBytes(std::string& bytes);

// Is this file an engine (by its magic bytes)?
bool isEngineFile(const std::filesystem::path& path);

// FNV-1a 64 of a file's bytes plus those of any sibling external-data files it names.
std::string modelFileHash(const std::filesystem::path& path);
// FNV-1a 64 of an engine's serialized bytes, as 16 hex digits.
std::string engineHash(const Engine& engine);

}  // namespace kiln
