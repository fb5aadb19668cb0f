// Tuning reports: JSON (everything), Markdown and HTML (with an SVG plot of the latency of
// every accurate candidate, the default marked).
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

nlohmann::json toJson(const TuneResult& r, const TunerOptions& o, const std::string& rebuild) {
    std::map<std::string, int> outcomes;
    for (const auto& c : r.candidates) ++outcomes[outcomeName(c.outcome)];
    nlohmann::json j = {{"model", o.model_path}, {"expression", r.expression}, {"strategy", r.strategy}, {"golden", r.golden_source},
                        {"tolerance", o.tolerance.text()}, {"outcomes", outcomes},
                        {"candidates_total", r.candidates.size()}, {"from_cache", r.from_cache}, {"budget_exhausted", r.budget_exhausted},
                        {"best_route", r.best_route}, {"best_changes", changes(r.best_route)}, {"best_gain", r.best_gain},
                        {"speedup_over_default", r.speedup}, {"significant", r.significant}, {"min_gain", o.min_gain}, {"rebuild_command", rebuild},
                        {"candidates", nlohmann::json::array()}, {"finalists", nlohmann::json::array()}, {"effects", nlohmann::json::array()}};
    for (const auto& c : r.candidates)
        j["candidates"].push_back({{"route_hash", c.route_hash}, {"changes", changes(c.route)}, {"outcome", outcomeName(c.outcome)},
                                   {"median_ms", c.median_ms}, {"spread", c.spread}, {"error", c.error}, {"message", c.message}, {"measured_by", c.measured_by}});
    for (const auto& f : r.finalists)
        j["finalists"].push_back({{"changes", changes(f.route)}, {"median_ms", f.median_ms}, {"spread", f.spread}, {"samples", f.samples_ms.size()}});
    for (const auto& e : r.effects) j["effects"].push_back({{"parameter", e.parameter}, {"value", e.value}, {"relative_latency", e.relative_latency}});
    return j;
}

std::string verdict(const TuneResult& r) {
    std::ostringstream s;
    if (r.significant) s << "speedup " << r.speedup << "x over the default route";
    else s << "no significant gain over the default (best finalist " << r.best_gain * 100 << "% faster, within noise or under --min-gain); the default is kept";
    return s.str();
}

std::string svgPlot(const TuneResult& r) {
    const BuildRoute def = BuildRoute::defaults(Builder::space());
    std::vector<std::pair<double, bool>> points;
    double lo = 1e300, hi = 0;
    for (const auto& c : r.candidates)
        if (c.outcome == Outcome::Ok) {
            points.emplace_back(c.median_ms, c.route_hash == def.hash());
            lo = std::min(lo, c.median_ms);
            hi = std::max(hi, c.median_ms);
        }
    const double W = 640, H = 280, pad = 40;
    std::ostringstream s;
    s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "'>\n";
    s << "<rect width='100%' height='100%' fill='white'/><text x='" << pad << "' y='20' font-size='13'>median latency (ms) of accurate candidates, in search order; red = default</text>\n";
    s << "<line x1='" << pad << "' y1='" << H - pad << "' x2='" << W - 10 << "' y2='" << H - pad << "' stroke='black'/>";
    s << "<line x1='" << pad << "' y1='30' x2='" << pad << "' y2='" << H - pad << "' stroke='black'/>\n";
    s << "<text x='2' y='" << H - pad << "' font-size='10'>" << lo << "</text><text x='2' y='36' font-size='10'>" << hi << "</text>\n";
    for (size_t i = 0; i < points.size(); ++i) {
        const double x = pad + (W - pad - 20) * (points.size() > 1 ? static_cast<double>(i) / static_cast<double>(points.size() - 1) : 0.5);
        const double y = (H - pad) - (H - pad - 40) * (hi > lo ? (points[i].first - lo) / (hi - lo) : 0.5);
        s << "<circle cx='" << x << "' cy='" << y << "' r='" << (points[i].second ? 6 : 3.5) << "' fill='" << (points[i].second ? "red" : "steelblue") << "'/>\n";
    }
    s << "</svg>\n";
    return s.str();
}

std::string tuneReportText(const TuneResult& r, const TunerOptions& o, const std::string& path) {
    std::ostringstream out;
    const std::string rebuild = "kiln build " + o.model_path + (o.policy.target == "cpu" ? "" : " --target " + o.policy.target) + " -o best.engine --route '" + changes(r.best_route) + "'";
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
            out << "<table border='1' cellpadding='3'><tr>";
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
    if (html) out << "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Kiln tuning report</title></head><body>\n";
    h(1, "Kiln tuning report");
    para("Model: " + o.model_path + ". Expression: " + r.expression + ". Strategy: " + r.strategy + ". Golden: " + r.golden_source + ". Tolerance: " + o.tolerance.text() + ".");
    std::vector<std::vector<std::string>> outcome_rows;
    for (const auto& [k, v] : j["outcomes"].items()) outcome_rows.push_back({k, std::to_string(v.get<int>())});
    h(2, "Candidates: " + std::to_string(r.candidates.size()) + " (" + std::to_string(r.from_cache) + " from the cache" + (r.budget_exhausted ? ", budget exhausted" : "") + ")");
    table({"outcome", "count"}, outcome_rows);
    h(2, "Result");
    para("Best route: " + changes(r.best_route) + " — " + verdict(r) + ".");
    para("Rebuild: " + rebuild);
    h(2, "Finalists (re-measured interleaved)");
    std::vector<std::vector<std::string>> fin;
    for (const auto& f : r.finalists) fin.push_back({changes(f.route), num(f.median_ms), num(f.spread * 100) + "%", std::to_string(f.samples_ms.size())});
    table({"route", "median ms", "spread (p90-p10)/median", "samples"}, fin);
    h(2, "Which parameters mattered (one change from the default)");
    std::vector<std::vector<std::string>> eff;
    for (const auto& e : r.effects) eff.push_back({e.parameter + "=" + e.value, num(e.relative_latency) + "x"});
    table({"change", "latency vs default"}, eff);
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
