#include "fuzz_inputs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "engine/builder.h"
#include "engine/engine.h"
#include "llm/bpe_tokenizer.h"
#include "llm/decoder_model.h"
#include "llm/detokenizer.h"
#include "llm/safetensors.h"
#include "llm/scheduler.h"
#include "llm/server/openai_request.h"
#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "runtime/context.h"

namespace kiln::fuzz {

namespace fs = std::filesystem;

namespace {

void writeBytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes; }

std::string readBytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// What `kiln run` feeds a model without input files: random values of the declared types,
// symbolic dims set to 1; integers small (indices, divisors) or extreme.
TensorMap randomInputs(const Graph& g, uint64_t seed) {
    Rng rng(seed);
    TensorMap inputs;
    for (const auto& vi : g.runtimeInputs()) {
        check(vi.shape.rank_known && vi.dtype != DType::Undefined, "input '" + vi.name + "' has no declared type and shape");
        Dims dims;
        for (const auto& d : vi.shape.dims) dims.push_back(d.known() ? d.size : 1);
        Tensor t(vi.dtype, dims);
        dispatchDType(vi.dtype, "fuzz input", [&](auto tag) {
            using T = typename decltype(tag)::type;
            T* p = t.data<T>();
            for (int64_t i = 0; i < t.numel(); ++i) {
                if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) p[i] = rng() % 16 == 0 ? static_cast<T>(interestingInt(rng)) : static_cast<T>(static_cast<int>(rng() % 7) - 2);
                else p[i] = static_cast<T>(static_cast<float>(rng() % 2000) / 500.f - 2.f);
            }
        });
        inputs[vi.name] = t;
    }
    return inputs;
}

void runEngine(const Engine& e) {
    ExecutionContext context(e);
    context.run(randomInputs(e.graph, 7));
}

std::vector<fs::path> seedModels() {
    std::vector<fs::path> models;
    for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
        const fs::path root = fs::path("/usr/share/libonnx-testdata/data") / suite;
        if (!fs::exists(root)) continue;
        for (const auto& e : fs::directory_iterator(root))
            if (fs::exists(e.path() / "model.onnx") && fs::file_size(e.path() / "model.onnx") < (1 << 20)) models.push_back(e.path() / "model.onnx");
    }
    for (const char* m : {"mlp", "small_cnn", "transformer_block"}) models.push_back(fs::path(KILN_SOURCE_DIR) / "models" / m / "model.onnx");
    std::sort(models.begin(), models.end());
    return models;
}

class OnnxKind : public InputKind {
public:
    explicit OnnxKind(fs::path work) : work_(std::move(work)) {
        for (const auto& op : supportedOps()) ops_.push_back(op.op_type);
    }
    std::string name() const override { return "onnx"; }
    std::string extension() const override { return ".onnx"; }
    void prepare(Rng&) override {
        for (const auto& p : seedModels()) seeds_.push_back(readBytes(p));
        check(!seeds_.empty(), "no seed models (libonnx-testdata is not installed?)");
    }
    std::string mutant(Rng& rng) override {
        std::string bytes = seeds_[rng() % seeds_.size()];
        onnx::ModelProto m;
        if (m.ParseFromString(bytes)) {
            mutateModel(m, rng, ops_);
            bytes = m.SerializeAsString();
        }
        if (rng() % 6 == 0) mutateBytes(bytes, rng);
        return bytes;
    }
    void run(const std::string& input) const override {
        const fs::path model = work_ / ("model_" + std::to_string(::getpid()) + ".onnx");
        writeBytes(model, input);
        Graph g = importOnnxModel(model);
        Builder b(g, "fuzz");
        runEngine(b.build());
    }
    const std::vector<std::string>& seeds() const { return seeds_; }

private:
    fs::path work_;
    std::vector<std::string> ops_, seeds_;
};

class EngineKind : public InputKind {
public:
    EngineKind(fs::path work, const OnnxKind* models) : work_(std::move(work)), models_(models) {}
    std::string name() const override { return "engine"; }
    std::string extension() const override { return ".engine"; }
    // Engines of the first seed models that build, each built in a child.
    void prepare(Rng&) override {
        const auto& models = models_->seeds();
        for (size_t i = 0; i < models.size() && seeds_.size() < 60; i += std::max<size_t>(1, models.size() / 120)) {
            const fs::path out = work_ / "seed.engine";
            fs::remove(out);
            if (fork() == 0) {
                try {
                    const fs::path model = work_ / "seed.onnx";
                    writeBytes(model, models[i]);
                    Builder b(importOnnxModel(model), "fuzz");
                    writeBytes(out, serializeEngine(b.build()));
                } catch (...) {
                }
                _exit(0);
            }
            int status = 0;
            wait(&status);
            if (fs::exists(out)) seeds_.push_back(readBytes(out));
        }
        check(!seeds_.empty(), "no engine seeds could be built");
    }
    std::string mutant(Rng& rng) override {
        std::string bytes = seeds_[rng() % seeds_.size()];
        for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {  // in place: sizes stay, so the parse goes deep
            const size_t at = 24 + rng() % (bytes.size() - 32);
            bytes[at] = rng() % 2 ? static_cast<char>(bytes[at] ^ (1 << (rng() % 8))) : static_cast<char>(interestingInt(rng));
        }
        if (rng() % 5 == 0) mutateBytes(bytes, rng, 24);
        if (rng() % 8 != 0) resealEngineBytes(bytes);  // mostly past the checksum: the loader must still check
        return bytes;
    }
    void run(const std::string& input) const override { runEngine(deserializeEngine(input, "fuzz.engine")); }

private:
    fs::path work_;
    const OnnxKind* models_;
    std::vector<std::string> seeds_;
};

// Tensor files: the first line names the format (pb or npy), the rest is the file.
class TensorKind : public InputKind {
public:
    explicit TensorKind(fs::path work) : work_(std::move(work)) {}
    std::string name() const override { return "tensor"; }
    std::string extension() const override { return ".tensor"; }
    void prepare(Rng& rng) override {
        const std::vector<std::pair<DType, Dims>> shapes = {{DType::F32, {2, 3}}, {DType::I64, {4}}, {DType::F16, {1, 2, 2}}, {DType::U8, {}}, {DType::Bool, {3, 1}}};
        for (const auto& [dtype, dims] : shapes) {
            Tensor t(dtype, dims);
            for (size_t b = 0; b < t.byteSize(); ++b) t.raw()[b] = static_cast<std::byte>(rng() % 2);
            for (const char* ext : {".pb", ".npy"}) {
                const fs::path p = work_ / (std::string("seed") + ext);
                saveTensorFile(t, "x", p);
                seeds_.push_back(std::string(ext + 1) + "\n" + readBytes(p));
            }
        }
    }
    std::string mutant(Rng& rng) override {
        std::string s = seeds_[rng() % seeds_.size()];
        const size_t body = s.find('\n') + 1;
        if (s.compare(0, 2, "pb") == 0 && rng() % 2) {
            onnx::TensorProto proto;
            if (proto.ParseFromString(s.substr(body))) {
                if (proto.dims_size() && rng() % 2) proto.set_dims(static_cast<int>(rng() % proto.dims_size()), interestingInt(rng));
                else proto.add_dims(interestingInt(rng));
                if (rng() % 4 == 0) proto.set_data_type(static_cast<int>(rng() % 20));
                return s.substr(0, body) + proto.SerializeAsString();
            }
        }
        if (s.compare(0, 3, "npy") == 0 && rng() % 2) {  // a shape in the header
            const size_t open = s.find("'shape': (");
            const size_t close = open == std::string::npos ? open : s.find(')', open);
            if (close != std::string::npos) return s.substr(0, open + 10) + std::to_string(interestingInt(rng)) + ", " + std::to_string(interestingInt(rng) & 0xffffffffffff) + s.substr(close);
        }
        mutateBytes(s, rng, body);
        return s;
    }
    void run(const std::string& input) const override {
        const size_t nl = input.find('\n');
        check(nl != std::string::npos, "tensor input without a format line");
        const fs::path p = work_ / ("input_" + std::to_string(::getpid()) + "." + input.substr(0, nl));
        writeBytes(p, input.substr(nl + 1));
        loadTensorFile(p).summary();
    }

private:
    fs::path work_;
    std::vector<std::string> seeds_;
};

}  // namespace

std::unique_ptr<InputKind> makeLlmKind(const fs::path& work);
std::unique_ptr<InputKind> makeRequestKind();

std::vector<std::unique_ptr<InputKind>> makeInputKinds(const fs::path& work) {
    std::vector<std::unique_ptr<InputKind>> kinds;
    auto onnx = std::make_unique<OnnxKind>(work);
    auto engine = std::make_unique<EngineKind>(work, onnx.get());
    kinds.push_back(std::move(onnx));
    kinds.push_back(std::move(engine));
    kinds.push_back(std::make_unique<TensorKind>(work));
    kinds.push_back(makeLlmKind(work));
    kinds.push_back(makeRequestKind());
    return kinds;
}

}  // namespace kiln::fuzz
