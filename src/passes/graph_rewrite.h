// Helpers for passes that match and rewrite subgraphs.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

// Producer and consumers of every value of a graph (indices into g.nodes). Rebuild after
// changing the graph.
class GraphIndex {
public:
    explicit GraphIndex(const Graph& g);
    int producer(const std::string& value) const;
    const std::vector<int>& consumers(const std::string& value) const;
    bool isGraphOutput(const std::string& value) const { return outputs_.count(value) != 0; }
    // Exactly one consuming input slot and not a graph output: safe to fuse away.
    bool singleUse(const std::string& value) const { return consumers(value).size() == 1 && !isGraphOutput(value); }
    // The only consumer of `value` when singleUse, else -1.
    int soleConsumer(const std::string& value) const { return singleUse(value) ? consumers(value)[0] : -1; }

private:
    std::map<std::string, int> producer_;
    std::map<std::string, std::vector<int>> consumers_;
    std::map<std::string, bool> outputs_;
};

// The initializer named `value`, or nullptr.
const Tensor* constantOf(const Graph& g, const std::string& value);
// True and sets *out when `value` is a one-element constant.
bool scalarConstant(const Graph& g, const std::string& value, double* out);
// A value / node name not used in `g`, built from `base`.
std::string freshName(const Graph& g, const std::string& base);
// Removes the nodes whose index is flagged.
void eraseNodes(Graph& g, const std::vector<bool>& erase);
// Claims a match's nodes for removal: false (and nothing marked) when another match of the
// same pass already took one of them, so overlapping matches are never both applied.
template <typename Indices>
bool claimNodes(std::vector<bool>& erase, const Indices& matched) {
    for (int k : matched)
        if (erase[static_cast<size_t>(k)]) return false;
    for (int k : matched) erase[static_cast<size_t>(k)] = true;
    return true;
}
// Removes the flagged nodes and appends `added` (the usual end of a fusion pass).
void replaceNodes(Graph& g, const std::vector<bool>& erase, std::vector<Node>& added);
// Replaces every use of value `from` (node inputs) with `to`.
void replaceUses(Graph& g, const std::string& from, const std::string& to);
// The other input of a binary node given one of them; "" if `known` is not an input.
std::string otherInput(const Node& n, const std::string& known);

// Whether `n` is a keepdims `op` (ReduceMean, ReduceSum, ...) over exactly the last axis,
// given as -1 or as rank-1 when the input's rank is known; axes may be an attribute or a
// constant input.
bool reducesLastAxis(const Graph& g, const Node& n, const std::string& op);
// Activation ops that can be fused as epilogues, with their parameters from attributes
// or constant inputs. Returns false when `n` is not such an activation.
bool fusableActivation(const Graph& g, const Node& n, std::string* name, std::vector<float>* params);
// SiLU written out: `value` feeds exactly Sigmoid(value) and Mul(value, that sigmoid) (either
// order), the sigmoid feeds only the Mul, and neither is a graph output. Sets the two nodes'
// indices; the Mul's output is the SiLU's.
bool siluOf(const Graph& g, const GraphIndex& index, const std::string& value, int* sigmoid, int* mul);
// Stores an activation on a fused node as attributes "activation" / "activation_params".
void setActivation(Node& fused, const std::string& name, const std::vector<float>& params);

}  // namespace kiln
