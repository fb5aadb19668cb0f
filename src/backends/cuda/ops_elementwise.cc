// GPU implementations of elementwise ops: activations and unary math, broadcast binary
// arithmetic/comparison/logic, Cast, Where and the fused ElementwiseChain.
#include <cmath>
#include <limits>

#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

// A unary op reads its parameters from attributes with the ONNX defaults.
UnaryFn unaryOf(const OpContext& ctx) {
    const std::string& op = ctx.node.op_type;
    const auto& a = ctx.attrs();
    if (op == "LeakyRelu") return {UnaryOp::LeakyRelu, a.getFloat("alpha", 0.01f), 0};
    if (op == "HardSigmoid") return {UnaryOp::HardSigmoid, a.getFloat("alpha", 0.2f), a.getFloat("beta", 0.5f)};
    if (op == "Elu") return {UnaryOp::Elu, a.getFloat("alpha", 1.0f), 0};
    if (op == "Selu") return {UnaryOp::Selu, a.getFloat("alpha", 1.67326319217681884765625f), a.getFloat("gamma", 1.05070102214813232421875f)};
    if (op == "Gelu") return {a.getString("approximate", "none") == "tanh" ? UnaryOp::GeluTanh : UnaryOp::Gelu, 0, 0};
    if (op == "Clip") {
        float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
        if (ctx.opset < 11) {
            lo = a.getFloat("min", lo);
            hi = a.getFloat("max", hi);
        } else {
            if (ctx.has(1)) {
                if (!ctx.input(1).host) ctx.unsupported("Clip bound computed on the device");
                lo = static_cast<float>(ctx.input(1).host->scalarAt(0));
            }
            if (ctx.has(2)) {
                if (!ctx.input(2).host) ctx.unsupported("Clip bound computed on the device");
                hi = static_cast<float>(ctx.input(2).host->scalarAt(0));
            }
        }
        return {UnaryOp::Clip, lo, hi};
    }
    return unaryFromName(op, 0, 0, ctx);
}

std::vector<DeviceTensor> unary(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const std::string& op = ctx.node.op_type;
    if ((x.dtype == DType::I64 || x.dtype == DType::I32) && (op == "Abs" || op == "Neg" || op == "Sign")) {  // T5's relative position buckets
        DeviceTensor y = ctx.output(0, x.logical, x.dims);
        launchIntegerUnary(x.dtype, op == "Abs" ? UnaryOp::Abs : op == "Neg" ? UnaryOp::Neg : UnaryOp::Sign, x.data, y.data, x.numel(), ctx.stream());
        return {y};
    }
    const DType t = ctx.floatType(0);
    const UnaryFn f = unaryOf(ctx);
    DeviceTensor y = ctx.output(0, x.logical, x.dims);
    launchUnary(t, f, x.data, y.data, x.numel(), ctx.stream());
    return {y};
}

BinaryOp binaryOf(const std::string& op) {
    static const std::map<std::string, BinaryOp> table = {
        {"Add", BinaryOp::Add}, {"Sub", BinaryOp::Sub}, {"Mul", BinaryOp::Mul}, {"Div", BinaryOp::Div}, {"Pow", BinaryOp::Pow},
        {"Max", BinaryOp::Max}, {"Min", BinaryOp::Min}, {"Equal", BinaryOp::Equal}, {"Less", BinaryOp::Less},
        {"Greater", BinaryOp::Greater}, {"LessOrEqual", BinaryOp::LessOrEqual}, {"GreaterOrEqual", BinaryOp::GreaterOrEqual},
        {"And", BinaryOp::And}, {"Or", BinaryOp::Or}, {"Xor", BinaryOp::Xor},
    };
    return table.at(op);
}

std::vector<DeviceTensor> binary(OpContext& ctx) {
    if (ctx.numInputs() != 2) ctx.unsupported("variadic form with " + std::to_string(ctx.numInputs()) + " inputs");
    const DeviceTensor& a = ctx.input(0);
    const DeviceTensor& b = ctx.input(1);
    const bool fmod = ctx.node.op_type == "Mod" && ctx.attrs().getInt("fmod", 0) != 0;
    const BinaryOp op = ctx.node.op_type == "Mod" ? (fmod ? BinaryOp::Fmod : BinaryOp::Mod) : binaryOf(ctx.node.op_type);
    if (a.dtype != b.dtype) ctx.unsupported("mixed element types");
    const bool integer = a.dtype == DType::I64 || a.dtype == DType::I32;
    if (op == BinaryOp::Mod) ctx.require(integer || !isDeviceFloat(a.dtype), "fmod must be 1 for floating-point inputs");
    if (isLogical(op) ? a.dtype != DType::Bool : !(isDeviceFloat(a.dtype) || (integer && op != BinaryOp::Pow)))
        ctx.unsupported("element type " + std::string(dtypeName(a.dtype)));
    const Dims dims = broadcastDims(a.dims, b.dims, ctx.node.describe());
    const Shape6 shape = toShape6(dims, ctx);
    DeviceTensor y = ctx.output(0, isComparison(op) ? DType::Bool : a.logical, dims);
    launchBinary(a.dtype, op, a.data, broadcastView(a.dims, dims, ctx), b.data, broadcastView(b.dims, dims, ctx), y.data, shape, UnaryFn{},
                 ctx.stream());
    return {y};
}

std::vector<DeviceTensor> logicalNot(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    if (x.dtype != DType::Bool) ctx.unsupported("element type " + std::string(dtypeName(x.dtype)));
    DeviceTensor y = ctx.output(0, DType::Bool, x.dims);
    launchNot(x.data, y.data, x.numel(), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> cast(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType to = ctx.node.op_type == "CastLike" ? ctx.input(1).logical : parseDType(ctx.attrs().getString("to", ""));
    DeviceTensor y = ctx.output(0, to, x.dims);
    launchCast(x.dtype, y.dtype, x.data, y.data, x.numel(), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> where(OpContext& ctx) {
    const DeviceTensor& c = ctx.input(0);
    const DeviceTensor& x = ctx.input(1);
    const DeviceTensor& y = ctx.input(2);
    if (c.dtype != DType::Bool || x.dtype != y.dtype) ctx.unsupported("element types");
    const Dims dims = broadcastDims(broadcastDims(c.dims, x.dims, ctx.node.describe()), y.dims, ctx.node.describe());
    DeviceTensor out = ctx.output(0, x.logical, dims);
    launchWhere(dtypeSize(x.dtype), c.data, broadcastView(c.dims, dims, ctx), x.data, broadcastView(x.dims, dims, ctx), y.data,
                broadcastView(y.dims, dims, ctx), out.data, toShape6(dims, ctx), ctx.stream());
    return {out};
}

std::vector<DeviceTensor> elementwiseChain(OpContext& ctx) {
    const auto operands = ctx.attrs().getInts("operand");
    const auto swapped = ctx.attrs().getInts("swapped");
    const auto params = ctx.attrs().getFloats("params");
    const auto& names = std::get<std::vector<std::string>>(ctx.attrs().all().at("ops"));
    ctx.require(operands.size() == names.size() && swapped.size() == names.size() && params.size() == 2 * names.size(), "malformed chain attributes");
    if (names.size() > static_cast<size_t>(kMaxChainSteps) || ctx.numInputs() > static_cast<size_t>(kMaxChainInputs)) ctx.unsupported("chain too long");
    const DType t = ctx.floatType(0);
    Dims dims = ctx.input(0).dims;
    for (size_t i = 1; i < ctx.numInputs(); ++i) {
        if (ctx.input(i).dtype != t) ctx.unsupported("mixed element types");
        dims = broadcastDims(dims, ctx.input(i).dims, ctx.node.describe());
    }
    ChainProgram p;
    p.steps = static_cast<int>(names.size());
    p.inputs = static_cast<int>(ctx.numInputs());
    for (size_t i = 0; i < ctx.numInputs(); ++i) {
        p.data[i] = ctx.input(i).data;
        p.views[i] = broadcastView(ctx.input(i).dims, dims, ctx);
    }
    for (size_t s = 0; s < names.size(); ++s) {
        p.operand[s] = static_cast<int32_t>(operands[s]);
        p.swapped[s] = static_cast<int32_t>(swapped[s]);
        if (operands[s] < 0) {
            p.unary[s] = unaryFromName(names[s], params[2 * s], params[2 * s + 1], ctx);
        } else {
            static const std::vector<std::string> arithmetic = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"};
            if (std::find(arithmetic.begin(), arithmetic.end(), names[s]) == arithmetic.end()) ctx.unsupported("chain step " + names[s]);
            p.op[s] = binaryOf(names[s]);
        }
    }
    DeviceTensor y = ctx.output(0, ctx.input(0).logical, dims);
    launchChain(t, p, y.data, toShape6(dims, ctx), ctx.stream());
    return {y};
}

}  // namespace

void addElementwiseOps(std::map<std::string, OpFn>& ops) {
    for (const char* op : {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Gelu", "Softplus", "Exp", "Log", "Sqrt",
                           "Neg", "Abs", "Erf", "Reciprocal", "Floor", "Ceil", "Sin", "Cos", "Elu", "Selu", "Softsign", "Sign", "Round"})
        ops[op] = unary;
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And",
                           "Or", "Xor"})
        ops[op] = binary;
    ops["Not"] = logicalNot;
    ops["Cast"] = cast;
    ops["CastLike"] = cast;
    ops["Where"] = where;
    ops["ElementwiseChain"] = elementwiseChain;
}

}  // namespace kiln::cuda
