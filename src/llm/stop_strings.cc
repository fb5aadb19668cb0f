#include "llm/stop_strings.h"

#include <algorithm>

namespace kiln::llm {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
    for (const auto& s : stops_) longest_ = std::max(longest_, s.size());
}

std::string StopStringMatcher::add(const std::string& text) {
    if (stopped_) return "";
    pending_ += text;
    size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, pending_.find(s));
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = pending_.substr(0, first);
        pending_.clear();
        return out;
    }
    // Hold back the longest tail that some stop string begins with. A stop string starts on
    // a character boundary, so what is handed out stays whole characters.
    size_t hold = 0;
    for (size_t n = std::min(pending_.size(), longest_ ? longest_ - 1 : 0); n > 0 && hold == 0; --n)
        for (const auto& s : stops_)
            if (s.size() > n && pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
                hold = n;
                break;
            }
    std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
}

std::string StopStringMatcher::finish() {
    if (stopped_) return "";
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace kiln::llm
