// Lowering to the CPU backend: picks a tactic for every node from the route's
// tactic.cpu.* parameters. With "auto", the supported tactics are timed on the node's
// static shapes (trtexec-style) and the fastest is recorded; a timing cache file keeps
// those choices across builds.
#pragma once
#include <map>
#include <string>

#include "ir/graph.h"
#include "ir/parameter.h"

namespace kiln {

class TimingCache {
public:
    TimingCache() = default;
    explicit TimingCache(std::string path);  // loads the file if it exists
    const std::string* find(const std::string& key) const;
    void put(const std::string& key, const std::string& tactic);
    void save() const;  // no-op without a path
    size_t hits() const { return hits_; }

private:
    std::string path_;
    std::map<std::string, std::string> entries_;
    mutable size_t hits_ = 0;
};

// Node name -> tactic for every node of `g`. Nodes with static shapes are timed on random
// tensors of those shapes; with `input_shapes` (every runtime input's build shape, e.g. the
// profile's opt shapes), the others are timed on the values the model computes from random
// inputs of those shapes. Subgraphs' nodes are named by subgraphPrefix (ir/graph.h) + their name.
std::map<std::string, std::string> selectTactics(const Graph& g, const RouteValues& route, TimingCache* cache,
                                                 const std::map<std::string, Dims>& input_shapes = {});

}  // namespace kiln
