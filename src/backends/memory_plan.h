// Activation memory planning: assigns each intermediate buffer an offset in one arena so
// that buffers whose lifetimes overlap never overlap in memory.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "ir/parameter.h"

namespace kiln {

// memory.planner: the strategy below, read at run time by every target's executor.
const ParameterSpec& memoryPlannerParameter();

struct BufferRequest {
    size_t first_use;  // index of the producing node
    size_t last_use;   // index of the last node that reads it
    size_t bytes;
};

struct MemoryPlan {
    std::vector<size_t> offsets;  // per request
    size_t arena_bytes = 0;       // peak activation memory of the plan
    size_t unplanned_bytes = 0;   // sum of all buffers (what no reuse would need)
};

// strategy: "none" (every buffer its own space), "greedy" (largest first, best fit) or
// "linear" (in execution order, first fit).
MemoryPlan planMemory(const std::vector<BufferRequest>& requests, const std::string& strategy);

}  // namespace kiln
