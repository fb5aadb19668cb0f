// Calibration (`kiln calibrate`): the ranges of the activations that int8 kernels would
// read and write (qdq_insertion.h), measured by running the float model over sample inputs.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "quant/qdq_insertion.h"
#include "backends/cpu/graph_executor.h"

namespace kiln {

// Runs the model on the CPU over `samples` and measures each quantization point's range:
// "minmax" (the extremes), "percentile:P" (the P and 100 - P percentiles of the values, from
// 2048-bin histograms), "entropy" (TensorRT's: the clipping threshold of |x| whose 128-level
// quantization keeps the histogram's KL divergence smallest). `progress(done, total)` after
// each run.
CalibrationTable calibrate(const Graph& g, const std::string& model_hash, const std::vector<TensorMap>& samples, const std::string& method,
                           const std::function<void(size_t, size_t)>& progress = {});

}  // namespace kiln
