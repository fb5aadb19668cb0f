#include "ir/attribute_checks.h"

#include <set>

#include "ir/error.h"

namespace kiln {

namespace {

// Window sizes past this are no real model's, and their products overflow the output-size
// arithmetic of convolutions and pools (pads of 2^62 did, inside oneDNN).
constexpr int64_t kMaxWindow = int64_t(1) << 31;

bool isIntList(const Node& n, const char* name) {
    return n.attrs.has(name) && std::holds_alternative<std::vector<int64_t>>(n.attrs.all().at(name));
}

// Kiln's fused chain (passes/elementwise_fusion.cc): one entry per step in each list, and
// each binary step's operand an input of the node other than the chain's start.
void checkElementwiseChain(const Node& n) {
    const std::string where = n.describe();
    const auto* ops = n.attrs.has("ops") ? std::get_if<std::vector<std::string>>(&n.attrs.all().at("ops")) : nullptr;
    check(ops != nullptr && isIntList(n, "operand") && isIntList(n, "swapped"), where + ": malformed chain attributes (ops, operand, swapped)");
    const auto operand = n.attrs.getInts("operand");
    const auto params = n.attrs.getFloats("params");
    check(operand.size() == ops->size() && n.attrs.getInts("swapped").size() == ops->size() && params.size() == 2 * ops->size(),
          where + ": malformed chain attributes (one operand, swap flag and two parameters per step)");
    static const std::set<std::string> binary = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"};  // what the fusion makes binary steps of
    for (size_t s = 0; s < operand.size(); ++s) {
        const int64_t k = operand[s];
        check(k == -1 || (k >= 1 && k < static_cast<int64_t>(n.inputs.size())), where + ": chain operand " + std::to_string(k) + " is not one of the node's inputs");
        check(k == -1 || binary.count((*ops)[s]), where + ": chain step '" + (*ops)[s] + "' is not a binary operation");
    }
}

}  // namespace

void checkNodeAttributes(const Node& n) {
    const std::string where = n.describe();
    auto inRange = [&](const char* name, int64_t lo) {
        if (!isIntList(n, name)) return;
        for (int64_t v : n.attrs.getInts(name))
            check(v >= lo && v < kMaxWindow, [&] { return where + ": attribute '" + name + "' value " + std::to_string(v) + " is out of range [" + std::to_string(lo) + ", 2^31)"; });
    };
    inRange("strides", 1);
    inRange("dilations", 1);
    inRange("kernel_shape", 1);
    inRange("pads", 0);
    inRange("output_padding", 0);
    // One value per spatial dim (pads: two). The spatial rank comes from kernel_shape where
    // given, else from whichever list is present; an empty list is never a window.
    const bool pool = n.op_type == "MaxPool" || n.op_type == "AveragePool" || n.op_type == "LpPool";  // Kiln's BlockedPool may be global
    if (pool) check(isIntList(n, "kernel_shape") && !n.attrs.getInts("kernel_shape").empty(), where + ": attribute 'kernel_shape' is required");
    int64_t spatial = -1;
    for (const char* name : {"kernel_shape", "strides", "dilations", "output_padding"}) {
        if (!isIntList(n, name)) continue;
        const int64_t len = static_cast<int64_t>(n.attrs.getInts(name).size());
        check(len > 0, where + ": attribute '" + name + "' is empty");
        if (spatial < 0) spatial = len;
        check(len == spatial, [&] { return where + ": attribute '" + name + "' has " + std::to_string(len) + " values for " + std::to_string(spatial) + " spatial dims"; });
    }
    if (isIntList(n, "pads") && n.attrs.getInts("pads").size() > 0 && (spatial > 0 || pool)) {
        const size_t len = n.attrs.getInts("pads").size();
        check(spatial < 0 || len == 2 * static_cast<size_t>(spatial),
              [&] { return where + ": attribute 'pads' has " + std::to_string(len) + " values for " + std::to_string(spatial) + " spatial dims (needs two each)"; });
    }
    if (n.op_type == "ElementwiseChain") checkElementwiseChain(n);
    for (const char* name : {"group", "blocksize", "size"})
        if (n.attrs.has(name) && std::holds_alternative<int64_t>(n.attrs.all().at(name)))
            check(n.attrs.getInt(name) > 0 && n.attrs.getInt(name) < kMaxWindow,
                  where + ": attribute '" + name + "' must be in [1, 2^31), got " + std::to_string(n.attrs.getInt(name)));
}

}  // namespace kiln
