// Runs each fuzz input in a forked child with a time limit and sorts the outcome: the work
// ran, it was refused with a kiln::Error (a clean error), it threw something else (an
// unclear error), it died on a signal (a crash), or it outlived the limit (a hang).
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <string>

namespace kiln::fuzz {

enum class Outcome { Ran, CleanError, UnclearError, Crash, Hang };

struct Tally {
    int64_t tried = 0, ran = 0, clean = 0, unclear = 0, crashes = 0, hangs = 0;
    void add(Outcome o);
    int64_t failures() const { return unclear + crashes + hangs; }
};

// `work` runs in the child; it returns normally when the input ran and throws otherwise.
// stdout and stderr of the child are discarded unless `verbose`.
Outcome runIsolated(const std::function<void()>& work, std::chrono::seconds limit, bool verbose, std::string* detail);

// The reliability table: one row per input kind, and a total.
std::string tallyTable(const std::map<std::string, Tally>& tallies);

}  // namespace kiln::fuzz
