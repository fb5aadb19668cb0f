#include "tuner/tuning_cache.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ir/file_write.h"

namespace kiln {

TuningCache::TuningCache(std::string path, CacheKey key, bool resume) : path_(std::move(path)), key_(std::move(key)) {
    if (path_.empty()) return;
    if (!resume) {
        writeFileAtomically(path_, "");
        return;
    }
    std::ifstream in(path_);
    if (!in.good()) return;
    std::string line;
    size_t number = 0, foreign = 0;
    while (std::getline(in, line)) {
        ++number;
        if (line.empty()) continue;
        try {
            auto j = nlohmann::json::parse(line);
            if (j.at("model_hash") != key_.model_hash || j.at("target") != key_.target || j.at("kiln_version") != key_.kiln_version ||
                j.value("setup", "") != key_.setup) {
                ++foreign;
                continue;
            }
            CandidateResult r = candidateFromJson(line);
            entries_[r.route_hash] = r;
        } catch (const std::exception&) {
            warnings_.push_back(path_ + ": line " + std::to_string(number) + " is corrupt; skipped");
        }
    }
    if (foreign) warnings_.push_back(path_ + ": " + std::to_string(foreign) + " entries are for another model, target, Kiln version or measurement setup (objective, shapes, tolerance); ignored");
}

const CandidateResult* TuningCache::find(const std::string& route_hash) const {
    auto it = entries_.find(route_hash);
    return it == entries_.end() ? nullptr : &it->second;
}

void TuningCache::append(const CandidateResult& r) {
    entries_[r.route_hash] = r;
    if (path_.empty()) return;
    appendToFile(path_, candidateToJson(r, {{"model_hash", key_.model_hash}, {"target", key_.target}, {"kiln_version", key_.kiln_version}, {"setup", key_.setup}}) + "\n");
}

}  // namespace kiln
