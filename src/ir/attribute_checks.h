// Attribute values that no node may carry, checked where a graph enters Kiln: by the ONNX
// importer and again by the engine loader, so that a crafted model or engine file fails
// with an Error naming the node instead of reaching a kernel (or ONNX's shape inference)
// that divides by them or reads past them.
#pragma once
#include "ir/graph.h"

namespace kiln {

// Throws Error naming `n` for an attribute out of the ONNX spec's range: windows (strides,
// dilations, kernel_shape, pads) of the wrong length or value, a non-positive group.
void checkNodeAttributes(const Node& n);

}  // namespace kiln
