// Kernel coverage over the real models CI has (the repository's models, and the zoo's npm
// models where they were obtained): every node of an op that has a fast CPU tactic must run
// on one with the default route. A node that falls to its reference kernel is a model that
// runs at reference speed on a user's machine (issue: model zoo).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "backends/cpu/fast/tactics.h"
#include "engine/builder.h"
#include "engine/coverage.h"
#include "onnx_import/importer.h"
#include "test_helpers.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> coverageModels() {
    const fs::path root = KILN_SOURCE_DIR;
    std::vector<fs::path> found;
    for (const fs::path dir : {root / "models", root / "tests" / "data", root / "bench" / "zoo" / "models"}) {
        if (!fs::is_directory(dir)) continue;
        for (const auto& entry : fs::directory_iterator(dir))
            if (fs::exists(entry.path() / "model.onnx")) found.push_back(entry.path() / "model.onnx");
    }
    std::sort(found.begin(), found.end());
    return found;
}

bool hasFastTactic(const std::string& op) {
    for (const auto& t : fastTactics())
        if (std::find(t.ops.begin(), t.ops.end(), op) != t.ops.end()) return true;
    return false;
}

}  // namespace

TEST(Coverage, ModelsRunEveryOpWithAFastTacticOnOne) {
    const auto models = coverageModels();
    ASSERT_GE(models.size(), 4u) << "the repository's models are missing";
    for (const auto& path : models) {
        Graph g;
        try {
            g = importOnnxModel(path);
        } catch (const Error& e) {
            ADD_FAILURE() << e.what();
            continue;
        }
        // Symbolic dims: the build times tactics on nothing, which changes no tactic choice here.
        Builder b(g, "");
        const Engine e = b.build();
        for (const auto& slow : referenceKernelNodes(e))
            EXPECT_FALSE(hasFastTactic(slow.op)) << path.parent_path().filename().string() << ": node '" << slow.node << "' (" << slow.op << ") runs on its reference kernel: " << slow.why;
    }
    // The check sees a model forced onto reference kernels.
    Builder forced(importOnnxModel(fs::path(KILN_SOURCE_DIR) / "models" / "mlp" / "model.onnx"), "");
    forced.setBuildRoute(BuildRoute::parse("tactic.cpu.gemm=reference", Builder::space()));
    const auto slow = referenceKernelNodes(forced.build());
    EXPECT_TRUE(std::any_of(slow.begin(), slow.end(), [](const SlowNode& s) { return hasFastTactic(s.op); }));
}
