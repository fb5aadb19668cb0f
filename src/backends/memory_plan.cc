#include "backends/memory_plan.h"

#include <algorithm>
#include <numeric>

#include "ir/error.h"

namespace kiln {

const ParameterSpec& memoryPlannerParameter() {
    static const ParameterSpec p{"memory.planner", {"none", "greedy", "linear"}, "greedy", "runtime",
                                 "Activation memory plan: a buffer per value, best-fit reuse by size, or first-fit in execution order"};
    return p;
}


namespace {
constexpr size_t kAlign = 64;
size_t alignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
bool livesOverlap(const BufferRequest& a, const BufferRequest& b) { return a.first_use <= b.last_use && b.first_use <= a.last_use; }
}  // namespace

MemoryPlan planMemory(const std::vector<BufferRequest>& requests, const std::string& strategy) {
    MemoryPlan plan;
    plan.offsets.assign(requests.size(), 0);
    for (const auto& r : requests) plan.unplanned_bytes += alignUp(r.bytes);
    if (strategy == "none") {
        size_t off = 0;
        for (size_t i = 0; i < requests.size(); ++i) {
            plan.offsets[i] = off;
            off += alignUp(requests[i].bytes);
        }
        plan.arena_bytes = off;
        return plan;
    }
    check(strategy == "greedy" || strategy == "linear", [&] { return "unknown memory planner '" + strategy + "'"; });
    std::vector<size_t> order(requests.size());
    std::iota(order.begin(), order.end(), 0);
    if (strategy == "greedy")
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return requests[a].bytes > requests[b].bytes; });
    else
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return requests[a].first_use < requests[b].first_use; });
    std::vector<size_t> placed;
    for (size_t i : order) {
        const size_t size = alignUp(requests[i].bytes);
        // Occupied ranges of buffers alive at the same time, sorted by offset.
        std::vector<std::pair<size_t, size_t>> busy;
        for (size_t j : placed)
            if (livesOverlap(requests[i], requests[j])) busy.emplace_back(plan.offsets[j], plan.offsets[j] + alignUp(requests[j].bytes));
        std::sort(busy.begin(), busy.end());
        size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
        for (const auto& [b, e] : busy) {
            if (b >= cursor + size) {
                const size_t gap = b - cursor;
                if (strategy == "linear") {
                    best = cursor;
                    break;
                }
                if (gap < best_gap) {
                    best_gap = gap;
                    best = cursor;
                }
            }
            cursor = std::max(cursor, e);
        }
        if (best == SIZE_MAX) best = cursor;  // after everything alive
        plan.offsets[i] = best;
        plan.arena_bytes = std::max(plan.arena_bytes, best + size);
        placed.push_back(i);
    }
    return plan;
}

}  // namespace kiln
