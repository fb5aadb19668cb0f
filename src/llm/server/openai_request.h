// OpenAI request bodies -> scheduler requests. Every field the server reads is checked
// here, for type and range, before any work is queued: a bad field is a 400 naming it.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "llm/scheduler.h"
#include "llm/tokenizer.h"

namespace kiln::llm::server {

// An answer that is not a completion: an HTTP status and an OpenAI-style error.
struct ApiError {
    int status;
    std::string message, code = {}, param = {};
};

// What the parser needs to know of the model being served.
struct ServedModel {
    std::string name;
    const Tokenizer* tokenizer = nullptr;  // null: prompts must be token ids
    int64_t vocab = 0, max_positions = 0;
    int64_t kv_tokens = 0;  // what the whole KV cache holds (blocks x block size)
};

struct ParsedRequest {
    Request request;                // one choice's; the server submits n of them
    bool stream = false;
    bool include_usage = false;     // stream_options.include_usage: a last chunk with the usage
    int64_t n = 1;                  // choices
    bool seeded = false;            // a seed was given: choice i draws from seed + i, else from a random seed
    std::vector<std::string> stop;  // stop strings
    bool logprobs = false;          // report each token's log-probability (request.logprobs alternatives)
};

// Throws ApiError for a body that is not a valid request for `model`.
ParsedRequest parseRequest(const nlohmann::json& body, bool chat, const ServedModel& model);

}  // namespace kiln::llm::server
