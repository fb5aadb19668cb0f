#include "route/build_route.h"

#include <cstdio>

#include "ir/error.h"

namespace kiln {

ParameterSpace::ParameterSpace(std::vector<ParameterSpec> parameters) : parameters_(std::move(parameters)) {
    for (const auto& p : parameters_) {
        bool has_default = false;
        for (const auto& v : p.values) has_default |= v == p.default_value;
        check(has_default && !p.name.empty(), "parameter '" + p.name + "' has a default outside its allowed values");
    }
}

const ParameterSpec* ParameterSpace::find(const std::string& name) const {
    for (const auto& p : parameters_)
        if (p.name == name) return &p;
    return nullptr;
}

const ParameterSpec& ParameterSpace::get(const std::string& name) const {
    if (const ParameterSpec* p = find(name)) return *p;
    std::string prefix = name.substr(0, name.find('.') + 1), similar;
    for (const auto& p : parameters_)
        if (!p.hidden && !prefix.empty() && p.name.rfind(prefix, 0) == 0) similar += (similar.empty() ? "" : ", ") + p.name;
    throw Error("unknown parameter '" + name + "'" + (similar.empty() ? " (see `kiln routes MODEL` for the list)" : " (parameters in that group: " + similar + ")"));
}

bool globMatch(const std::string& glob, const std::string& name) {
    // Iterative wildcard match with backtracking to the last '*'.
    size_t g = 0, n = 0, star = std::string::npos, mark = 0;
    while (n < name.size()) {
        if (g < glob.size() && glob[g] == name[n]) {
            ++g;
            ++n;
        } else if (g < glob.size() && glob[g] == '*') {
            star = g++;
            mark = n;
        } else if (star != std::string::npos) {
            g = star + 1;
            n = ++mark;
        } else {
            return false;
        }
    }
    while (g < glob.size() && glob[g] == '*') ++g;
    return g == glob.size();
}

std::vector<const ParameterSpec*> ParameterSpace::match(const std::string& glob) const {
    std::vector<const ParameterSpec*> out;
    for (const auto& p : parameters_)
        if (globMatch(glob, p.name) && (!p.hidden || glob == p.name)) out.push_back(&p);
    return out;
}

BuildRoute BuildRoute::defaults(const ParameterSpace& space) {
    BuildRoute r;
    for (const auto& p : space.parameters()) r.values_[p.name] = p.default_value;
    return r;
}

void BuildRoute::set(const std::string& name, const std::string& value, const ParameterSpace& space) {
    const ParameterSpec& p = space.get(name);
    bool allowed = false;
    std::string list;
    for (const auto& v : p.values) {
        allowed |= v == value;
        list += (list.empty() ? "" : ", ") + v;
    }
    check(allowed, "parameter '" + name + "' does not allow '" + value + "' (allowed: " + list + ")");
    values_[name] = value;
}

BuildRoute BuildRoute::parse(const std::string& text, const ParameterSpace& space) {
    BuildRoute r = defaults(space);
    std::string item;
    auto flush = [&] {
        if (item.empty() || item == "default") {
            item.clear();
            return;
        }
        auto eq = item.find('=');
        check(eq != std::string::npos && eq > 0 && eq + 1 < item.size(), "route: '" + item + "' is not a name=value pair");
        r.set(item.substr(0, eq), item.substr(eq + 1), space);
        item.clear();
    };
    for (char c : text) {
        if (c == ';' || c == ',' || c == ' ' || c == '\t' || c == '\n') flush();
        else item += c;
    }
    flush();
    return r;
}

std::string BuildRoute::text() const {
    std::string s;
    for (const auto& [k, v] : values_) s += (s.empty() ? "" : ";") + k + "=" + v;
    return s;
}

std::string BuildRoute::changesText(const ParameterSpace& space) const {
    std::string s;
    for (const auto& [k, v] : values_) {
        const ParameterSpec* p = space.find(k);
        if (!p || p->default_value != v) s += (s.empty() ? "" : ";") + k + "=" + v;
    }
    return s.empty() ? "default" : s;
}

std::string BuildRoute::hash() const {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : text()) {
        h ^= c;
        h *= 1099511628211ull;
    }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

}  // namespace kiln
