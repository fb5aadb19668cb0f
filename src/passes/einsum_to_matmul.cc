// A two-operand Einsum that is a batched matrix product becomes Transpose + MatMul (+
// Transpose): every target's GEMM kernels then run it (MaxViT's and many attention
// implementations' "bhid,bhjd->bhij" and "bhij,bhjd->bhid"). Each label must be one of:
// batch (both operands and the output), row (first operand and output), column (second
// operand and output) or contracted (both operands, not the output); exactly one row, one
// column and one contracted label, so no reshape is needed. Others stay Einsum.
#include <algorithm>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

struct Equation {
    std::string a, b, out;
};

// "ab,bc->ac" without spaces; false for one operand, three or more, ellipses, or an
// implicit output.
bool parseEquation(std::string text, Equation* e) {
    text.erase(std::remove(text.begin(), text.end(), ' '), text.end());
    const size_t comma = text.find(','), arrow = text.find("->");
    if (comma == std::string::npos || arrow == std::string::npos || arrow < comma || text.find('.') != std::string::npos) return false;
    e->a = text.substr(0, comma);
    e->b = text.substr(comma + 1, arrow - comma - 1);
    e->out = text.substr(arrow + 2);
    if (e->b.find(',') != std::string::npos) return false;
    for (const std::string* s : {&e->a, &e->b, &e->out})
        for (char c : *s)
            if (!std::isalpha(static_cast<unsigned char>(c)) || std::count(s->begin(), s->end(), c) != 1) return false;
    return true;
}

// The permutation that reorders `from`'s labels into `to`.
std::vector<int64_t> permutationTo(const std::string& from, const std::string& to) {
    std::vector<int64_t> perm;
    for (char c : to) perm.push_back(static_cast<int64_t>(from.find(c)));
    return perm;
}

bool identity(const std::vector<int64_t>& perm) {
    for (size_t i = 0; i < perm.size(); ++i)
        if (perm[i] != static_cast<int64_t>(i)) return false;
    return true;
}

void einsumToMatMul(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.einsum_matmul")) return;
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        Equation e;
        if (n.op_type != "Einsum" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
        if (!parseEquation(n.attrs.getString("equation", ""), &e)) continue;
        std::string batch, row, col, contracted;
        bool ok = true;
        for (char c : e.a) {
            const bool in_b = e.b.find(c) != std::string::npos, in_out = e.out.find(c) != std::string::npos;
            if (in_b && in_out) batch += c;
            else if (in_out) row += c;
            else if (in_b) contracted += c;
            else ok = false;  // summed over one operand only
        }
        for (char c : e.b)
            if (e.a.find(c) == std::string::npos) {
                if (e.out.find(c) == std::string::npos) ok = false;
                else col += c;
            }
        for (char c : e.out) ok &= e.a.find(c) != std::string::npos || e.b.find(c) != std::string::npos;
        if (!ok || row.size() != 1 || col.size() != 1 || contracted.size() != 1) continue;
        // Batch labels in the output's order, then rows/columns as MatMul wants them.
        std::string batch_order;
        for (char c : e.out)
            if (batch.find(c) != std::string::npos) batch_order += c;
        const std::string a_want = batch_order + row + contracted, b_want = batch_order + contracted + col, product = batch_order + row + col;
        auto transposed = [&](const std::string& value, const std::string& from, const std::string& to, const std::string& tag) {
            const auto perm = permutationTo(from, to);
            if (identity(perm)) return value;
            const std::string name = freshName(g, value + "_" + tag);
            Node t{freshName(g, n.name + "_" + tag), "Transpose", "", {value}, {name}, {}};
            t.attrs.set("perm", perm);
            added.push_back(t);
            return name;
        };
        const std::string lhs = transposed(n.inputs[0], e.a, a_want, "lhs"), rhs = transposed(n.inputs[1], e.b, b_want, "rhs");
        const auto out_perm = permutationTo(product, e.out);
        const std::string mm_out = identity(out_perm) ? n.outputs[0] : freshName(g, n.outputs[0] + "_product");
        added.push_back(Node{n.name, "MatMul", "", {lhs, rhs}, {mm_out}, {}});
        if (!identity(out_perm)) {
            Node t{freshName(g, n.name + "_out"), "Transpose", "", {mm_out}, {n.outputs[0]}, {}};
            t.attrs.set("perm", out_perm);
            added.push_back(t);
        }
        erase[i] = true;
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass einsumToMatMulPass() {
    return {"einsum_to_matmul",
            {{"fusion.einsum_matmul", {"on", "off"}, "on", "einsum_to_matmul", "Run two-operand Einsums that are batched matrix products as Transpose + MatMul"}},
            einsumToMatMul};
}

}  // namespace kiln
