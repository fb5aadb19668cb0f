// The targets Kiln builds for, in the order `--help` lists them. A new target is one line here.
#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "ir/error.h"

namespace kiln {

namespace {
const std::vector<const Backend*>& registered() {
    static const std::vector<const Backend*> all = {&cpuBackend(), &cudaBackend()};
    return all;
}
}  // namespace

const Backend& backendFor(const std::string& target) {
    const std::string kind = target.substr(0, target.find('/'));
    for (const Backend* b : registered())
        if (b->name() == kind) return *b;
    std::string known;
    for (const auto& n : backendNames()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown target '" + target + "' (targets: " + known + ")");
}

std::vector<std::string> backendNames() {
    std::vector<std::string> names;
    for (const Backend* b : registered()) names.push_back(b->name());
    return names;
}

std::vector<ParameterSpec> backendParameters() {
    std::vector<ParameterSpec> all;
    for (const Backend* b : registered())
        for (auto& p : b->parameters()) all.push_back(std::move(p));
    return all;
}

}  // namespace kiln
