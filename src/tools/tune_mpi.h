// Distributed tuning over MPI: under `mpirun -np N kiln tune ...`, rank 0 runs the search and
// hands candidates out dynamically to ranks 1..N-1, which build, validate and time them;
// results stream back to rank 0, which alone writes the cache and the report and re-measures
// the finalists itself so that the timings it compares come from one place.
#pragma once
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
    // Rank 0: evaluates the routes on the workers, in the routes' order.
    std::vector<CandidateResult> dispatch(const std::vector<BuildRoute>& routes);
    // Ranks > 0: serve candidates until rank 0 says stop.
    void serve(const TunerOptions& options);

private:
    int rank_ = 0, size_ = 1;
};

}  // namespace kiln::tools
