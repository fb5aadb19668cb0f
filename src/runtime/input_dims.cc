#include "runtime/input_dims.h"

namespace kiln {

Dims randomInputDims(const ValueInfo& vi, const std::map<std::string, Dims>& given, const std::string& flag, const std::string& or_else,
                     SymbolicDims symbolic, std::string* defaulted) {
    if (const auto it = given.find(vi.name); it != given.end()) {
        const Dims& d = it->second;
        check(vi.shape.dims.size() == d.size() || !vi.shape.rank_known,
              [&] { return flag + " " + vi.name + ": rank " + std::to_string(d.size()) + " but the model declares " + vi.shape.toString(); });
        for (size_t i = 0; vi.shape.rank_known && i < d.size(); ++i)
            check(!vi.shape.dims[i].known() || vi.shape.dims[i].size == d[i],
                  [&] { return flag + " " + vi.name + ": dim " + std::to_string(i) + " is " + std::to_string(d[i]) + " but the model fixes it to " +
                      std::to_string(vi.shape.dims[i].size); });
        return d;
    }
    if (vi.shape.fullyKnown()) return vi.shape.concrete();
    check(symbolic == SymbolicDims::One && vi.shape.rank_known,
          [&] { return "input '" + vi.name + "' has shape " + vi.shape.toString() + "; give it with " + flag + " " + vi.name + ":DIMS or " + or_else; });
    Dims d;
    for (const auto& dim : vi.shape.dims) d.push_back(dim.known() ? dim.size : 1);
    if (defaulted) *defaulted += (defaulted->empty() ? "" : ", ") + vi.name;
    return d;
}

}  // namespace kiln
