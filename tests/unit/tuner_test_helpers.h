// Helpers of the tuner tests: options over the bundled MLP with short timings.
#pragma once
#include <string>

#include "tuner/tuner.h"

namespace kiln::testing {

inline TunerOptions options(const std::string& expr, const std::string& cache) {
    TunerOptions o;
    o.model_path = std::string(KILN_SOURCE_DIR) + "/models/mlp/model.onnx";
    o.golden_dir = std::string(KILN_SOURCE_DIR) + "/models/mlp/test_data_set_0";
    o.expr = expr;
    o.cache_path = cache;
    o.policy.iterations = 3;
    o.policy.warmup = 1;
    o.policy.timeout_s = 3;
    o.rounds = 1;
    return o;
}

}  // namespace kiln::testing
