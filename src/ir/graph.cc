#include "ir/graph.h"

#include "ir/attribute_checks.h"

#include <queue>
#include <sstream>
#include <unordered_map>

namespace kiln {

std::string Node::describe() const {
    return "node '" + (name.empty() ? (outputs.empty() ? std::string("?") : outputs[0]) : name) + "' (" + op_type + ")";
}

const ValueInfo* Graph::findValueInfo(const std::string& n) const {
    for (const auto& v : inputs)
        if (v.name == n) return &v;
    for (const auto& v : outputs)
        if (v.name == n && v.dtype != DType::Undefined) return &v;
    auto it = value_info.find(n);
    return it == value_info.end() ? nullptr : &it->second;
}

std::vector<ValueInfo> Graph::runtimeInputs() const {
    std::vector<ValueInfo> out;
    for (const auto& v : inputs)
        if (!initializers.count(v.name)) out.push_back(v);
    return out;
}

void topologicalSort(Graph& g) {
    std::unordered_map<std::string, size_t> producer;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        for (const auto& o : g.nodes[i].outputs)
            if (!o.empty()) producer[o] = i;
    std::vector<size_t> pending(g.nodes.size(), 0);
    std::vector<std::vector<size_t>> consumers(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        std::set<size_t> deps;
        for (const auto& in : g.nodes[i].inputs) {
            auto it = producer.find(in);
            if (it != producer.end() && it->second != i) deps.insert(it->second);
        }
        pending[i] = deps.size();
        for (size_t d : deps) consumers[d].push_back(i);
    }
    // Kahn's algorithm, preferring original order so sorting a sorted graph is a no-op.
    std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (pending[i] == 0) ready.push(i);
    std::vector<Node> sorted;
    sorted.reserve(g.nodes.size());
    while (!ready.empty()) {
        size_t i = ready.top();
        ready.pop();
        sorted.push_back(g.nodes[i]);
        for (size_t c : consumers[i])
            if (--pending[c] == 0) ready.push(c);
    }
    if (sorted.size() != g.nodes.size()) {
        for (size_t i = 0; i < g.nodes.size(); ++i)
            if (pending[i] != 0) throw Error("graph has a cycle through " + g.nodes[i].describe());
    }
    g.nodes = std::move(sorted);
}

std::set<std::string> definedNames(const Graph& g) {
    std::set<std::string> names;
    for (const auto& v : g.inputs) names.insert(v.name);
    for (const auto& [n, t] : g.initializers) names.insert(n);
    for (const auto& node : g.nodes)
        for (const auto& o : node.outputs)
            if (!o.empty()) names.insert(o);
    return names;
}

void liftCaptures(Graph& g) {
    for (auto& node : g.nodes) {
        if (node.attrs.has("captures")) continue;  // lifted already
        std::set<std::string> captures;
        for (const auto& [name, attr] : node.attrs.all()) {
            const auto* sub = std::get_if<std::shared_ptr<Graph>>(&attr);
            if (!sub || !*sub) continue;
            Graph& body = **sub;
            liftCaptures(body);
            const std::set<std::string> inside = definedNames(body);
            for (const auto& n : body.nodes)
                for (const auto& in : n.inputs)
                    if (!in.empty() && !inside.count(in)) captures.insert(in);
            for (const auto& o : body.outputs)
                if (!inside.count(o.name)) captures.insert(o.name);
        }
        if (captures.empty()) continue;
        std::vector<std::string> names(captures.begin(), captures.end());
        node.inputs.insert(node.inputs.end(), names.begin(), names.end());
        node.attrs.set("captures", names);
    }
}

size_t formalInputCount(const Node& n) {
    const size_t captured = n.attrs.getStrings("captures").size();
    return n.inputs.size() >= captured ? n.inputs.size() - captured : 0;
}

std::vector<std::string> subgraphAttributes(const Node& n) {
    std::vector<std::string> names;
    for (const auto& [name, attr] : n.attrs.all())
        if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&attr); sub && *sub) names.push_back(name);
    return names;
}

std::string subgraphPrefix(const Node& n, const std::string& attribute) { return n.name + "/" + attribute + "/"; }

void sinkCapturedConstants(const Graph& outer, Node& n) {
    const std::vector<std::string> attrs = subgraphAttributes(n);
    if (attrs.empty()) return;
    const std::vector<std::string> captures = n.attrs.getStrings("captures");
    const size_t formal = formalInputCount(n);
    std::vector<std::string> inputs(n.inputs.begin(), n.inputs.begin() + static_cast<std::ptrdiff_t>(formal)), kept;
    std::map<std::string, Tensor> constants;
    std::map<std::string, ValueInfo> types;
    for (size_t k = 0; k < captures.size(); ++k) {
        const std::string& from = n.inputs[formal + k];
        if (auto c = outer.initializers.find(from); c != outer.initializers.end()) {
            constants[captures[k]] = c->second;
            continue;
        }
        if (const ValueInfo* vi = outer.findValueInfo(from)) {
            ValueInfo inner = *vi;
            inner.name = captures[k];
            types[captures[k]] = inner;
        }
        kept.push_back(captures[k]);
        inputs.push_back(from);
    }
    for (const auto& name : attrs) {
        auto body = std::make_shared<Graph>(*n.attrs.getGraph(name));
        for (const auto& [inner, t] : constants) body->initializers[inner] = t;
        for (const auto& [inner, vi] : types)
            if (!body->value_info.count(inner)) body->value_info[inner] = vi;
        n.attrs.set(name, body);
    }
    n.inputs = std::move(inputs);
    n.attrs.set("captures", kept);
}

namespace {
// Ops whose listed inputs must all share one element type (ONNX type constraint "T").
bool inputsShareType(const std::string& op) {
    static const std::set<std::string> ops = {"Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Concat", "Sum", "Max", "Min", "Mean", "Equal", "Less", "Greater"};
    return ops.count(op) != 0;
}
}  // namespace

void verifyGraph(const Graph& g, const std::set<std::string>& outer) {
    std::set<std::string> defined = outer;
    for (const auto& v : g.inputs) defined.insert(v.name);
    for (const auto& [n, t] : g.initializers) defined.insert(n);
    std::set<std::string> produced;
    for (const auto& node : g.nodes) {
        check(!node.op_type.empty(), "graph '" + g.name + "': a node has no op type");
        checkNodeAttributes(node);
        for (size_t i = 0; i < node.inputs.size(); ++i) {
            const auto& in = node.inputs[i];
            if (in.empty()) continue;
            check(defined.count(in) != 0, node.describe() + ": input '" + in + "' is not defined before use (missing producer or a cycle)");
        }
        if (inputsShareType(node.op_type)) {
            DType first = DType::Undefined;
            for (const auto& in : node.inputs) {
                const ValueInfo* vi = in.empty() ? nullptr : g.findValueInfo(in);
                DType t = vi ? vi->dtype : (g.initializers.count(in) ? g.initializers.at(in).dtype() : DType::Undefined);
                if (t == DType::Undefined) continue;
                if (first == DType::Undefined) first = t;
                check(t == first, node.describe() + ": inputs have different element types (" + std::string(dtypeName(first)) + " vs " + std::string(dtypeName(t)) + ")");
            }
        }
        for (const auto& [name, attr] : node.attrs.all())
            if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&attr))
                if (*sub) verifyGraph(**sub, defined);
        for (const auto& o : node.outputs) {
            if (o.empty()) continue;
            check(produced.insert(o).second && !g.initializers.count(o), node.describe() + ": value '" + o + "' is produced more than once");
            defined.insert(o);
        }
    }
    for (const auto& o : g.outputs) check(defined.count(o.name) != 0, "graph output '" + o.name + "' is never produced");
    for (const auto& [n, t] : g.initializers) {
        auto vi = g.findValueInfo(n);
        if (vi && vi->dtype != DType::Undefined)
            check(vi->dtype == t.dtype(), "initializer '" + n + "' is " + t.summary() + " but declared " + std::string(dtypeName(vi->dtype)));
    }
}

std::string dumpGraph(const Graph& g) {
    std::ostringstream s;
    auto valueText = [&](const std::string& n) {
        const ValueInfo* vi = g.findValueInfo(n);
        if (!vi) {
            auto it = g.initializers.find(n);
            return it == g.initializers.end() ? n : n + ":" + it->second.summary();
        }
        return n + ":" + std::string(dtypeName(vi->dtype)) + vi->shape.toString();
    };
    s << "graph " << (g.name.empty() ? "main" : g.name) << " (opset " << g.opset << ")\n";
    for (const auto& v : g.runtimeInputs()) s << "  input  " << valueText(v.name) << "\n";
    for (const auto& v : g.outputs) s << "  output " << valueText(v.name) << "\n";
    s << "  " << g.initializers.size() << " initializers\n";
    for (const auto& node : g.nodes) {
        s << "  ";
        for (size_t i = 0; i < node.outputs.size(); ++i) s << (i ? ", " : "") << valueText(node.outputs[i]);
        s << " = " << node.op_type << "(";
        for (size_t i = 0; i < node.inputs.size(); ++i) s << (i ? ", " : "") << (node.inputs[i].empty() ? "_" : node.inputs[i]);
        s << ")";
        if (!node.attrs.all().empty()) {
            s << " {";
            bool first = true;
            for (const auto& [k, v] : node.attrs.all()) {
                s << (first ? "" : ", ") << k << "=" << attributeToString(v);
                first = false;
            }
            s << "}";
        }
        s << "\n";
    }
    return s.str();
}

}  // namespace kiln
