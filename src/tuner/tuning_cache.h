// The tuning cache: an append-only JSON Lines file of measured candidates, keyed by model
// hash, target signature, Kiln version, measurement setup and route hash. A line from another
// model, target, version or setup is ignored; a corrupt line is skipped; both with a warning.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "tuner/candidate.h"

namespace kiln {

struct CacheKey {
    std::string model_hash, target, kiln_version;
    std::string setup;  // the objective, golden shapes and tolerance (tuner.cc measurementSetup)
};

class TuningCache {
public:
    // Loads `path` if it exists (when `resume`), otherwise starts it afresh.
    TuningCache(std::string path, CacheKey key, bool resume);
    const CandidateResult* find(const std::string& route_hash) const;
    // Appends one result and flushes it, so a killed tuner loses at most the candidate in flight.
    void append(const CandidateResult& r);
    const std::vector<std::string>& warnings() const { return warnings_; }
    size_t size() const { return entries_.size(); }

private:
    std::string path_;
    CacheKey key_;
    std::map<std::string, CandidateResult> entries_;
    std::vector<std::string> warnings_;
};

}  // namespace kiln
