// The targets Kiln builds for, in the order `--help` lists them. A new target is one line here.
#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/reference/reference_backend.h"
#include "ir/error.h"

namespace kiln {

namespace {
const std::vector<const Backend*>& registered() {
    static const std::vector<const Backend*> all = {&cpuBackend(), &cudaBackend(), &referenceBackend()};
    return all;
}
}  // namespace

const Backend& backendFor(const std::string& target) {
    const std::string kind = target.substr(0, target.find('/'));
    for (const Backend* b : registered())
        if (b->name() == kind) return *b;
    throw Error("unknown target '" + target + "' (targets: " + backendNamesText() + ")");
}

std::vector<std::string> backendNames() {
    std::vector<std::string> names;
    for (const Backend* b : registered()) names.push_back(b->name());
    return names;
}

std::string backendNamesText() {
    const auto names = backendNames();
    std::string text;
    for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : (i + 1 == names.size() ? " or " : ", ")) + names[i];
    return text;
}

std::vector<ParameterSpec> backendParameters() {
    std::vector<ParameterSpec> all;
    for (const Backend* b : registered())
        for (auto& p : b->parameters()) all.push_back(std::move(p));
    return all;
}

}  // namespace kiln
