// The reference target: every node on its reference kernel (backends/cpu/reference), no
// tactics, no arena. Its answers are the op semantics themselves, so an engine that differs
// from its reference-target twin points at a fast kernel or a pass; it is also the smallest
// backend, the one to copy when adding a target.
#pragma once
#include "backends/backend.h"

namespace kiln {

const Backend& referenceBackend();

}  // namespace kiln
