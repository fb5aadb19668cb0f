#include "ir/shape.h"

#include "ir/error.h"

#include <algorithm>

namespace kiln {

Shape Shape::fromDims(const Dims& d) {
    Shape s;
    s.rank_known = true;
    for (int64_t v : d) s.dims.push_back(Dim{v, {}});
    return s;
}

bool Shape::fullyKnown() const {
    if (!rank_known) return false;
    for (const auto& d : dims)
        if (!d.known()) return false;
    return true;
}

Dims Shape::concrete() const {
    Dims out;
    for (const auto& d : dims) out.push_back(d.size);
    return out;
}

std::string Shape::toString() const {
    if (!rank_known) return "[?]";
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) {
        if (i) s += ",";
        if (dims[i].known()) s += std::to_string(dims[i].size);
        else s += dims[i].symbol.empty() ? "?" : dims[i].symbol;
    }
    return s + "]";
}

int64_t numElements(const Dims& dims) {
    int64_t n = 1;
    bool overflow = false;
    for (int64_t d : dims) {
        check(d >= 0, [&] { return "shape " + dimsToString(dims) + " has a negative dimension"; });
        overflow |= __builtin_mul_overflow(n, d, &n);
    }
    // A zero anywhere makes the count 0 even when the other dims' product overflowed.
    if (overflow && std::find(dims.begin(), dims.end(), 0) == dims.end())
        throw Error("shape " + dimsToString(dims) + " has more than 2^63 elements");
    return overflow ? 0 : n;
}

std::string dimsToString(const Dims& dims) { return Shape::fromDims(dims).toString(); }

Dims stridesOf(const Dims& dims) {
    Dims s(dims.size(), 1);
    for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
    return s;
}

Dims broadcastDims(const Dims& a, const Dims& b, const std::function<std::string()>& what) {
    for (const Dims* d : {&a, &b})
        for (int64_t v : *d) check(v >= 0, [&] { return what() + ": negative dimension in " + dimsToString(*d); });
    size_t rank = std::max(a.size(), b.size());
    Dims out(rank);
    for (size_t i = 0; i < rank; ++i) {
        int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
        int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
        if (da != db && da != 1 && db != 1)
            throw Error(what() + ": shapes " + dimsToString(a) + " and " + dimsToString(b) + " cannot be broadcast");
        out[i] = da == 1 ? db : da;
    }
    return out;
}

Dims broadcastDims(const Dims& a, const Dims& b, const std::string& what) {
    return broadcastDims(a, b, std::function<std::string()>([&] { return what; }));
}

}  // namespace kiln
