// Tuning reports: JSON (everything), Markdown and HTML (with an SVG plot of the latency of
// every accurate candidate, the default marked).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ir/file_write.h"

#include "engine/builder.h"
#include "tuner/tuner.h"

namespace kiln {

namespace {

std::string changes(const std::string& route_text) { return BuildRoute::parse(route_text, Builder::space()).changesText(Builder::space()); }

std::string escapeHtml(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<') out += "&lt;";
        else if (c == '>') out += "&gt;";
        else if (c == '&') out += "&amp;";
        else out += c;
    }
    return out;
}

nlohmann::json interval(const Interval& i) { return {{"estimate", i.estimate}, {"low", i.low}, {"high", i.high}}; }

std::string intervalText(double estimate, double low, double high) {
    std::ostringstream s;
    s.precision(3);
    s << estimate << "x [" << low << ", " << high << "]";
    return s.str();
}

// Dims as a --*Shapes flag writes them: 1x3x224x224.
std::string shapeFlag(const Dims& d) {
    std::string s;
    for (size_t i = 0; i < d.size(); ++i) {
        if (i) s += 'x';
        s += std::to_string(d[i]);
    }
    return s;
}

nlohmann::json toJson(const TuneResult& r, const TunerOptions& o, const std::string& rebuild) {
    std::map<std::string, int> outcomes;
    for (const auto& c : r.candidates) ++outcomes[outcomeName(c.outcome)];
    nlohmann::json j = {{"model", o.model_path}, {"expression", r.expression}, {"strategy", r.strategy}, {"golden", r.golden_source},
                        {"objective", o.objective}, {"tolerance", o.tolerance.text()}, {"outcomes", outcomes},
                        {"candidates_total", r.candidates.size()}, {"from_cache", r.from_cache}, {"budget_exhausted", r.budget_exhausted},
                        {"best_route", r.best_route}, {"best_changes", changes(r.best_route)}, {"best_gain", r.best_gain},
                        {"speedup_over_default", r.speedup}, {"speedup_interval", interval(r.speedup_interval)}, {"significant", r.significant},
                        {"min_gain", o.min_gain}, {"noise", r.noise}, {"warnings", r.warnings}, {"rebuild_command", rebuild},
                        {"candidates", nlohmann::json::array()}, {"finalists", nlohmann::json::array()}, {"effects", nlohmann::json::array()}};
    if (r.verified) j["verification"] = {{"rounds", o.verify}, {"speedup", interval(r.verification)}, {"win_held", r.win_held}};
    for (const auto& c : r.candidates) {
        j["candidates"].push_back({{"route_hash", c.route_hash}, {"changes", changes(c.route)}, {"outcome", outcomeName(c.outcome)},
                                   {"median_ms", c.median_ms}, {"spread", c.spread}, {"error", c.error}, {"message", c.message}, {"measured_by", c.measured_by}});
        if (!c.engine_id.empty()) j["candidates"].back()["engine_id"] = c.engine_id;
        if (!c.same_engine_as.empty()) j["candidates"].back()["same_engine_as"] = c.same_engine_as;  // not timed: that route's samples
    }
    for (const auto& f : r.finalists)
        j["finalists"].push_back({{"changes", changes(f.route)}, {"median_ms", f.median_ms}, {"spread", f.spread}, {"samples", f.samples_ms.size()},
                                  {"speedup", interval(f.speedup)}});
    for (const auto& e : r.effects)
        j["effects"].push_back({{"parameter", e.parameter}, {"value", e.value}, {"relative_latency", e.relative_latency}, {"low", e.low}, {"high", e.high}});
    return j;
}

std::string verdict(const TuneResult& r) {
    std::ostringstream s;
    const Interval& i = r.speedup_interval;
    if (r.significant) s << "speedup " << intervalText(i.estimate, i.low, i.high) << " over the default route (95% interval)";
    else if (!r.noise.empty()) s << "the timing stayed noisy (" << r.noise << "); the default is kept";
    else s << "no significant gain over the default (best finalist " << r.best_gain * 100 << "% faster, its interval not clear of --min-gain); the default is kept";
    if (r.verified)
        s << "; --verify: " << intervalText(r.verification.estimate, r.verification.low, r.verification.high) << " in fresh builds, the win "
          << (r.win_held ? "held" : "did not hold");
    return s.str();
}

// Log-scaled latency (candidates span orders of magnitude: a linear axis puts them all on
// the floor), ticks at 1-2-5 steps, each point with a tooltip naming its route.
std::string svgPlot(const TuneResult& r) {
    const BuildRoute def = BuildRoute::defaults(Builder::space());
    struct Point {
        double ms;
        bool is_default;
        std::string label;
    };
    std::vector<Point> points;
    double lo = 1e300, hi = 0;
    for (const auto& c : r.candidates)
        if (c.outcome == Outcome::Ok && c.median_ms > 0) {
            points.push_back({c.median_ms, c.route_hash == def.hash(), changes(c.route)});
            lo = std::min(lo, c.median_ms);
            hi = std::max(hi, c.median_ms);
        }
    if (points.empty()) return "<p>No accurate candidate to plot.</p>\n";
    const double llo = std::log10(lo) - 0.05, lhi = std::log10(std::max(hi, lo * 1.01)) + 0.05;
    const double W = 720, H = 320, left = 70, bottom = 50, top = 30;
    auto yOf = [&](double ms) { return (H - bottom) - (H - bottom - top) * (std::log10(ms) - llo) / (lhi - llo); };
    std::ostringstream s;
    s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif'>\n";
    s << "<rect width='100%' height='100%' fill='white'/><text x='" << left << "' y='18' font-size='13'>median latency of accurate candidates (log scale); red = default</text>\n";
    s << "<line x1='" << left << "' y1='" << H - bottom << "' x2='" << W - 10 << "' y2='" << H - bottom << "' stroke='black'/>";
    s << "<line x1='" << left << "' y1='" << top << "' x2='" << left << "' y2='" << H - bottom << "' stroke='black'/>\n";
    for (int e = static_cast<int>(std::floor(llo)); e <= static_cast<int>(std::ceil(lhi)); ++e)
        for (double m : {1.0, 2.0, 5.0}) {
            const double v = m * std::pow(10.0, e);
            if (std::log10(v) < llo || std::log10(v) > lhi) continue;
            const double y = yOf(v);
            s << "<line x1='" << left - 4 << "' y1='" << y << "' x2='" << W - 10 << "' y2='" << y << "' stroke='#ddd'/>";
            s << "<text x='" << left - 8 << "' y='" << y + 4 << "' font-size='11' text-anchor='end'>" << v << " ms</text>\n";
        }
    s << "<text x='" << (left + W) / 2 << "' y='" << H - 12 << "' font-size='12' text-anchor='middle'>candidate, in search order (1 to " << points.size() << ")</text>\n";
    for (size_t i = 0; i < points.size(); ++i) {
        const double x = left + 10 + (W - left - 30) * (points.size() > 1 ? static_cast<double>(i) / static_cast<double>(points.size() - 1) : 0.5);
        s << "<circle cx='" << x << "' cy='" << yOf(points[i].ms) << "' r='" << (points[i].is_default ? 6 : 3.5) << "' fill='"
          << (points[i].is_default ? "red" : "steelblue") << "'><title>#" << i + 1 << " " << escapeHtml(points[i].label) << ": " << points[i].ms
          << " ms</title></circle>\n";
    }
    s << "</svg>\n";
    return s.str();
}

std::string tuneReportText(const TuneResult& r, const TunerOptions& o, const std::string& path) {
    std::ostringstream out;
    std::string rebuild = "kiln build " + o.model_path + (o.policy.target == "cpu" ? "" : " --target " + o.policy.target) + " -o best.engine --route '" + changes(r.best_route) + "'";
    if (!o.calib_path.empty()) rebuild += " --calib " + o.calib_path;
    for (const auto& [name, range] : o.policy.profile)
        rebuild += " --minShapes " + name + ":" + shapeFlag(range.min) + " --optShapes " + name + ":" + shapeFlag(range.opt) + " --maxShapes " + name + ":" + shapeFlag(range.max);
    const std::string ext = std::filesystem::path(path).extension().string();
    const nlohmann::json j = toJson(r, o, rebuild);
    if (ext == ".json") {
        out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return out.str();
    }
    check(ext == ".md" || ext == ".html", "--report: use a .json, .md or .html file name, got " + path);
    const bool html = ext == ".html";
    auto h = [&](int level, const std::string& text) {
        if (html) out << "<h" << level << ">" << escapeHtml(text) << "</h" << level << ">\n";
        else out << std::string(static_cast<size_t>(level), '#') << " " << text << "\n\n";
    };
    auto para = [&](const std::string& text) { out << (html ? "<p>" + escapeHtml(text) + "</p>\n" : text + "\n\n"); };
    auto table = [&](const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
        if (html) {
            out << "<table><tr>";
            for (const auto& c : head) out << "<th>" << escapeHtml(c) << "</th>";
            out << "</tr>\n";
            for (const auto& row : rows) {
                out << "<tr>";
                for (const auto& c : row) out << "<td>" << escapeHtml(c) << "</td>";
                out << "</tr>\n";
            }
            out << "</table>\n";
            return;
        }
        out << "|";
        for (const auto& c : head) out << " " << c << " |";
        out << "\n|";
        for (size_t i = 0; i < head.size(); ++i) out << "---|";
        out << "\n";
        for (const auto& row : rows) {
            out << "|";
            for (const auto& c : row) out << " " << c << " |";
            out << "\n";
        }
        out << "\n";
    };
    auto num = [](double v) {
        std::ostringstream s;
        s.precision(4);
        s << v;
        return s.str();
    };
    if (html)
        out << "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Kiln tuning report</title><style>"
               "body{font-family:sans-serif;max-width:1100px;margin:auto} table{border-collapse:collapse;table-layout:fixed;width:100%} "
               "td,th{border:1px solid #999;padding:3px;overflow-wrap:anywhere;font-size:13px}</style></head><body>\n";
    h(1, "Kiln tuning report");
    para("Model: " + o.model_path + ". Expression: " + r.expression + ". Strategy: " + r.strategy + ". Golden: " + r.golden_source + ". Tolerance: " + o.tolerance.text() + ".");
    std::vector<std::vector<std::string>> outcome_rows;
    for (const auto& [k, v] : j["outcomes"].items()) outcome_rows.push_back({k, std::to_string(v.get<int>())});
    h(2, "Candidates: " + std::to_string(r.candidates.size()) + " (" + std::to_string(r.from_cache) + " from the cache" + (r.budget_exhausted ? ", budget exhausted" : "") + ")");
    table({"outcome", "count"}, outcome_rows);
    h(2, "Result");
    para("Best route: " + changes(r.best_route) + " — " + verdict(r) + ".");
    para("Rebuild: " + rebuild);
    for (const auto& w : r.warnings) para("Warning: " + w);
    h(2, "Finalists (re-measured in " + std::to_string(o.rounds) + " interleaved rounds)");
    std::vector<std::vector<std::string>> fin;
    for (const auto& f : r.finalists)
        fin.push_back({changes(f.route), num(f.median_ms), intervalText(f.speedup.estimate, f.speedup.low, f.speedup.high), num(f.spread * 100) + "%",
                       std::to_string(f.samples_ms.size())});
    table({"route", "median ms", "speedup over default [95% interval]", "spread (p90-p10)/median", "samples"}, fin);
    h(2, "Which parameters mattered (one change from the default, re-measured)");
    std::vector<std::vector<std::string>> eff;
    for (const auto& e : r.effects) eff.push_back({e.parameter + "=" + e.value, intervalText(e.relative_latency, e.low, e.high)});
    table({"change", "latency vs default [95% interval]"}, eff);
    if (html) {
        h(2, "Latency of accurate candidates");
        out << svgPlot(r);
    }
    h(2, "All candidates");
    std::vector<std::vector<std::string>> all;
    for (const auto& c : r.candidates) all.push_back({changes(c.route), outcomeName(c.outcome), num(c.median_ms), num(c.error), c.measured_by, c.message});
    table({"route", "outcome", "median ms", "error", "measured by", "note"}, all);
    if (html) out << "</body></html>\n";
    return out.str();
}

}  // namespace

void writeTuneReport(const TuneResult& r, const TunerOptions& o, const std::string& path) { writeFileAtomically(path, tuneReportText(r, o, path)); }

}  // namespace kiln
