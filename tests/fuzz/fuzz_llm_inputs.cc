// The LLM side of the fuzzer: model folders whose config.json, tokenizer.json or
// model.safetensors is mutated, and OpenAI request bodies.
#include <unistd.h>

#include <fstream>
#include <random>

#include "fuzz_inputs.h"
#include "ir/error.h"
#include "llm/bpe_tokenizer.h"
#include "llm/decoder_model.h"
#include "llm/detokenizer.h"
#include "llm/safetensors.h"
#include "llm/scheduler.h"
#include "llm/server/openai_request.h"

namespace kiln::fuzz {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// GPT-2's printable byte alphabet (what byte-level BPE vocabularies are written in).
std::string byteChar(int b) {
    int next = 256, cp = b;
    for (int x = 0; x <= b; ++x) {
        const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
        if (x == b) cp = printable ? x : next;
        if (!printable) ++next;
    }
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
    return s;
}

// A byte-level BPE tokenizer over all 256 bytes and a few merges: 300 ids.
std::string tokenizerJson() {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[byteChar(b)] = b;
    std::vector<std::string> merges;
    const std::string pairs[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {byteChar(' '), "w"}, {"o", "r"}};
    int id = 256;
    for (const auto& p : pairs) merges.push_back(p[0] + " " + p[1]), vocab[p[0] + p[1]] = id++;
    return json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}, {"added_tokens", {{{"id", 299}, {"content", "<|end|>"}}}}}.dump();
}

constexpr const char* kFiles[] = {"config.json", "tokenizer.json", "model.safetensors"};

// A model folder as one input: the first line names the file that differs from the
// valid tiny GPT-2 folder, the rest is that file.
class LlmKind : public InputKind {
public:
    explicit LlmKind(fs::path work) : work_(std::move(work)) {
        valid_["config.json"] = R"({"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 300, "n_inner": 24})";
        valid_["tokenizer.json"] = tokenizerJson();
        std::mt19937 rng(1);
        std::normal_distribution<float> n(0.f, 0.2f);
        std::map<std::string, Tensor> w;
        auto t = [&](const Dims& d) {
            Tensor x(DType::F32, d);
            for (auto& v : x.span<float>()) v = n(rng);
            return x;
        };
        w["wte.weight"] = t({300, 16}), w["wpe.weight"] = t({64, 16}), w["ln_f.weight"] = t({16}), w["ln_f.bias"] = t({16});
        for (int l = 0; l < 2; ++l) {
            const std::string p = "h." + std::to_string(l) + ".";
            for (const char* ln : {"ln_1", "ln_2"}) w[p + ln + ".weight"] = t({16}), w[p + ln + ".bias"] = t({16});
            w[p + "attn.c_attn.weight"] = t({16, 48}), w[p + "attn.c_attn.bias"] = t({48});
            w[p + "attn.c_proj.weight"] = t({16, 16}), w[p + "attn.c_proj.bias"] = t({16});
            w[p + "mlp.c_fc.weight"] = t({16, 24}), w[p + "mlp.c_fc.bias"] = t({24});
            w[p + "mlp.c_proj.weight"] = t({24, 16}), w[p + "mlp.c_proj.bias"] = t({16});
        }
        const fs::path p = work_ / "seed.safetensors";
        llm::writeSafetensors(p, w);
        std::ifstream in(p, std::ios::binary);
        valid_["model.safetensors"] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    std::string name() const override { return "llm"; }
    std::string extension() const override { return ".llm"; }
    void prepare(Rng&) override {}
    std::string mutant(Rng& rng) override {
        const std::string file = kFiles[rng() % 3];
        std::string bytes = valid_.at(file);
        if (file != "model.safetensors" || rng() % 2) {
            if (file == "model.safetensors") {  // the JSON header, mutated as JSON
                uint64_t len = 0;
                for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
                json header = json::parse(bytes.substr(8, len));
                mutateJson(header, rng);
                std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
                std::string out;
                for (int i = 0; i < 8; ++i) out += static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
                return file + "\n" + out + text + bytes.substr(8 + len);
            }
            json j = json::parse(bytes);
            mutateJson(j, rng);
            return file + "\n" + j.dump(-1, ' ', false, json::error_handler_t::replace);
        }
        mutateBytes(bytes, rng);
        return file + "\n" + bytes;
    }
    void run(const std::string& input) const override {
        const size_t nl = input.find('\n');
        check(nl != std::string::npos, "llm input without a file line");
        const std::string changed = input.substr(0, nl);
        const fs::path dir = work_ / ("model_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        for (const auto& [file, bytes] : valid_) std::ofstream(dir / file, std::ios::binary | std::ios::trunc) << (file == changed ? input.substr(nl + 1) : bytes);
        // What `kiln generate` does with the folder: load, tokenize, generate a few tokens.
        const llm::DecoderModel model = llm::DecoderModel::load(dir);
        const auto tokenizer = llm::loadTokenizer(dir);
        llm::Scheduler s(model, llm::SchedulerOptions{});
        llm::Request r;
        r.prompt = tokenizer ? tokenizer->encode("hello world <|end|>") : std::vector<int64_t>{1, 2};
        r.max_tokens = 3;
        const int64_t id = s.add(r);
        s.runToCompletion();
        llm::decodeText(tokenizer.get(), s.state(id).output);
    }

private:
    fs::path work_;
    std::map<std::string, std::string> valid_;
};

// Request bodies: the first line says chat or completion.
class RequestKind : public InputKind {
public:
    RequestKind() : tokenizer_(llm::BpeTokenizer::parse(tokenizerJson(), "tokenizer.json")) {
        served_ = {"tiny", &tokenizer_, 300, 64, 256};
    }
    std::string name() const override { return "request"; }
    std::string extension() const override { return ".request"; }
    void prepare(Rng&) override {
        seeds_ = {
            "completion\n" + json{{"prompt", "hello world"}, {"max_tokens", 5}, {"temperature", 0}}.dump(),
            "completion\n" + json{{"prompt", {1, 2, 3}}, {"max_tokens", 5}, {"stream", true}, {"stop_token_ids", {299}}}.dump(),
            "chat\n" + json{{"messages", {{{"role", "user"}, {"content", "héllo 😀"}}}}, {"max_tokens", 8}, {"top_p", 0.9}, {"seed", 4}}.dump(),
            "chat\n" + json{{"model", "tiny"}, {"messages", {{{"role", "system"}, {"content", "x"}}, {{"role", "user"}, {"content", "y"}}}}, {"top_k", 3}}.dump(),
        };
    }
    std::string mutant(Rng& rng) override {
        std::string s = seeds_[rng() % seeds_.size()];
        const size_t nl = s.find('\n');
        if (rng() % 5 == 0) {
            mutateBytes(s, rng, nl + 1);
            return s;
        }
        json j = json::parse(s.substr(nl + 1));
        mutateJson(j, rng);
        return s.substr(0, nl + 1) + j.dump(-1, ' ', false, json::error_handler_t::replace);
    }
    void run(const std::string& input) const override {
        const size_t nl = input.find('\n');
        check(nl != std::string::npos, "request input without a kind line");
        const json body = json::parse(input.substr(nl + 1), nullptr, false);
        try {
            const llm::server::ParsedRequest p = llm::server::parseRequest(body, input.compare(0, nl, "chat") == 0, served_);
            llm::Sampler sampler(p.request.sampling);  // what the scheduler checks on admission
            llm::IncrementalDetokenizer text(&tokenizer_);
            text.add(p.request.prompt);
            text.finish();
        } catch (const llm::server::ApiError& e) {
            throw Error("HTTP " + std::to_string(e.status) + ": " + e.message);  // the server's clean answer
        }
    }

private:
    llm::BpeTokenizer tokenizer_;
    llm::server::ServedModel served_;
    std::vector<std::string> seeds_;
};

}  // namespace

std::unique_ptr<InputKind> makeLlmKind(const fs::path& work) { return std::make_unique<LlmKind>(work); }
std::unique_ptr<InputKind> makeRequestKind() { return std::make_unique<RequestKind>(); }

}  // namespace kiln::fuzz
