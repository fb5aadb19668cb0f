// The LLM runtime as a service: one thread runs the in-flight batching scheduler while
// any number of client threads submit requests and wait for their tokens. The queue of
// requests not yet admitted is bounded; past it, submit refuses (the server answers 429).
#pragma once
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "llm/scheduler.h"

namespace kiln::llm {

// What one request's client sees; filled by the engine thread.
struct Stream {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<int64_t> tokens;
    std::vector<TokenLogprob> logprobs;  // one per token, when the request asks
    FinishReason finished = FinishReason::None;
    std::string error;
    int64_t id = -1;
};

struct EngineMetrics {
    int64_t requests_total = 0, requests_rejected = 0, requests_finished = 0, requests_cancelled = 0;
    int64_t prompt_tokens = 0, generated_tokens = 0, running = 0, preemptions = 0, steps = 0;  // running: admitted, unfinished
    double kv_utilization = 0;
    int64_t kv_blocks_used = 0, kv_blocks_total = 0;
};

class LlmEngine {
public:
    LlmEngine(const LanguageModel& model, SchedulerOptions options, int64_t max_queue);
    ~LlmEngine();
    // nullptr when the queue is full. Throws Error for a bad request.
    std::shared_ptr<Stream> submit(const Request& r);
    void cancel(const std::shared_ptr<Stream>& s);
    EngineMetrics metrics();

private:
    void loop();
    const LanguageModel& model_;
    Scheduler scheduler_;
    int64_t max_queue_;
    std::mutex mutex_;
    std::condition_variable work_;
    std::deque<std::pair<Request, std::shared_ptr<Stream>>> incoming_;
    std::deque<std::shared_ptr<Stream>> cancels_;
    std::map<int64_t, std::shared_ptr<Stream>> active_;
    EngineMetrics metrics_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace kiln::llm
