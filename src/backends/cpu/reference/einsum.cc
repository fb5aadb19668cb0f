// Einsum by direct summation over every index combination (explicit or implicit output,
// ellipsis with broadcasting, repeated letters for diagonals).
#include <map>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

std::string stripSpaces(const std::string& s) {
    std::string out;
    for (char c : s)
        if (c != ' ') out += c;
    return out;
}

std::vector<std::string> splitTerms(const std::string& s) {
    std::vector<std::string> terms(1);
    for (char c : s) {
        if (c == ',') terms.emplace_back();
        else terms.back() += c;
    }
    return terms;
}

std::vector<Tensor> einsum(const KernelContext& ctx) {
    const std::string eq = stripSpaces(ctx.attrs().getString("equation", ""));
    const auto arrow = eq.find("->");
    std::vector<std::string> terms = splitTerms(eq.substr(0, arrow));
    ctx.require(terms.size() == ctx.numInputs(), [&] { return "equation has " + std::to_string(terms.size()) + " operands but the node has " + std::to_string(ctx.numInputs()) + " inputs"; });
    // Expand "..." into digit labels, right-aligned across operands.
    size_t ellipsis_rank = 0;
    for (size_t i = 0; i < terms.size(); ++i) {
        auto p = terms[i].find("...");
        if (p != std::string::npos) ellipsis_rank = std::max(ellipsis_rank, ctx.input(i).rank() - (terms[i].size() - 3));
    }
    std::string ell_labels;
    for (size_t k = 0; k < ellipsis_rank; ++k) ell_labels += static_cast<char>('0' + k);
    auto expand = [&](std::string t, size_t rank) {
        auto p = t.find("...");
        if (p == std::string::npos) return t;
        size_t n = rank - (t.size() - 3);
        return t.substr(0, p) + ell_labels.substr(ellipsis_rank - n) + t.substr(p + 3);
    };
    std::map<char, int64_t> size_of;
    std::map<char, int> count;
    for (size_t i = 0; i < terms.size(); ++i) {
        terms[i] = expand(terms[i], ctx.input(i).rank());
        ctx.require(terms[i].size() == ctx.input(i).rank(), [&] { return "operand " + std::to_string(i) + " has rank " + std::to_string(ctx.input(i).rank()) + " but term '" + terms[i] + "'"; });
        for (size_t d = 0; d < terms[i].size(); ++d) {
            char c = terms[i][d];
            int64_t n = ctx.input(i).dims()[d];
            auto it = size_of.find(c);
            if (it == size_of.end() || it->second == 1) size_of[c] = n;
            else ctx.require(n == 1 || n == it->second, [&] { return std::string("label '") + c + "' has inconsistent sizes"; });
            ++count[c];
        }
    }
    std::string out_term;
    if (arrow != std::string::npos) {
        out_term = eq.substr(arrow + 2);
        auto p = out_term.find("...");
        if (p != std::string::npos) out_term = out_term.substr(0, p) + ell_labels + out_term.substr(p + 3);
    } else {
        out_term = ell_labels;
        for (const auto& [c, n] : count)
            if (n == 1 && !(c >= '0' && c <= '9')) out_term += c;
    }
    std::string labels = out_term;
    for (const auto& [c, n] : size_of)
        if (out_term.find(c) == std::string::npos) labels += c;
    for (char c : out_term) ctx.require(size_of.count(c) != 0, [&] { return std::string("output label '") + c + "' appears in no operand"; });
    Dims out_dims;
    for (char c : out_term) out_dims.push_back(size_of[c]);
    Dims all_dims;
    for (char c : labels) all_dims.push_back(size_of[c]);
    // Per operand, the stride each label contributes (0 for broadcast dims).
    std::vector<std::vector<int64_t>> strides(terms.size(), std::vector<int64_t>(labels.size(), 0));
    for (size_t i = 0; i < terms.size(); ++i) {
        Dims s = stridesOf(ctx.input(i).dims());
        for (size_t d = 0; d < terms[i].size(); ++d)
            if (ctx.input(i).dims()[d] != 1) strides[i][labels.find(terms[i][d])] += s[d];
    }
    const Tensor& first = ctx.input(0);
    return {dispatchNumeric(first.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(first.dtype(), out_dims);
        const int64_t inner = numElements(Dims(all_dims.begin() + static_cast<int64_t>(out_term.size()), all_dims.end()));
        const int64_t total = numElements(all_dims);
        Dims idx(labels.size(), 0);
        for (int64_t flat = 0; flat < total; ++flat) {
            double prod = 1;
            for (size_t i = 0; i < terms.size(); ++i) {
                int64_t off = 0;
                for (size_t l = 0; l < labels.size(); ++l) off += idx[l] * strides[i][l];
                prod *= static_cast<double>(ctx.input(i).template data<T>()[off]);
            }
            T& dst = out.data<T>()[inner ? flat / inner : 0];
            dst = static_cast<T>(static_cast<double>(dst) + prod);
            for (int64_t d = static_cast<int64_t>(labels.size()) - 1; d >= 0; --d) {
                if (++idx[d] < all_dims[d]) break;
                idx[d] = 0;
            }
        }
        return out;
    })};
}

}  // namespace

void registerEinsumKernels(KernelRegistry& r) { r.add("Einsum", einsum); }

}  // namespace kiln
