// Post-training quantization of float models: the ranges of the activations that int8
// kernels would read and write, measured over sample inputs (`kiln calibrate`), and the
// QDQ model made from them (`kiln build --int8 --calib`), which qdq_fusion then turns into
// integer kernels like any QDQ model.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/executor.h"

namespace kiln {

struct TensorRange {
    double min = 0.0, max = 0.0;
};

// Per-tensor ranges of one model (identified by its file hash), as calib.json holds them.
struct CalibrationTable {
    std::string model_hash;
    std::string method;  // minmax, percentile:P, entropy
    int samples = 0;
    std::map<std::string, TensorRange> ranges;
};

CalibrationTable readCalibration(const std::string& path);
void writeCalibration(const CalibrationTable& table, const std::string& path);

// `g` with its Constant nodes (those holding a `value` tensor) as initializers, the form in
// which quantizationPoints and insertQdq see weights (exporters such as Paddle's write every
// weight as a Constant node).
Graph withConstantsAsInitializers(const Graph& g);

// The values a quantized model carries as 8 bits: the activation read by each Conv, MatMul
// and Gemm with constant f32 weights, and what each writes (after its Relu, where one reads
// it alone, since the quantizer then does the Relu's clamping).
std::vector<std::string> quantizationPoints(const Graph& g);

// Runs the model on the CPU over `samples` and measures each quantization point's range:
// "minmax" (the extremes), "percentile:P" (the P and 100 - P percentiles of the values, from
// 2048-bin histograms), "entropy" (TensorRT's: the clipping threshold of |x| whose 128-level
// quantization keeps the histogram's KL divergence smallest). `progress(done, total)` after
// each run.
CalibrationTable calibrate(const Graph& g, const std::string& model_hash, const std::vector<TensorMap>& samples, const std::string& method,
                           const std::function<void(size_t, size_t)>& progress = {});

// The QDQ form of `g` under `table` (which must be for this model): every quantization point
// with a range gets QuantizeLinear/DequantizeLinear (uint8, asymmetric, range widened to 0),
// and the weights of its Convs and MatMuls (Gemms become MatMul + Add) a DequantizeLinear of
// int8 values symmetric per output channel. Other values stay f32.
Graph insertQdq(const Graph& g, const CalibrationTable& table);

}  // namespace kiln
