// The shape of a generated (random) model input, one rule for every tool: the shape the
// user gave (NAME:DIMS, checked against the dims the model declares), else the declared
// shape; a symbolic dim is either an error naming the flag to use or set to 1, as the
// caller chooses.
#pragma once
#include <map>
#include <string>

#include "ir/graph.h"

namespace kiln {

enum class SymbolicDims { Error, One };

// `flag` names the option in messages (e.g. "--shapes") and `or_else` the other way to give
// the input (e.g. "pass a file"); with SymbolicDims::One the names of inputs whose symbolic
// dims became 1 are appended to *defaulted (comma-separated).
Dims randomInputDims(const ValueInfo& vi, const std::map<std::string, Dims>& given, const std::string& flag, const std::string& or_else,
                     SymbolicDims symbolic, std::string* defaulted = nullptr);

}  // namespace kiln
