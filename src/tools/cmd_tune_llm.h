// `kiln tune MODEL_DIR`: the LLM runtime's parameters searched on a serving workload
// (tuner/llm_tuner.h), printed or as JSON.
#pragma once
#include <string>

#include "tuner/llm_tuner.h"

namespace kiln::tools {

struct LlmTuneCommand {
    std::string model;
    LlmTunePolicy policy;
    std::string report;  // .json
    bool dry_run = false, json = false;
};

void executeLlmTune(const LlmTuneCommand& c);

}  // namespace kiln::tools
