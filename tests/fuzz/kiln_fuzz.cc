// kiln_fuzz: a deterministic mutation fuzzer over every kind of input Kiln reads. Each
// input runs in a forked child (fuzz_runner.h); the table at the end counts, per kind,
// what ran, what was refused with a clean error, and every crash, hang or unclear error.
//
//   kiln_fuzz [--kinds onnx,engine,tensor,llm,request] [--iterations N] [--seconds S]
//             [--seed K] [--replay CORPUS_DIR] [--save DIR] [--timeout S]
//
// --replay runs every file of CORPUS_DIR/<kind>/ once (the regression corpus) and nothing
// else; otherwise N mutated inputs (or S seconds' worth) are drawn round-robin over kinds.
// Exit status 1 when anything crashed, hung or threw an unclear error.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "engine/builder.h"
#include "fuzz_inputs.h"
#include "fuzz_runner.h"
#include "ir/tensor.h"

using namespace kiln;
using namespace kiln::fuzz;
namespace fs = std::filesystem;

namespace {

struct Options {
    std::set<std::string> kinds = {"onnx", "engine", "tensor", "llm", "request"};
    int64_t iterations = 1000;
    double seconds = 0;
    uint64_t seed = 2026;
    std::string replay, save;
    int timeout = 20;
};

Options parseArgs(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw Error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--kinds") {
            o.kinds.clear();
            std::string list = value();
            for (size_t at = 0; at <= list.size();) {
                const size_t comma = std::min(list.find(',', at), list.size());
                o.kinds.insert(list.substr(at, comma - at));
                at = comma + 1;
            }
        } else if (a == "--iterations") o.iterations = std::stoll(value());
        else if (a == "--seconds") o.seconds = std::stod(value());
        else if (a == "--seed") o.seed = std::stoull(value());
        else if (a == "--replay") o.replay = value();
        else if (a == "--save") o.save = value();
        else if (a == "--timeout") o.timeout = std::stoi(value());
        else throw Error("unknown argument '" + a + "' (see the header of tests/fuzz/kiln_fuzz.cc)");
    }
    return o;
}

std::string readBytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// The folder each child works in: external data files (a real one, a FIFO, a device link)
// that mutated models may point at.
fs::path makeWorkDir() {
    const fs::path dir = fs::temp_directory_path() / ("kiln_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "weights.bin") << std::string(4096, '\x3f');
    mkfifo((dir / "fifo").c_str(), 0644);
    std::error_code ec;
    fs::create_symlink("/dev/zero", dir / "dev_zero", ec);
    return dir;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parseArgs(argc, argv);
        // Mutated shapes may ask for any size: a cap well under the machine's memory keeps
        // a clean refusal from costing minutes of page faults.
        setMaxTensorBytes(size_t(256) << 20);
        const fs::path work = makeWorkDir();
        std::vector<std::unique_ptr<InputKind>> kinds = makeInputKinds(work);
        std::map<std::string, Tally> tallies;
        int64_t failures_saved = 0;
        auto attempt = [&](InputKind& kind, const std::string& input, const std::string& label) {
            std::string detail;
            const Outcome out = runIsolated([&] { kind.run(input); }, std::chrono::seconds(o.timeout), false, &detail);
            tallies[kind.name()].add(out);
            if (out == Outcome::Ran || out == Outcome::CleanError) return;
            const char* what = out == Outcome::Crash ? "CRASH" : out == Outcome::Hang ? "HANG" : "UNCLEAR";
            std::cerr << what << " [" << kind.name() << "] " << label << ": " << detail.substr(0, 300) << "\n";
            if (!o.save.empty()) {
                const fs::path dir = fs::path(o.save) / kind.name();
                fs::create_directories(dir);
                std::ofstream(dir / (std::to_string(o.seed) + "_" + std::to_string(failures_saved++) + kind.extension()), std::ios::binary) << input;
            }
        };
        for (auto& k : kinds)
            if (o.kinds.count(k->name())) tallies[k->name()];  // every kind asked for gets a row
        if (!o.replay.empty()) {
            for (auto& k : kinds) {
                const fs::path dir = fs::path(o.replay) / k->name();
                if (!o.kinds.count(k->name()) || !fs::is_directory(dir)) continue;
                std::vector<fs::path> files;
                for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
                std::sort(files.begin(), files.end());
                for (const auto& f : files) attempt(*k, readBytes(f), f.filename().string());
            }
        } else {
            Rng rng(o.seed);
            std::vector<InputKind*> active;
            for (auto& k : kinds)
                if (o.kinds.count(k->name())) active.push_back(k.get());
            if (active.empty()) throw Error("--kinds names no known input kind (onnx, engine, tensor, llm, request)");
            for (auto* k : active) k->prepare(rng);
            const auto start = std::chrono::steady_clock::now();
            for (int64_t i = 0; i < o.iterations; ++i) {
                if (o.seconds > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > o.seconds) break;
                InputKind& k = *active[static_cast<size_t>(i) % active.size()];
                attempt(k, k.mutant(rng), "iteration " + std::to_string(i));
            }
        }
        std::cout << tallyTable(tallies);
        fs::remove_all(work);
        int64_t failed = 0;
        for (const auto& [name, t] : tallies) failed += t.failures();
        return failed > 0 ? 1 : 0;
    } catch (const std::exception& e) {
        std::cerr << "kiln_fuzz: error: " << e.what() << "\n";
        return 2;
    }
}
