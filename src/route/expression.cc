#include "route/expression.h"

#include <map>
#include <memory>
#include <random>
#include <set>

#include "ir/error.h"

namespace kiln {

namespace {

constexpr size_t kMaxRoutes = 1000000;
using Partial = std::map<std::string, std::string>;

struct Union;
struct Term {
    enum Kind { Default, Assign, Group, Random, OneAtATime } kind = Default;
    std::string glob;
    std::vector<std::string> values;  // {"*"} for every allowed value
    std::shared_ptr<Union> group;
    size_t count = 0;
    size_t column = 0;
};
struct Cross {
    std::vector<Term> terms;
};
struct Union {
    std::vector<Cross> crosses;
};

class Parser {
public:
    explicit Parser(const std::string& text) : s_(text) {}

    Union parse() {
        Union u = parseUnion();
        skipSpace();
        if (pos_ < s_.size()) fail("unexpected '" + std::string(1, s_[pos_]) + "'");
        return u;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw Error("route expression '" + s_ + "', column " + std::to_string(pos_ + 1) + ": " + what);
    }
    void skipSpace() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
    }
    static bool wordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '*' || c == ':'; }
    std::string word() {
        size_t start = pos_;
        while (pos_ < s_.size() && wordChar(s_[pos_])) ++pos_;
        return s_.substr(start, pos_ - start);
    }

    Union parseUnion() {
        Union u;
        u.crosses.push_back(parseCross());
        while (true) {
            skipSpace();
            if (pos_ < s_.size() && s_[pos_] == '|') {
                ++pos_;
                u.crosses.push_back(parseCross());
            } else {
                return u;
            }
        }
    }

    Cross parseCross() {
        Cross c;
        while (true) {
            skipSpace();
            if (pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')') break;
            c.terms.push_back(parseTerm());
        }
        if (c.terms.empty()) fail("expected a term (name=value, default, random:N, one-at-a-time or '(')");
        return c;
    }

    Term parseTerm() {
        Term t;
        t.column = pos_ + 1;
        if (s_[pos_] == '(') {
            ++pos_;
            t.kind = Term::Group;
            t.group = std::make_shared<Union>(parseUnion());
            skipSpace();
            if (pos_ >= s_.size() || s_[pos_] != ')') fail("expected ')'");
            ++pos_;
            return t;
        }
        std::string w = word();
        if (w.empty()) fail("unexpected '" + std::string(1, s_[pos_]) + "'");
        if (w == "default") return t;
        if (w == "one-at-a-time") {
            t.kind = Term::OneAtATime;
            return t;
        }
        if (w.rfind("random:", 0) == 0) {
            t.kind = Term::Random;
            const std::string n = w.substr(7);
            if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 7 || std::stoul(n) == 0)
                fail("random:N needs a positive count, got '" + w + "'");
            t.count = std::stoul(n);
            return t;
        }
        if (pos_ >= s_.size() || s_[pos_] != '=') fail("expected '=' after '" + w + "'");
        ++pos_;
        t.kind = Term::Assign;
        t.glob = w;
        if (pos_ < s_.size() && s_[pos_] == '[') {
            ++pos_;
            while (true) {
                skipSpace();
                std::string v = word();
                if (v.empty()) fail("expected a value");
                t.values.push_back(v);
                skipSpace();
                if (pos_ < s_.size() && s_[pos_] == ',') {
                    ++pos_;
                    continue;
                }
                if (pos_ < s_.size() && s_[pos_] == ']') {
                    ++pos_;
                    break;
                }
                fail("expected ',' or ']'");
            }
        } else {
            std::string v = word();
            if (v.empty()) fail("expected a value after '='");
            t.values.push_back(v);
        }
        return t;
    }

    const std::string& s_;
    size_t pos_ = 0;
};

class Expander {
public:
    Expander(const ParameterSpace& space, uint64_t seed) : space_(space), rng_(seed) {}

    std::vector<Partial> evalUnion(const Union& u) {
        std::vector<Partial> out;
        for (const auto& c : u.crosses) {
            auto part = evalCross(c);
            out.insert(out.end(), part.begin(), part.end());
            checkSize(out.size());
        }
        return out;
    }

private:
    static void checkSize(size_t n) {
        check(n <= kMaxRoutes, "route expression expands to more than " + std::to_string(kMaxRoutes) + " routes; narrow it or use random:N");
    }

    // Parameter -> candidate values of one assignment term.
    std::vector<std::pair<std::string, std::vector<std::string>>> domainOf(const Term& t) {
        auto params = space_.match(t.glob);
        if (params.empty()) {
            if (t.glob.find('*') == std::string::npos) space_.get(t.glob);  // throws with suggestions
            throw Error("route expression: '" + t.glob + "' (column " + std::to_string(t.column) + ") matches no parameter");
        }
        std::vector<std::pair<std::string, std::vector<std::string>>> out;
        for (const ParameterSpec* p : params) {
            std::vector<std::string> values;
            if (t.values.size() == 1 && t.values[0] == "*") {
                values = p->values;
            } else {
                for (const auto& v : t.values) {
                    bool ok = false;
                    for (const auto& a : p->values) ok |= a == v;
                    // With a glob, a value only some matches allow applies to those.
                    if (ok) values.push_back(v);
                    else if (params.size() == 1) BuildRoute::defaults(space_).set(p->name, v, space_);  // throws with the allowed list
                }
            }
            if (!values.empty()) out.emplace_back(p->name, values);
        }
        check(!out.empty(), "route expression: no parameter matching '" + t.glob + "' allows the given values");
        return out;
    }

    static std::vector<Partial> crossWith(const std::vector<Partial>& a, const std::vector<Partial>& b) {
        std::vector<Partial> out;
        checkSize(a.size() * b.size());
        for (const auto& x : a)
            for (const auto& y : b) {
                Partial m = x;
                for (const auto& [k, v] : y) m[k] = v;
                out.push_back(std::move(m));
            }
        return out;
    }

    std::vector<Partial> evalTerm(const Term& t) {
        if (t.kind == Term::Default) return {Partial{}};
        if (t.kind == Term::Group) return evalUnion(*t.group);
        std::vector<Partial> out = {Partial{}};
        for (const auto& [name, values] : domainOf(t)) {
            std::vector<Partial> choices;
            for (const auto& v : values) choices.push_back(Partial{{name, v}});
            out = crossWith(out, choices);
        }
        return out;
    }

    std::vector<Partial> evalCross(const Cross& c) {
        const Term* strategy = nullptr;
        for (const auto& t : c.terms)
            if (t.kind == Term::Random || t.kind == Term::OneAtATime) {
                check(!strategy, "route expression: only one strategy term (random:N, one-at-a-time) per product");
                strategy = &t;
            }
        if (!strategy) {
            std::vector<Partial> out = {Partial{}};
            for (const auto& t : c.terms) out = crossWith(out, evalTerm(t));
            return out;
        }
        // Strategy: its domain is the assignment terms' parameters and values.
        std::vector<std::pair<std::string, std::vector<std::string>>> domain;
        for (const auto& t : c.terms) {
            if (&t == strategy || t.kind == Term::Default) continue;
            check(t.kind == Term::Assign, "route expression: column " + std::to_string(t.column) + ": a strategy combines only with name=values terms");
            for (auto& d : domainOf(t)) domain.push_back(d);
        }
        if (domain.empty())
            for (const auto& p : space_.parameters())
                if (!p.hidden) domain.emplace_back(p.name, p.values);
        std::vector<Partial> out;
        if (strategy->kind == Term::OneAtATime) {
            out.push_back(Partial{});
            for (const auto& [name, values] : domain)
                for (const auto& v : values)
                    if (v != space_.get(name).default_value) out.push_back(Partial{{name, v}});
            return out;
        }
        // random:N — N draws (distinct where possible) with a seeded generator.
        double combos = 1;
        for (const auto& d : domain) combos *= static_cast<double>(d.second.size());
        std::set<Partial> seen;
        const size_t want = static_cast<size_t>(std::min<double>(static_cast<double>(strategy->count), combos));
        for (size_t attempts = 0; out.size() < want && attempts < 100 * want + 100; ++attempts) {
            Partial p;
            for (const auto& [name, values] : domain) p[name] = values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng_)];
            if (seen.insert(p).second) out.push_back(p);
        }
        return out;
    }

    const ParameterSpace& space_;
    std::mt19937_64 rng_;
};

}  // namespace

ExpandedRoutes expandRouteExpression(const std::string& expr, const ParameterSpace& space, uint64_t seed) {
    Union ast = Parser(expr).parse();
    std::vector<Partial> partials = Expander(space, seed).evalUnion(ast);
    ExpandedRoutes result;
    result.generated = partials.size();
    std::set<std::string> seen;
    for (const auto& p : partials) {
        BuildRoute r = BuildRoute::defaults(space);
        for (const auto& [k, v] : p) r.set(k, v, space);
        if (seen.insert(r.text()).second) result.routes.push_back(r);
    }
    return result;
}

}  // namespace kiln
