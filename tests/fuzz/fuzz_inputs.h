// The kinds of input the fuzzer feeds Kiln, each with its seeds, its mutations and what a
// user's command would do with it: ONNX models (import, build, run), engine files (load,
// run), tensor files (.pb, .npy), LLM folders (config.json, tokenizer.json, safetensors)
// and OpenAI request bodies.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mutators.h"

namespace kiln::fuzz {

class InputKind {
public:
    virtual ~InputKind() = default;
    virtual std::string name() const = 0;
    virtual std::string extension() const = 0;  // of corpus files
    // Makes the seeds; runs Kiln's kernels only in forked children (libgomp is not fork-safe).
    virtual void prepare(Rng& rng) = 0;
    virtual std::string mutant(Rng& rng) = 0;
    // Runs in the fuzzer's child: returns when the input was used, throws when refused.
    virtual void run(const std::string& input) const = 0;
};

// `work`: a folder for the children's files, with the external-data targets in it.
std::vector<std::unique_ptr<InputKind>> makeInputKinds(const std::filesystem::path& work);

}  // namespace kiln::fuzz
