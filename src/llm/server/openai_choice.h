// One choice of an OpenAI completion (a request asks for n): the engine stream that computes
// it, and the text handed out so far through the incremental detokenizer and the stop
// strings; and the JSON of its log-probabilities.
#pragma once
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llm/detokenizer.h"
#include "llm/llm_engine.h"
#include "llm/stop_strings.h"

namespace kiln::llm::server {

// What one poll of a choice brought.
struct ChoiceDelta {
    std::vector<int64_t> tokens;  // up to the one that completed a stop string
    std::vector<TokenLogprob> logprobs;
    std::string text;
    const char* finish = nullptr;  // set once the choice is done
    std::string error;
};

class Choice {
public:
    Choice(std::shared_ptr<Stream> stream, const Tokenizer* tokenizer, std::vector<std::string> stops);
    // Waits up to `wait` for tokens or the end. Once a stop string matched, the choice is done
    // and stopMatched() is true: the caller cancels the stream, whose later tokens are dropped.
    ChoiceDelta poll(std::chrono::milliseconds wait);
    bool done() const { return done_; }
    bool stopMatched() const { return stop_matched_; }
    const std::shared_ptr<Stream>& stream() const { return stream_; }
    int64_t tokensTaken() const { return taken_; }

private:
    std::shared_ptr<Stream> stream_;
    IncrementalDetokenizer detokenizer_;
    StopStringMatcher stops_;
    size_t read_ = 0;     // stream tokens read
    int64_t taken_ = 0;   // tokens part of the choice (up to a stop)
    bool done_ = false, stop_matched_ = false;
};

// The finish_reason text of an engine's finish reason (null for None).
const char* finishReasonText(FinishReason f);

// Log-probabilities as OpenAI writes them: for completions {tokens, token_logprobs,
// top_logprobs, text_offset} (offsets from `offset` on, which is advanced), for chat
// {content: [{token, logprob, bytes, top_logprobs}]}. Tokens are their decoded text, or
// "token_id:N" without a tokenizer.
nlohmann::json completionLogprobs(const Tokenizer* tokenizer, const std::vector<TokenLogprob>& lps, size_t& offset);
nlohmann::json chatLogprobs(const Tokenizer* tokenizer, const std::vector<TokenLogprob>& lps);

}  // namespace kiln::llm::server
