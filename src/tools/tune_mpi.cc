#include "tools/tune_mpi.h"

#include <unistd.h>

#include <cstdlib>

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
}

MpiTuning::~MpiTuning() {
    if (rank_ == 0)
        for (int r = 1; r < size_; ++r) sendText("", r, kTagStop);
    MPI_Finalize();
}

std::vector<CandidateResult> MpiTuning::dispatch(const std::vector<BuildRoute>& routes) {
    std::vector<CandidateResult> results(routes.size());
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < routes.size(); ++i) index[routes[i].hash()] = i;
    size_t next = 0, pending = 0;
    for (int worker = 1; worker < size_ && next < routes.size(); ++worker, ++pending) sendText(routes[next++].text(), worker, kTagWork);
    while (pending > 0) {
        MPI_Status status;
        CandidateResult r = candidateFromJson(receiveText(MPI_ANY_SOURCE, kTagResult, &status));
        --pending;
        if (auto it = index.find(r.route_hash); it != index.end()) results[it->second] = r;
        if (next < routes.size()) {  // dynamic: the worker that answered gets the next route
            sendText(routes[next++].text(), status.MPI_SOURCE, kTagWork);
            ++pending;
        }
    }
    return results;
}

void MpiTuning::serve(const TunerOptions& options) {
    runTuneWorker(
        options,
        [&](std::string* route) {
            MPI_Status status;
            waitFor(0, MPI_ANY_TAG, &status);
            *route = receiveText(0, status.MPI_TAG, &status);
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
std::vector<CandidateResult> MpiTuning::dispatch(const std::vector<BuildRoute>&) { return {}; }
void MpiTuning::serve(const TunerOptions&) {}

#endif

}  // namespace kiln::tools
