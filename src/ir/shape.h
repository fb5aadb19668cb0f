// Shapes: static dims for tensors, possibly symbolic dims ("batch") for graph values.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kiln {

using Dims = std::vector<int64_t>;

// One dimension of a value's shape: a known size, a named symbol, or unknown.
struct Dim {
    int64_t size = -1;   // >= 0 when known
    std::string symbol;  // non-empty when symbolic
    bool known() const { return size >= 0; }
    bool operator==(const Dim&) const = default;
};

// A value's shape. `rank_known == false` means not even the rank is known.
struct Shape {
    std::vector<Dim> dims;
    bool rank_known = false;

    static Shape fromDims(const Dims& d);
    static Shape unknown() { return {}; }
    bool fullyKnown() const;
    Dims concrete() const;  // requires fullyKnown()
    std::string toString() const;
    bool operator==(const Shape&) const = default;
};

// The element count of `dims`; throws Error for a negative dim or a count past 2^63 - 1
// (dims such as [2^62 + 1, 4] would otherwise wrap to a small, wrong size).
int64_t numElements(const Dims& dims);
std::string dimsToString(const Dims& dims);
// Row-major strides of `dims`, in elements.
Dims stridesOf(const Dims& dims);
// Numpy-style broadcast of two shapes; throws Error naming `what` when incompatible.
Dims broadcastDims(const Dims& a, const Dims& b, const std::string& what);
// The same with `what` made only on failure (for kernels, on every run).
Dims broadcastDims(const Dims& a, const Dims& b, const std::function<std::string()>& what);

}  // namespace kiln
