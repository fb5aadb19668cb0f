// Mutations that reach past the parsers: structure-aware edits of ONNX models (attributes,
// dims, initializer values, opsets, op types, external data), JSON values, and raw bytes.
#pragma once
#include <onnx/onnx_pb.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace kiln::fuzz {

using Rng = std::mt19937_64;

// An integer that often breaks size arithmetic: 0, -1, 2^31, 2^62 + 1, INT64_MIN, ...
int64_t interestingInt(Rng& rng);
// A float that often breaks numerics: NaN, infinities, 0, -1, 1e9, 1e-30, ...
float interestingFloat(Rng& rng);

// One to three structure-aware edits of `m`; `supported_ops` offers op types to swap in.
void mutateModel(onnx::ModelProto& m, Rng& rng, const std::vector<std::string>& supported_ops);
// One to four edits of the bytes: flips, interesting bytes, cuts and repeats.
void mutateBytes(std::string& bytes, Rng& rng, size_t from = 0);
// Replaces one to three values anywhere in `j` by values of other types or extreme sizes.
void mutateJson(nlohmann::json& j, Rng& rng);

}  // namespace kiln::fuzz
