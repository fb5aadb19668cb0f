#include "tuner/winner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>

#include "tuner/statistics.h"

namespace kiln {

namespace {

// A route re-measured in the interleaved rounds.
struct Contender {
    CandidateResult result;
    RoundSamples rounds;
    size_t changes = 0;  // parameters that differ from the default
};

size_t changesFromDefault(const std::string& route) {
    const BuildRoute def = BuildRoute::defaults(Builder::space());
    const BuildRoute r = BuildRoute::parse(route, Builder::space());  // alive through the loop
    size_t n = 0;
    for (const auto& [k, v] : r.values()) n += v != def.get(k);
    return n;
}

std::string intervalText(const Interval& i) {
    char text[96];
    std::snprintf(text, sizeof text, "%.3fx [%.3f, %.3f]", i.estimate, i.low, i.high);
    return text;
}

// The contenders: the fastest o.finalists, the default, and the single-parameter changes
// that moved the search-phase time most (the effects table), each once. Routes that built
// one engine are one contender, the route with the fewest changes (the default in its group).
std::vector<Contender> pickContenders(const TuneResult& result, const TunerOptions& o) {
    const std::string def = BuildRoute::defaults(Builder::space()).hash();
    std::map<std::string, const CandidateResult*> simplest;  // engine identity -> its route with the fewest changes
    for (const auto& c : result.candidates) {
        if (c.outcome != Outcome::Ok || c.engine_id.empty()) continue;
        const CandidateResult*& s = simplest[c.engine_id];
        if (!s || c.route_hash == def || (s->route_hash != def && changesFromDefault(c.route) < changesFromDefault(s->route))) s = &c;
    }
    std::vector<const CandidateResult*> ok;
    const CandidateResult* base = nullptr;
    for (const auto& c : result.candidates)
        if (c.outcome == Outcome::Ok && (c.engine_id.empty() || simplest[c.engine_id] == &c)) {
            ok.push_back(&c);
            if (c.route_hash == def) base = &c;
        }
    check(!ok.empty(), "no candidate passed the accuracy criterion (" + o.tolerance.text() + ")");
    std::stable_sort(ok.begin(), ok.end(), [](const auto* a, const auto* b) { return a->median_ms < b->median_ms; });
    std::vector<Contender> out;
    auto add = [&](const CandidateResult* c) {
        if (std::none_of(out.begin(), out.end(), [&](const Contender& k) { return k.result.route_hash == c->route_hash; }))
            out.push_back({*c, {}, changesFromDefault(c->route)});
    };
    for (size_t i = 0; i < ok.size() && i < o.finalists; ++i) add(ok[i]);
    if (base) add(base);
    if (base && base->median_ms > 0) {
        std::vector<const CandidateResult*> singles;
        for (const auto* c : ok)
            if (changesFromDefault(c->route) == 1) singles.push_back(c);
        auto moved = [&](const CandidateResult* c) { return std::fabs(std::log(c->median_ms / base->median_ms)); };
        std::stable_sort(singles.begin(), singles.end(), [&](const auto* a, const auto* b) { return moved(a) > moved(b); });
        for (size_t i = 0; i < singles.size() && i < o.effects; ++i) add(singles[i]);
    }
    return out;
}

// Rounds [first, first + count): every contender once per round, in turn.
void measureRounds(std::vector<Contender>& contenders, const Remeasure& remeasure, int first, int count) {
    for (int round = first; round < first + count; ++round)
        for (auto& c : contenders) c.rounds.push_back(remeasure(c.result, round));
}

// Why the rounds [first, end) cannot be trusted, "" when they can.
std::string noiseIn(const std::vector<Contender>& contenders, size_t first, const TunerOptions& o) {
    const double max_spread = o.max_spread;
    if (std::string load = o.machine_load ? o.machine_load() : ""; !load.empty()) return load;
    for (const auto& c : contenders)
        for (size_t r = first; r < c.rounds.size(); ++r)
            if (std::string why = unstableSamples(c.rounds[r], max_spread); !why.empty())
                return why + " in round " + std::to_string(r + 1) + " of " + BuildRoute::parse(c.result.route, Builder::space()).changesText(Builder::space());
    return "";
}

void verifyWinner(TuneResult& result, const TunerOptions& o, const MeasureFresh& fresh) {
    const BuildRoute def = BuildRoute::defaults(Builder::space()), win = BuildRoute::parse(result.best_route, Builder::space());
    RoundSamples base, cand;
    for (int i = 0; i < o.verify; ++i) {  // fresh builds, taking turns
        CandidateResult b = fresh(def), c = fresh(win);
        base.push_back(b.outcome == Outcome::Ok ? b.samples_ms : std::vector<double>{});
        cand.push_back(c.outcome == Outcome::Ok ? c.samples_ms : std::vector<double>{});
    }
    result.verification = speedupInterval(base, cand);
    result.verified = true;
    // The win holds when the fresh builds are faster beyond --min-gain and the reported
    // speedup lies within what they measure.
    result.win_held = result.verification.low >= 1 + o.min_gain && result.speedup <= result.verification.high;
    if (!result.win_held) {
        result.warnings.push_back("--verify: the win did not hold in " + std::to_string(o.verify) + " fresh builds (" + intervalText(result.verification) +
                                  " against the reported " + intervalText(result.speedup_interval) + "); keeping the default route");
        result.best_route = def.text();
        result.significant = false;
        result.speedup = 1.0;
    }
}

}  // namespace

void chooseWinner(TuneResult& result, const TunerOptions& o, const Remeasure& remeasure, const MeasureFresh& fresh) {
    const BuildRoute def = BuildRoute::defaults(Builder::space());
    std::vector<Contender> contenders = pickContenders(result, o);
    measureRounds(contenders, remeasure, 0, o.rounds);
    std::string noise = noiseIn(contenders, 0, o);
    if (!noise.empty()) {  // once more: a passing burst of load should not decide
        result.warnings.push_back("timing was noisy (" + noise + "); measuring the finalists again");
        measureRounds(contenders, remeasure, o.rounds, o.rounds);
        noise = noiseIn(contenders, static_cast<size_t>(o.rounds), o);
    }
    for (auto& c : contenders) {
        c.result.samples_ms.clear();
        for (const auto& r : c.rounds) c.result.samples_ms.insert(c.result.samples_ms.end(), r.begin(), r.end());
        summarizeSamples(c.result);
        c.result.measured_by = "local (interleaved re-measurement)";
    }
    contenders.erase(std::remove_if(contenders.begin(), contenders.end(), [](const auto& c) { return c.result.samples_ms.empty(); }), contenders.end());
    check(!contenders.empty(), "every finalist failed when re-measured");
    auto dflt = std::find_if(contenders.begin(), contenders.end(), [&](const auto& c) { return c.result.route_hash == def.hash(); });
    std::stable_sort(contenders.begin(), contenders.end(), [](const auto& a, const auto& b) { return a.result.median_ms < b.result.median_ms; });
    dflt = std::find_if(contenders.begin(), contenders.end(), [&](const auto& c) { return c.result.route_hash == def.hash(); });
    if (dflt == contenders.end()) {  // the default failed accuracy or crashed: the fastest accurate route wins
        for (const auto& c : contenders) result.finalists.push_back(c.result);
        result.best_route = contenders.front().result.route;
        result.significant = true;
        return;
    }
    for (auto& c : contenders) c.result.speedup = speedupInterval(dflt->rounds, c.rounds);
    result.default_result = dflt->result;
    for (const auto& c : contenders) {
        result.finalists.push_back(c.result);
        if (c.changes == 1) {
            const BuildRoute r = BuildRoute::parse(c.result.route, Builder::space());
            for (const auto& [k, v] : r.values())
                if (v != def.get(k))
                    result.effects.push_back({k, v, 1 / c.result.speedup.estimate, 1 / c.result.speedup.high, c.result.speedup.low > 0 ? 1 / c.result.speedup.low : INFINITY});
        }
    }
    std::sort(result.effects.begin(), result.effects.end(), [](const auto& a, const auto& b) { return a.relative_latency < b.relative_latency; });
    // Wins: intervals that clear --min-gain. Among the wins not significantly slower than the
    // best one, the fewest changes from the default.
    const Contender* best = nullptr;
    for (const auto& c : contenders)
        if (&c != &*dflt && c.result.speedup.low >= 1 + o.min_gain && (!best || c.result.speedup.estimate > best->result.speedup.estimate)) best = &c;
    const Contender* fastest = nullptr;
    for (const auto& c : contenders)
        if (&c != &*dflt && (!fastest || c.result.speedup.estimate > fastest->result.speedup.estimate)) fastest = &c;
    result.best_gain = fastest ? fastest->result.speedup.estimate - 1 : 0;
    if (best && !noise.empty()) {
        result.warnings.push_back("the machine stayed noisy (" + noise + "): keeping the default route; tune again on a quiet machine");
        best = nullptr;
    }
    result.noise = noise;
    if (!best) {
        result.best_route = def.text();
        result.significant = false;
        result.speedup = 1.0;
        result.speedup_interval = {};
        return;
    }
    const Contender* chosen = best;
    for (const auto& c : contenders)
        if (&c != &*dflt && c.result.speedup.low >= 1 + o.min_gain && c.result.speedup.high >= best->result.speedup.low &&
            (c.changes < chosen->changes || (c.changes == chosen->changes && c.result.speedup.estimate > chosen->result.speedup.estimate)))
            chosen = &c;
    result.best_route = chosen->result.route;
    result.significant = true;
    result.speedup = chosen->result.speedup.estimate;
    result.speedup_interval = chosen->result.speedup;
    if (o.verify > 0) verifyWinner(result, o, fresh);
}

}  // namespace kiln
