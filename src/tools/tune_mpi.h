// Distributed tuning over MPI: under `mpirun -np N kiln tune ...`, rank 0 runs the search and
// hands candidates out dynamically to ranks 1..N-1, which build, validate and time them;
// results stream back to rank 0, which alone writes the cache and the report and re-measures
// the finalists itself so that the timings it compares come from one place.
#pragma once
#include <functional>
#include <memory>

#include "tuner/tuner.h"

namespace kiln::tools {

// True when this process was started by an MPI launcher with more than one rank.
bool launchedUnderMpi();

class MpiTuning {
public:
    MpiTuning();  // MPI_Init
    ~MpiTuning(); // stops the workers (rank 0) and MPI_Finalize
    int rank() const { return rank_; }
    int size() const { return size_; }
    // Rank 0: evaluates the routes on the workers, in the routes' order. A worker silent for
    // longer than the candidate time limit (plus a margin) is taken for dead: its candidate in
    // flight is recorded as a crash and it gets no more work. Runs under `mpirun
    // --enable-recovery` survive such a death. Routes no live worker took come back empty
    // (no route hash): the search then evaluates them on rank 0.
    std::vector<CandidateResult> dispatch(const std::vector<BuildRoute>& routes, const MeasurePolicy& policy);
    // Ranks > 0: serve candidates until rank 0 says stop.
    void serve(const TunerOptions& options);

private:
    int rank_ = 0, size_ = 1;
    std::vector<bool> dead_;
    bool abandon_ = false;  // a worker told that a rank died: leave without MPI_Finalize
};

}  // namespace kiln::tools
