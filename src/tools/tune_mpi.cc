#include "tools/tune_mpi.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <map>

#ifdef KILN_WITH_MPI
#include <mpi.h>
#endif

namespace kiln::tools {

namespace {
constexpr int kTagWork = 1, kTagResult = 2, kTagStop = 3;
}

bool launchedUnderMpi() {
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
        if (const char* v = std::getenv(var); v && std::atoi(v) > 1) return true;
    return false;
}

#ifdef KILN_WITH_MPI

namespace {
void sendText(const std::string& text, int to, int tag) { MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, to, tag, MPI_COMM_WORLD); }

// Waits for a message without spinning: idle ranks must not steal the cores the others time on.
void waitFor(int from, int tag, MPI_Status* status) {
    int ready = 0;
    while (true) {
        MPI_Iprobe(from, tag, MPI_COMM_WORLD, &ready, status);
        if (ready) return;
        usleep(2000);
    }
}

std::string receiveText(int from, int tag, MPI_Status* status) {
    waitFor(from, tag, status);
    int n = 0;
    MPI_Get_count(status, MPI_CHAR, &n);
    std::string text(static_cast<size_t>(n), '\0');
    MPI_Recv(text.data(), n, MPI_CHAR, status->MPI_SOURCE, status->MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return text;
}
}  // namespace

MpiTuning::MpiTuning() {
    // Candidates run in forked children (which never call MPI): silence Open MPI's fork notice.
    setenv("OMPI_MCA_mpi_warn_on_fork", "0", 0);
    MPI_Init(nullptr, nullptr);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    dead_.assign(static_cast<size_t>(size_), false);
}

MpiTuning::~MpiTuning() {
    // With a dead rank, MPI_Finalize can wait for it forever: the live ranks leave without it
    // (mpirun --enable-recovery accepts that), after rank 0 has written everything.
    const bool any_dead = std::find(dead_.begin(), dead_.end(), true) != dead_.end();
    if (rank_ == 0)
        for (int r = 1; r < size_; ++r)
            if (!dead_[static_cast<size_t>(r)]) sendText(any_dead ? "abandon" : "", r, kTagStop);
    if (any_dead || abandon_) {
        std::fflush(nullptr);
        _exit(0);
    }
    MPI_Finalize();
}

std::vector<CandidateResult> MpiTuning::dispatch(const std::vector<BuildRoute>& routes, const MeasurePolicy& policy) {
    using Clock = std::chrono::steady_clock;
    std::vector<CandidateResult> results(routes.size());
    std::map<int, std::pair<size_t, Clock::time_point>> busy;  // worker -> (route index, sent at)
    const auto silence = std::chrono::duration<double>(policy.timeout_s + 10.0);
    size_t next = 0;
    auto assign = [&](int worker) {
        if (next >= routes.size()) return;
        busy[worker] = {next, Clock::now()};
        sendText(routes[next++].text(), worker, kTagWork);
    };
    for (int w = 1; w < size_; ++w)
        if (!dead_[static_cast<size_t>(w)]) assign(w);
    while (!busy.empty()) {
        int ready = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, kTagResult, MPI_COMM_WORLD, &ready, &status);
        if (ready) {
            CandidateResult r = candidateFromJson(receiveText(status.MPI_SOURCE, kTagResult, &status));
            auto it = busy.find(status.MPI_SOURCE);
            if (it != busy.end()) {
                results[it->second.first] = r;
                busy.erase(it);
            }
            assign(status.MPI_SOURCE);
            continue;
        }
        for (auto it = busy.begin(); it != busy.end();) {
            if (Clock::now() - it->second.second < silence) {
                ++it;
                continue;
            }
            CandidateResult& r = results[it->second.first];  // the candidate in flight is lost
            r.route = routes[it->second.first].text();
            r.route_hash = routes[it->second.first].hash();
            r.outcome = Outcome::Crash;
            r.message = "MPI rank " + std::to_string(it->first) + " stopped answering (presumed dead); its candidate is lost";
            r.measured_by = "rank " + std::to_string(it->first);
            dead_[static_cast<size_t>(it->first)] = true;
            it = busy.erase(it);
        }
        usleep(2000);
    }
    return results;  // routes from `next` on: no live worker left
}

void MpiTuning::serve(const TunerOptions& options) {
    // Fault-injection for the distributed test: KILN_DEBUG_KILL_RANK=R makes rank R die on
    // receiving its second candidate.
    const char* kill_rank = std::getenv("KILN_DEBUG_KILL_RANK");
    int received = 0;
    runTuneWorker(
        options,
        [&](std::string* route) {
            MPI_Status status;
            waitFor(0, MPI_ANY_TAG, &status);
            *route = receiveText(0, status.MPI_TAG, &status);
            if (status.MPI_TAG == kTagStop && *route == "abandon") abandon_ = true;
            if (status.MPI_TAG == kTagWork && ++received == 2 && kill_rank && std::atoi(kill_rank) == rank_) raise(SIGKILL);
            return status.MPI_TAG == kTagWork;
        },
        [&](const CandidateResult& r) {
            CandidateResult tagged = r;
            tagged.measured_by = "rank " + std::to_string(rank_);
            sendText(candidateToJson(tagged), 0, kTagResult);
        });
}

#else

MpiTuning::MpiTuning() { throw Error("kiln tune was started under MPI, but this kiln was built without MPI (install libopenmpi-dev and rebuild)"); }
MpiTuning::~MpiTuning() = default;
std::vector<CandidateResult> MpiTuning::dispatch(const std::vector<BuildRoute>&, const MeasurePolicy&) { return {}; }
void MpiTuning::serve(const TunerOptions&) {}

#endif

}  // namespace kiln::tools
