// Engine file format (all integers little-endian):
//
//   offset  size  field
//   0       8     magic "KILNENG\0"
//   8       4     u32 format version (kEngineFormatVersion)
//   12      4     u32 reserved, 0
//   16      8     u64 payload length P
//   24      P     payload
//   24+P    8     u64 checksum: FNV-1a 64 over bytes [0, 24+P)
//
// Payload, in order: str kiln_version, str target, str route, str model_hash;
// u32 profile count, each {str input, dims min, dims opt, dims max}; the graph; u32 tactic
// count, each {str node, str tactic}.
//   str    = u64 length + bytes;  dims = u32 rank + i64 per dim
//   graph  = str name, i64 opset, u32 n + value infos (inputs), u32 n + value infos
//            (outputs), u32 n + value infos (value_info), u32 n + nodes, u32 n + {str name, tensor}
//   value info = str name, u8 dtype, u8 rank_known, u32 rank, per dim {i64 size, str symbol}
//   node   = str name, str op_type, str domain, u32 n + str inputs, u32 n + str outputs,
//            u32 n + attributes {str name, u8 kind, value}
//   attribute kinds: 0 i64, 1 f32, 2 str, 3 u32 n + i64s, 4 u32 n + f32s, 5 u32 n + strs,
//            6 tensor, 7 graph
//   tensor = u8 dtype, dims, u64 byte count, zero padding up to the next 64-byte file
//            offset, bytes (so weights are aligned when the file is mapped)
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/engine.h"

#include "ir/file_write.h"

#include "backends/backend.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};
constexpr size_t kHeaderSize = 24;
constexpr size_t kMaxRank = 32;

uint64_t fnv1a(const char* data, size_t n, uint64_t h = 1469598103934665603ull) {
    for (size_t i = 0; i < n; ++i) {
        h ^= static_cast<unsigned char>(data[i]);
        h *= 1099511628211ull;
    }
    return h;
}

class Writer {
public:
    std::string out;
    template <typename T>
    void pod(T v) {
        out.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    void str(const std::string& s) {
        pod<uint64_t>(s.size());
        out += s;
    }
    void dims(const Dims& d) {
        pod<uint32_t>(static_cast<uint32_t>(d.size()));
        for (int64_t v : d) pod<int64_t>(v);
    }
    void tensor(const Tensor& t) {
        pod<uint8_t>(static_cast<uint8_t>(t.dtype()));
        dims(t.dims());
        pod<uint64_t>(t.byteSize());
        out.append((64 - out.size() % 64) % 64, '\0');
        out.append(reinterpret_cast<const char*>(t.raw()), t.byteSize());
    }
    void value(const ValueInfo& v) {
        str(v.name);
        pod<uint8_t>(static_cast<uint8_t>(v.dtype));
        pod<uint8_t>(v.shape.rank_known);
        pod<uint32_t>(static_cast<uint32_t>(v.shape.dims.size()));
        for (const auto& d : v.shape.dims) {
            pod<int64_t>(d.size);
            str(d.symbol);
        }
    }
    void strings(const std::vector<std::string>& v) {
        pod<uint32_t>(static_cast<uint32_t>(v.size()));
        for (const auto& s : v) str(s);
    }
    void graph(const Graph& g) {
        str(g.name);
        pod<int64_t>(g.opset);
        for (const auto* list : {&g.inputs, &g.outputs}) {
            pod<uint32_t>(static_cast<uint32_t>(list->size()));
            for (const auto& v : *list) value(v);
        }
        pod<uint32_t>(static_cast<uint32_t>(g.value_info.size()));
        for (const auto& [n, v] : g.value_info) value(v);
        pod<uint32_t>(static_cast<uint32_t>(g.nodes.size()));
        for (const auto& n : g.nodes) {
            str(n.name);
            str(n.op_type);
            str(n.domain);
            strings(n.inputs);
            strings(n.outputs);
            pod<uint32_t>(static_cast<uint32_t>(n.attrs.all().size()));
            for (const auto& [name, a] : n.attrs.all()) {
                str(name);
                pod<uint8_t>(static_cast<uint8_t>(a.index()));
                std::visit([&](const auto& v) { attribute(v); }, a);
            }
        }
        pod<uint32_t>(static_cast<uint32_t>(g.initializers.size()));
        for (const auto& [name, t] : g.initializers) {
            str(name);
            tensor(t);
        }
    }
    void attribute(int64_t v) { pod(v); }
    void attribute(float v) { pod(v); }
    void attribute(const std::string& v) { str(v); }
    void attribute(const std::vector<int64_t>& v) { dims(v); }
    void attribute(const std::vector<float>& v) {
        pod<uint32_t>(static_cast<uint32_t>(v.size()));
        for (float f : v) pod(f);
    }
    void attribute(const std::vector<std::string>& v) { strings(v); }
    void attribute(const Tensor& t) { tensor(t); }
    void attribute(const std::shared_ptr<Graph>& g) { graph(*g); }
};

// Bounds-checked reader: every length and count is checked against the bytes left.
class Reader {
public:
    Reader(const std::string& bytes, size_t begin, size_t end, const std::string& where) : b_(bytes), pos_(begin), end_(end), where_(where) {}
    [[noreturn]] void fail(const std::string& what) const { throw Error(where_ + ": corrupt engine (" + what + " at byte " + std::to_string(pos_) + ")"); }
    size_t left() const { return end_ - pos_; }
    bool done() const { return pos_ == end_; }

    template <typename T>
    T pod() {
        if (left() < sizeof(T)) fail("truncated field");
        T v;
        std::memcpy(&v, b_.data() + pos_, sizeof v);
        pos_ += sizeof v;
        return v;
    }
    uint32_t count(size_t min_item_bytes) {
        uint32_t n = pod<uint32_t>();
        if (static_cast<uint64_t>(n) * std::max<size_t>(min_item_bytes, 1) > left()) fail("count " + std::to_string(n) + " exceeds the data");
        return n;
    }
    std::string str() {
        uint64_t n = pod<uint64_t>();
        if (n > left()) fail("string length exceeds the data");
        std::string s = b_.substr(pos_, n);
        pos_ += n;
        return s;
    }
    DType dtype() {
        uint8_t d = pod<uint8_t>();
        if (d > static_cast<uint8_t>(DType::Bool)) fail("bad element type " + std::to_string(d));
        return static_cast<DType>(d);
    }
    Dims dims() {
        uint32_t n = count(8);
        if (n > kMaxRank) fail("rank " + std::to_string(n) + " too large");
        Dims d(n);
        for (auto& v : d) {
            v = pod<int64_t>();
            if (v < 0) fail("negative dimension");
        }
        return d;
    }
    Tensor tensor() {
        DType t = dtype();
        if (t == DType::Undefined) fail("tensor without element type");
        Dims d = dims();
        uint64_t bytes = pod<uint64_t>();
        if (bytes > left()) fail("tensor data exceeds the file");
        long double expect = static_cast<long double>(dtypeSize(t));
        for (int64_t v : d) expect *= static_cast<long double>(v);
        if (expect != static_cast<long double>(bytes)) fail("tensor byte count does not match its shape");
        const size_t pad = (64 - pos_ % 64) % 64;
        if (pad > left() || bytes > left() - pad) fail("tensor data exceeds the file");
        for (size_t i = 0; i < pad; ++i)
            if (b_[pos_ + i] != '\0') fail("bad alignment padding");
        pos_ += pad;
        Tensor out(t, d);
        std::memcpy(out.raw(), b_.data() + pos_, bytes);
        pos_ += bytes;
        return out;
    }
    ValueInfo value() {
        ValueInfo v;
        v.name = str();
        v.dtype = dtype();
        v.shape.rank_known = pod<uint8_t>() != 0;
        uint32_t n = count(16);
        if (n > kMaxRank) fail("rank too large");
        for (uint32_t i = 0; i < n; ++i) {
            Dim dim;
            dim.size = pod<int64_t>();
            dim.symbol = str();
            v.shape.dims.push_back(dim);
        }
        return v;
    }
    std::vector<std::string> strings() {
        std::vector<std::string> v(count(8));
        for (auto& s : v) s = str();
        return v;
    }
    Attribute attribute(int depth) {
        switch (pod<uint8_t>()) {
            case 0: return pod<int64_t>();
            case 1: return pod<float>();
            case 2: return str();
            case 3: {
                std::vector<int64_t> v(count(8));
                for (auto& x : v) x = pod<int64_t>();
                return v;
            }
            case 4: {
                std::vector<float> v(count(4));
                for (auto& x : v) x = pod<float>();
                return v;
            }
            case 5: return strings();
            case 6: return tensor();
            case 7: return std::make_shared<Graph>(graph(depth + 1));
            default: fail("bad attribute kind");
        }
    }
    Graph graph(int depth = 0) {
        if (depth > 16) fail("subgraphs nested too deeply");
        Graph g;
        g.name = str();
        g.opset = pod<int64_t>();
        for (auto* list : {&g.inputs, &g.outputs}) {
            uint32_t n = count(14);
            for (uint32_t i = 0; i < n; ++i) list->push_back(value());
        }
        uint32_t nvi = count(14);
        for (uint32_t i = 0; i < nvi; ++i) {
            ValueInfo v = value();
            g.value_info[v.name] = v;
        }
        uint32_t nn = count(36);
        for (uint32_t i = 0; i < nn; ++i) {
            Node n;
            n.name = str();
            n.op_type = str();
            n.domain = str();
            n.inputs = strings();
            n.outputs = strings();
            uint32_t na = count(9);
            for (uint32_t k = 0; k < na; ++k) {
                std::string name = str();
                n.attrs.set(name, attribute(depth));
            }
            g.nodes.push_back(std::move(n));
        }
        uint32_t ni = count(21);
        for (uint32_t i = 0; i < ni; ++i) {
            std::string name = str();
            g.initializers[name] = tensor();
        }
        return g;
    }

private:
    const std::string& b_;
    size_t pos_, end_;
    std::string where_;
};

std::string readAll(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    check(in.good(), path.string() + ": cannot open file");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

}  // namespace

std::string targetSignature(const std::string& target) { return backendFor(target).signature(); }

std::string serializeEngine(const Engine& e) {
    Writer w;
    w.out.append(kMagic, sizeof kMagic);
    w.pod<uint32_t>(kEngineFormatVersion);
    w.pod<uint32_t>(0);
    w.pod<uint64_t>(0);  // payload length, patched below
    w.str(e.kiln_version);
    w.str(e.target);
    w.str(e.route);
    w.str(e.model_hash);
    w.pod<uint32_t>(static_cast<uint32_t>(e.profile.size()));
    for (const auto& [name, r] : e.profile) {
        w.str(name);
        w.dims(r.min);
        w.dims(r.opt);
        w.dims(r.max);
    }
    w.graph(e.graph);
    w.pod<uint32_t>(static_cast<uint32_t>(e.tactics.size()));
    for (const auto& [node, tactic] : e.tactics) {
        w.str(node);
        w.str(tactic);
    }
    const uint64_t payload = w.out.size() - kHeaderSize;
    std::memcpy(w.out.data() + 16, &payload, sizeof payload);
    w.pod<uint64_t>(fnv1a(w.out.data(), w.out.size()));
    return w.out;
}

void writeEngine(const Engine& engine, const fs::path& path) {
    writeFileAtomically(path, serializeEngine(engine));
}

Engine deserializeEngine(const std::string& bytes, const std::string& where, const std::string& expected_target) {
    check(bytes.size() >= kHeaderSize + 8 && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0, where + ": not a Kiln engine file");
    uint32_t version;
    std::memcpy(&version, bytes.data() + 8, 4);
    check(version <= kEngineFormatVersion, where + ": engine format version " + std::to_string(version) + " is newer than this Kiln supports (" +
                                               std::to_string(kEngineFormatVersion) + "); rebuild the engine or upgrade Kiln");
    check(version == kEngineFormatVersion, where + ": engine format version " + std::to_string(version) + " is no longer supported; rebuild the engine");
    uint64_t payload;
    std::memcpy(&payload, bytes.data() + 16, 8);
    check(payload == bytes.size() - kHeaderSize - 8, where + ": corrupt engine (the file is truncated or has trailing bytes)");
    uint64_t stored;
    std::memcpy(&stored, bytes.data() + kHeaderSize + payload, 8);
    check(stored == fnv1a(bytes.data(), kHeaderSize + payload), where + ": corrupt engine (checksum mismatch)");

    Reader r(bytes, kHeaderSize, kHeaderSize + payload, where);
    Engine e;
    e.kiln_version = r.str();
    e.target = r.str();
    e.route = r.str();
    e.model_hash = r.str();
    if (!expected_target.empty())
        check(e.target == expected_target, where + ": engine was built for target '" + e.target + "' but this machine is '" + expected_target + "'; rebuild it here");
    uint32_t np = r.count(20);
    for (uint32_t i = 0; i < np; ++i) {
        std::string name = r.str();
        ShapeRange range{r.dims(), r.dims(), r.dims()};
        e.profile[name] = range;
    }
    e.graph = r.graph();
    uint32_t nt = r.count(16);
    for (uint32_t i = 0; i < nt; ++i) {
        std::string node = r.str();
        e.tactics[node] = r.str();
    }
    if (!r.done()) r.fail("trailing payload bytes");
    try {
        verifyGraph(e.graph);
    } catch (const Error& err) {
        throw Error(where + ": corrupt engine (" + err.what() + ")");
    }
    return e;
}

void resealEngineBytes(std::string& bytes) {
    check(bytes.size() >= kHeaderSize + 8, "resealEngineBytes: not an engine image");
    const uint64_t payload = bytes.size() - kHeaderSize - 8;
    std::memcpy(bytes.data() + 16, &payload, 8);
    const uint64_t sum = fnv1a(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
}

Engine readEngine(const fs::path& path, const std::string& expected_target) {
    check(fs::exists(path), path.string() + ": no such file");
    std::error_code ec;
    check(fs::is_regular_file(path, ec), path.string() + ": not a regular file");
    return deserializeEngine(readAll(path), path.string(), expected_target);
}

bool isEngineFile(const fs::path& path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return false;  // a FIFO would block the read
    std::ifstream in(path, std::ios::binary);
    char magic[8] = {};
    in.read(magic, sizeof magic);
    return in.gcount() == 8 && std::memcmp(magic, kMagic, sizeof kMagic) == 0;
}

namespace {
std::string hex16(uint64_t h) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}
}  // namespace

std::string modelFileHash(const fs::path& path) {
    std::string bytes = readAll(path);
    uint64_t h = fnv1a(bytes.data(), bytes.size());
    fs::path data = path;
    data += ".data";  // the conventional external-data file name
    if (fs::exists(data)) {
        std::string extra = readAll(data);
        h = fnv1a(extra.data(), extra.size(), h);
    }
    return hex16(h);
}

std::string engineHash(const Engine& engine) {
    const std::string bytes = serializeEngine(engine);
    return hex16(fnv1a(bytes.data(), bytes.size()));
}

}  // namespace kiln
