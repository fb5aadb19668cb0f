// Post-training quantization below the engine: calibration ranges (calib.json), the points
// of a float model that int8 kernels would read and write, and the QDQ model made from the
// ranges, which qdq_fusion then turns into integer kernels like any QDQ model. The Builder
// applies it where a route asks for precision.conv/precision.matmul=int8; measuring the
// ranges (calibration.h) needs the runtime and sits above.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

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

// Which products are quantized: by op class (Conv; MatMul and Gemm), and whether the first
// and the last of them (in execution order, usually the most sensitive) stay f32.
struct QuantSelection {
    bool conv = true, matmul = true;
    bool skip_first_last = false;
};

// `g` with its Constant nodes (those holding a `value` tensor) as initializers and its
// BatchNorms folded into the convs before them, the form in which quantizationPoints and
// insertQdq see weights (exporters such as Paddle's write every weight as a Constant node).
Graph withConstantsAsInitializers(const Graph& g);

// The selected Convs, MatMuls and Gemms with constant f32 weights (indices into g.nodes, in
// execution order); `g` in the form withConstantsAsInitializers gives.
std::vector<size_t> quantizedProducts(const Graph& g, const QuantSelection& selection);

// The values a quantized model carries as 8 bits: the activation read by each selected
// Conv, MatMul and Gemm with constant f32 weights, and what each writes (after its Relu,
// where one reads it alone, since the quantizer then does the Relu's clamping). `g` must be
// in the form withConstantsAsInitializers gives.
std::vector<std::string> quantizationPoints(const Graph& g, const QuantSelection& selection = {});

// The QDQ form of `g` under `table` (which must be for this model): every quantization point
// of the selection with a range gets QuantizeLinear/DequantizeLinear (uint8, asymmetric,
// range widened to 0), and the weights of its selected Convs and MatMuls (Gemms become MatMul
// + Add) a DequantizeLinear of int8 values symmetric per output channel. Other values stay f32.
Graph insertQdq(const Graph& g, const CalibrationTable& table, const QuantSelection& selection = {});

}  // namespace kiln
