// Executes an IR graph node by node with the reference CPU kernels.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

using TensorMap = std::map<std::string, Tensor>;

// Checks user inputs against the graph's declared inputs: every input present, no unknown
// names, element types equal, ranks equal and fixed dims equal; a symbolic dim must take
// one size across all inputs. Throws Error naming the input.
void checkInputs(const Graph& g, const TensorMap& inputs);

class GraphExecutor {
public:
    // Fails (listing every op) if some node has no kernel.
    explicit GraphExecutor(const Graph& graph);
    // Returns the graph outputs in declaration order.
    std::vector<Tensor> run(const TensorMap& inputs) const;

private:
    const Graph& graph_;
    std::map<std::string, size_t> last_use_;  // value -> index of the last node reading it
};

}  // namespace kiln
