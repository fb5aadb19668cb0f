#include "ir/attribute.h"

#include <cstring>
#include <sstream>

#include "ir/graph.h"

namespace kiln {

namespace {
const char* kindName(const Attribute& a) {
    static const char* names[] = {"int", "float", "string", "ints", "floats", "strings", "tensor", "graph"};
    return names[a.index()];
}

template <typename T>
std::string joinValues(const std::vector<T>& v) {
    std::ostringstream s;
    s << "[";
    for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
    s << "]";
    return s.str();
}
}  // namespace

std::string attributeToString(const Attribute& a) {
    return std::visit(
        [](const auto& v) -> std::string {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, float>) {
                std::ostringstream s;
                s << v;
                return s.str();
            } else if constexpr (std::is_same_v<V, std::string>) {
                return "\"" + v + "\"";
            } else if constexpr (std::is_same_v<V, Tensor>) {
                return "tensor " + v.summary();
            } else if constexpr (std::is_same_v<V, std::shared_ptr<Graph>>) {
                return "graph(" + std::to_string(v ? v->nodes.size() : 0) + " nodes)";
            } else {
                return joinValues(v);
            }
        },
        a);
}

template <typename T>
const T* Attributes::find(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return nullptr;
    const T* v = std::get_if<T>(&it->second);
    if (!v) throw Error("attribute '" + name + "' has kind " + kindName(it->second) + ", not the expected one");
    return v;
}

int64_t Attributes::getInt(const std::string& name, int64_t fallback) const {
    const auto* v = find<int64_t>(name);
    return v ? *v : fallback;
}
int64_t Attributes::getInt(const std::string& name) const {
    const auto* v = find<int64_t>(name);
    check(v != nullptr, "required attribute '" + name + "' is missing");
    return *v;
}
float Attributes::getFloat(const std::string& name, float fallback) const {
    const auto* v = find<float>(name);
    return v ? *v : fallback;
}
std::string Attributes::getString(const std::string& name, const std::string& fallback) const {
    const auto* v = find<std::string>(name);
    return v ? *v : fallback;
}
std::vector<int64_t> Attributes::getInts(const std::string& name, const std::vector<int64_t>& fallback) const {
    const auto* v = find<std::vector<int64_t>>(name);
    return v ? *v : fallback;
}
std::vector<float> Attributes::getFloats(const std::string& name, const std::vector<float>& fallback) const {
    const auto* v = find<std::vector<float>>(name);
    return v ? *v : fallback;
}
std::vector<std::string> Attributes::getStrings(const std::string& name, const std::vector<std::string>& fallback) const {
    const auto* v = find<std::vector<std::string>>(name);
    return v ? *v : fallback;
}
const Tensor& Attributes::getTensor(const std::string& name) const {
    const auto* v = find<Tensor>(name);
    check(v != nullptr, "required attribute '" + name + "' is missing");
    return *v;
}
std::shared_ptr<Graph> Attributes::getGraph(const std::string& name) const {
    const auto* v = find<std::shared_ptr<Graph>>(name);
    check(v != nullptr, "required graph attribute '" + name + "' is missing");
    return *v;
}

namespace {
bool sameAttribute(const Attribute& a, const Attribute& b) {
    if (a.index() != b.index()) return false;
    return std::visit(
        [&](const auto& x) -> bool {
            using V = std::decay_t<decltype(x)>;
            const V& y = std::get<V>(b);
            if constexpr (std::is_same_v<V, Tensor>) {
                return x.dtype() == y.dtype() && x.dims() == y.dims() && std::memcmp(x.raw(), y.raw(), x.byteSize()) == 0;
            } else {
                return x == y;  // graphs compare by identity
            }
        },
        a);
}
}  // namespace

bool Attributes::operator==(const Attributes& other) const {
    if (values_.size() != other.values_.size()) return false;
    for (const auto& [name, value] : values_) {
        auto it = other.values_.find(name);
        if (it == other.values_.end() || !sameAttribute(value, it->second)) return false;
    }
    return true;
}

}  // namespace kiln
