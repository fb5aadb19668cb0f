// The IR graph: values are named (as in ONNX); nodes list input/output value names; an
// empty input name marks an omitted optional input.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/attribute.h"
#include "ir/shape.h"

namespace kiln {

struct ValueInfo {
    std::string name;
    DType dtype = DType::Undefined;
    Shape shape;
};

struct Node {
    std::string name;
    std::string op_type;
    std::string domain;  // "" is the default ONNX domain
    std::vector<std::string> inputs;
    std::vector<std::string> outputs;
    Attributes attrs;

    // "node 'name' (OpType)" for error messages.
    std::string describe() const;
    bool hasInput(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
};

struct Graph {
    std::string name;
    int64_t opset = 0;  // opset version of the default domain
    std::vector<ValueInfo> inputs;
    std::vector<ValueInfo> outputs;
    std::map<std::string, Tensor> initializers;
    std::map<std::string, ValueInfo> value_info;  // known types/shapes of other values
    std::vector<Node> nodes;

    // Type and shape of a value from inputs, outputs, initializers or value_info; nullptr if unknown.
    const ValueInfo* findValueInfo(const std::string& name) const;
    // Graph inputs that are not initializers (what a user must feed).
    std::vector<ValueInfo> runtimeInputs() const;
};

// Orders nodes so each comes after the producers of its inputs; throws Error on a cycle.
void topologicalSort(Graph& g);
// Names a subgraph may read from enclosing graphs (inputs, initializers, node outputs).
std::set<std::string> definedNames(const Graph& g);
// ONNX subgraphs (If branches, Loop and Scan bodies) read outer values by name. Kiln makes
// those reads explicit so that every pass, the scheduler and the memory planner see them as
// uses: each node with subgraphs gets the outer values they read appended to its inputs,
// after the formal ones, and their names inside the subgraphs in attribute "captures"
// (passes may rename the node's inputs; the subgraphs keep theirs). Nested subgraphs are
// lifted first, so a capture of an inner graph becomes one of each graph around it.
void liftCaptures(Graph& g);
// How many of a node's inputs are its operator's own (the rest are captures).
size_t formalInputCount(const Node& n);
// The names of a node's subgraph attributes ("then_branch", "body", ...), in order.
std::vector<std::string> subgraphAttributes(const Node& n);
// Where a subgraph's nodes are named in engine-wide tables (tactics, coverage):
// "<node>/<attribute>/" before each inner node's name.
std::string subgraphPrefix(const Node& n, const std::string& attribute);
// Prepares node `n`'s subgraphs (lifted) for optimizing on their own: each gets the outer
// constants it reads as initializers of its own (taken off the node's captures, so that its
// convolutions and matmuls see constant weights), and the types `outer` knows of the other
// captured values as value infos. The node's subgraph attributes become fresh copies.
void sinkCapturedConstants(const Graph& outer, Node& n);
// Checks that the graph is well formed: every input defined before use, each value produced
// once, no cycles, declared outputs produced, known element types consistent, and every
// node's attributes in range (attribute_checks.h).
// `outer` holds names visible from enclosing graphs. Throws Error naming the first fault.
void verifyGraph(const Graph& g, const std::set<std::string>& outer = {});
// Human-readable text form, one node per line.
std::string dumpGraph(const Graph& g);

}  // namespace kiln
