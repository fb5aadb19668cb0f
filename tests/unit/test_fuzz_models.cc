// Malformed-but-parseable models: random mutations of real ONNX test models (attribute
// values, input shapes, initializer types, dropped inputs) must import, build and run or be
// refused with kiln::Error — never crash, hang or throw anything else.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/builder.h"
#include "onnx_import/importer.h"
#include "runtime/context.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

void mutate(onnx::ModelProto& m, std::mt19937& rng) {
    auto* g = m.mutable_graph();
    std::uniform_int_distribution<int> small(-3, 6);
    switch (rng() % 5) {
        case 0:  // an int / ints attribute gets odd values
            if (g->node_size()) {
                auto* n = g->mutable_node(static_cast<int>(rng() % g->node_size()));
                for (auto& a : *n->mutable_attribute()) {
                    if (a.type() == onnx::AttributeProto::INT) a.set_i(small(rng));
                    if (a.type() == onnx::AttributeProto::INTS)
                        for (int k = 0; k < a.ints_size(); ++k) a.set_ints(k, small(rng));
                }
            }
            break;
        case 1:  // an input's declared dims change
            if (g->input_size()) {
                auto* shape = g->mutable_input(static_cast<int>(rng() % g->input_size()))->mutable_type()->mutable_tensor_type()->mutable_shape();
                for (auto& d : *shape->mutable_dim())
                    if (rng() % 2) d.set_dim_value(std::max(0, small(rng)));
            }
            break;
        case 2:  // a node loses an input
            if (g->node_size()) {
                auto* n = g->mutable_node(static_cast<int>(rng() % g->node_size()));
                if (n->input_size()) n->mutable_input()->RemoveLast();
            }
            break;
        case 3:  // an initializer changes type (its raw data no longer fits)
            if (g->initializer_size()) g->mutable_initializer(static_cast<int>(rng() % g->initializer_size()))->set_data_type(onnx::TensorProto::INT64);
            break;
        default:  // a node reads a value produced later or not at all
            if (g->node_size() > 1) {
                auto* n = g->mutable_node(0);
                if (n->input_size()) n->set_input(0, g->node(g->node_size() - 1).output(0));
            }
            break;
    }
}

}  // namespace

TEST(Fuzz, MutatedModelsAreRunOrRefusedCleanly) {
    std::vector<fs::path> models;
    for (const char* suite : {"node", "pytorch-converted"}) {
        fs::path root = fs::path("/usr/share/libonnx-testdata/data") / suite;
        if (!fs::exists(root)) continue;
        for (const auto& e : fs::directory_iterator(root))
            if (fs::exists(e.path() / "model.onnx")) models.push_back(e.path() / "model.onnx");
    }
    for (const char* m : {"mlp", "small_cnn", "transformer_block"}) models.push_back(fs::path(KILN_SOURCE_DIR) / "models" / m / "model.onnx");
    std::sort(models.begin(), models.end());
    // KILN_FUZZ_SEED explores other mutations; CI uses the fixed default.
    std::mt19937 rng(std::getenv("KILN_FUZZ_SEED") ? static_cast<unsigned>(std::atoi(std::getenv("KILN_FUZZ_SEED"))) : 2026u);
    std::shuffle(models.begin(), models.end(), rng);
    models.resize(std::min<size_t>(models.size(), 250));
    TempDir dir;
    size_t ran = 0, refused = 0;
    for (const auto& path : models) {
        onnx::ModelProto m;
        std::ifstream in(path, std::ios::binary);
        if (!m.ParseFromIstream(&in)) continue;
        mutate(m, rng);
        const fs::path out = dir / "m.onnx";
        saveModel(m, out);
        try {
            Graph g = importOnnxModel(out);
            Builder b(g, "");
            Engine e = b.build();
            ExecutionContext ctx(e);
            TensorMap inputs;
            for (const auto& vi : g.runtimeInputs()) {
                if (!vi.shape.fullyKnown() || vi.dtype == DType::Undefined || numElements(vi.shape.concrete()) > (1 << 20)) throw Error("no static input shape");
                Tensor t(vi.dtype, vi.shape.concrete());
                dispatchDType(vi.dtype, "fuzz", [&](auto tag) {
                    using T = typename decltype(tag)::type;
                    for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(static_cast<float>(rng() % 7) - 2.0f);
                });
                inputs[vi.name] = t;
            }
            ctx.run(inputs);
            ++ran;
        } catch (const Error&) {
            ++refused;
        } catch (const std::exception& e) {
            ADD_FAILURE() << path << ": threw a non-kiln exception: " << e.what();
        }
    }
    EXPECT_GT(ran, 0u);
    EXPECT_GT(refused, 0u);
    std::cout << "fuzz: " << ran << " mutated models ran, " << refused << " refused with an error\n";
}
