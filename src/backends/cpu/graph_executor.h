// Executes an IR graph node by node with the reference CPU kernels.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cpu/reference/kernel.h"
#include "ir/graph.h"

namespace kiln {

using TensorMap = std::map<std::string, Tensor>;

// Checks user inputs against the graph's declared inputs: every input present, no unknown
// names, element types equal, ranks equal and fixed dims equal; a symbolic dim must take
// one size across all inputs. Throws Error naming the input.
void checkInputs(const Graph& g, const TensorMap& inputs);

// Decides where a node output lives once its kernel has computed it. The default keeps
// the kernel's tensor; the execution context's arena copies it into a planned slot.
// It may also hand kernels their output buffers directly (OutputAllocator).
class ValuePlacer : public OutputAllocator {
public:
    virtual Tensor place(size_t node_index, const std::string& value, Tensor computed) = 0;
    Tensor allocate(const std::string&, DType dtype, const Dims& dims) override { return Tensor::uninitialized(dtype, dims); }
};

class GraphExecutor {
public:
    // Fails (listing every op) if some node has no kernel. `tactics` maps node names to the
    // backend tactic recorded in an engine; nodes not named use the reference kernels.
    // Subgraphs (If, Loop, Scan) get executors of their own, their tactics named under
    // subgraphPrefix (ir/graph.h).
    explicit GraphExecutor(const Graph& graph, const std::map<std::string, std::string>& tactics = {});
    // Returns the graph outputs in declaration order. Stateless: one executor may run on
    // several threads at once (each with its own placer).
    std::vector<Tensor> run(const TensorMap& inputs, ValuePlacer* placer = nullptr) const;
    // Index of the last node reading each value (graph outputs: past the last node).
    size_t lastUse(const std::string& value) const;
    const Graph& graph() const { return graph_; }

private:
    // Runs the nodes from `values` (inputs, or a subgraph's scope), unchecked.
    std::vector<Tensor> execute(TensorMap values, ValuePlacer* placer) const;
    const GraphExecutor& subgraph(size_t node_index, const Graph& g) const;

    struct Subgraph {
        std::shared_ptr<Graph> graph;  // the node's attribute, kept alive with its executor
        std::unique_ptr<GraphExecutor> executor;
    };
    const Graph& graph_;
    std::vector<std::vector<Subgraph>> subgraphs_;  // per node: one per subgraph attribute
    std::vector<KernelFn> kernels_;                // per node
    std::vector<std::unique_ptr<KernelMemo>> memos_;  // per node: kept between runs
    // Time per op type, printed at exit when KILN_PROFILE is set (a debugging aid).
    struct Profile {
        std::mutex mutex;
        std::map<std::string, double> ms;
        ~Profile();
    };
    std::shared_ptr<Profile> profile_;
    void shareProfile(const std::shared_ptr<Profile>& profile, bool by_node);  // one table for the whole model
    bool profile_by_node_ = false;  // KILN_PROFILE=nodes: per node instead of per op type
    std::map<std::string, size_t> last_use_;  // value -> index of the last node reading it
    std::vector<std::vector<std::string>> frees_;  // per node: the values it reads last
};

}  // namespace kiln
