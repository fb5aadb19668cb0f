// The operator set the importer accepts. Each entry needs a kernel on every backend
// (tests/test_op_support.cc checks the CPU backend).
#include "onnx_import/importer.h"

namespace kiln {

const std::vector<OpSupport>& supportedOps() {
    static const std::vector<OpSupport> ops = {
        // elementwise math
        {"Abs", 1}, {"Neg", 1}, {"Sqrt", 1}, {"Exp", 1}, {"Log", 1}, {"Reciprocal", 1}, {"Floor", 1}, {"Ceil", 1},
        {"Round", 11}, {"Sign", 9}, {"Sin", 7}, {"Cos", 7}, {"Tan", 7}, {"Asin", 7}, {"Acos", 7}, {"Atan", 7},
        {"Sinh", 9}, {"Cosh", 9}, {"Asinh", 9}, {"Acosh", 9}, {"Atanh", 9}, {"Erf", 9}, {"IsNaN", 9}, {"IsInf", 10},
        {"Not", 1}, {"Identity", 1},
        {"Add", 1}, {"Sub", 1}, {"Mul", 1}, {"Div", 1}, {"Pow", 1}, {"Mod", 10}, {"BitShift", 11},
        {"And", 1}, {"Or", 1}, {"Xor", 1}, {"Equal", 1}, {"Less", 1}, {"Greater", 1}, {"LessOrEqual", 12},
        {"GreaterOrEqual", 12}, {"Where", 9}, {"Max", 1}, {"Min", 1}, {"Sum", 1}, {"Mean", 1},
        // activations
        {"Relu", 1}, {"Sigmoid", 1}, {"Tanh", 1}, {"LeakyRelu", 1}, {"Elu", 1}, {"Selu", 1}, {"Celu", 12},
        {"HardSigmoid", 1}, {"HardSwish", 14}, {"Softplus", 1}, {"Softsign", 1}, {"ThresholdedRelu", 10},
        {"Shrink", 9}, {"PRelu", 1}, {"Clip", 1}, {"Gelu", 20},
        // nn
        {"Conv", 1}, {"ConvTranspose", 1}, {"Gemm", 1}, {"MatMul", 1}, {"BatchNormalization", 1},
        {"InstanceNormalization", 1}, {"LayerNormalization", 17}, {"LRN", 1}, {"MeanVarianceNormalization", 9},
        {"MaxPool", 1}, {"AveragePool", 1}, {"GlobalMaxPool", 1}, {"GlobalAveragePool", 1}, {"LpPool", 1},
        {"LSTM", 7}, {"GRU", 7}, {"RNN", 7},
        {"Softmax", 1}, {"LogSoftmax", 1}, {"Hardmax", 1}, {"Dropout", 1},
        // reductions
        {"ReduceSum", 1}, {"ReduceMean", 1}, {"ReduceMax", 1}, {"ReduceMin", 1}, {"ReduceProd", 1},
        {"ReduceL1", 1}, {"ReduceL2", 1}, {"ReduceLogSum", 1}, {"ReduceLogSumExp", 1}, {"ReduceSumSquare", 1},
        {"ArgMax", 1}, {"ArgMin", 1}, {"TopK", 1}, {"CumSum", 11},
        // shape and data movement
        {"Reshape", 1}, {"Transpose", 1}, {"Squeeze", 1}, {"Unsqueeze", 1}, {"Flatten", 1}, {"Concat", 1},
        {"Split", 1}, {"Slice", 1}, {"Gather", 1}, {"GatherElements", 11}, {"GatherND", 11}, {"ScatterND", 11},
        {"ScatterElements", 11}, {"Scatter", 9}, {"Expand", 8}, {"Tile", 1}, {"Pad", 1}, {"Cast", 1}, {"CastLike", 15},
        {"Shape", 1}, {"Size", 1}, {"ConstantOfShape", 9}, {"Constant", 1}, {"Range", 11}, {"Resize", 10},
        {"Upsample", 7}, {"Einsum", 12}, {"DepthToSpace", 1}, {"SpaceToDepth", 1}, {"Trilu", 14}, {"OneHot", 9},
        {"EyeLike", 9}, {"NonZero", 9}, {"Compress", 9}, {"Unique", 11}, {"MaxUnpool", 9}, {"Det", 11},
        // control flow (subgraphs)
        {"If", 1}, {"Loop", 1}, {"Scan", 9},
        // detection
        {"NonMaxSuppression", 10}, {"RoiAlign", 10}, {"GridSample", 16},
        // signal processing
        {"HannWindow", 17}, {"HammingWindow", 17}, {"BlackmanWindow", 17}, {"DFT", 17}, {"STFT", 17}, {"MelWeightMatrix", 17},
        // quantization
        {"QuantizeLinear", 10}, {"DequantizeLinear", 10}, {"DynamicQuantizeLinear", 11}, {"MatMulInteger", 10},
        {"ConvInteger", 10}, {"QLinearMatMul", 10}, {"QLinearConv", 10},
        // losses (used by exported training-aware graphs; inference semantics)
        {"NegativeLogLikelihoodLoss", 12}, {"SoftmaxCrossEntropyLoss", 12},
    };
    return ops;
}

bool isSupportedOp(const std::string& domain, const std::string& op_type, int64_t opset) {
    if (!domain.empty() && domain != "ai.onnx") return false;
    for (const auto& op : supportedOps())
        if (op_type == op.op_type) return opset >= op.since_opset;
    return false;
}

}  // namespace kiln
