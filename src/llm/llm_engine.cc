#include "llm/llm_engine.h"

namespace kiln::llm {

LlmEngine::LlmEngine(const LanguageModel& model, SchedulerOptions options, int64_t max_queue)
    : model_(model), scheduler_(model, options), max_queue_(max_queue) {
    metrics_.kv_blocks_total = options.num_blocks;
    scheduler_.on_token = [this](int64_t id, int64_t token) {
        auto it = active_.find(id);
        if (it == active_.end()) return;
        const RequestState& state = scheduler_.state(id);
        std::lock_guard<std::mutex> lock(it->second->mutex);
        it->second->tokens.push_back(token);
        if (!state.logprobs.empty()) it->second->logprobs.push_back(state.logprobs.back());
        it->second->changed.notify_all();
    };
    thread_ = std::thread([this] { loop(); });
}

LlmEngine::~LlmEngine() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    work_.notify_all();
    thread_.join();
}

std::shared_ptr<Stream> LlmEngine::submit(const Request& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.requests_total;
    if (static_cast<int64_t>(incoming_.size()) + metrics_.running >= max_queue_) {  // outstanding requests
        ++metrics_.requests_rejected;
        return nullptr;
    }
    auto s = std::make_shared<Stream>();
    incoming_.emplace_back(r, s);
    work_.notify_all();
    return s;
}

void LlmEngine::cancel(const std::shared_ptr<Stream>& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.push_back(s);
    work_.notify_all();
}

EngineMetrics LlmEngine::metrics() {
    std::lock_guard<std::mutex> lock(mutex_);
    return metrics_;
}

void LlmEngine::loop() {
    for (;;) {
        std::deque<std::pair<Request, std::shared_ptr<Stream>>> incoming;
        std::deque<std::shared_ptr<Stream>> cancels;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            work_.wait(lock, [&] { return stop_ || !incoming_.empty() || !cancels_.empty() || !active_.empty(); });
            if (stop_) break;
            incoming.swap(incoming_);
            cancels.swap(cancels_);
        }
        for (auto& [request, stream] : incoming) {
            try {
                const int64_t id = scheduler_.add(request);
                const FinishReason f = scheduler_.state(id).finished;
                std::lock_guard<std::mutex> lock(stream->mutex);
                stream->id = id;
                if (f != FinishReason::None) {
                    stream->finished = f;
                    stream->changed.notify_all();
                } else {
                    active_[id] = stream;
                }
                std::lock_guard<std::mutex> m(mutex_);
                metrics_.prompt_tokens += static_cast<int64_t>(request.prompt.size());
            } catch (const std::exception& e) {
                std::lock_guard<std::mutex> lock(stream->mutex);
                stream->error = e.what();
                stream->finished = FinishReason::Cancelled;
                stream->changed.notify_all();
            }
        }
        for (auto& s : cancels)
            if (s->id >= 0 && active_.count(s->id)) scheduler_.cancel(s->id);
        StepStats st;
        try {
            if (!active_.empty()) scheduler_.step(&st);
        } catch (const std::exception& e) {  // e.g. a sequence larger than the whole KV cache: fail the batch, keep serving
            for (auto& [id, stream] : active_) {
                scheduler_.cancel(id);
                std::lock_guard<std::mutex> lock(stream->mutex);
                stream->error = e.what();
            }
        }
        // Publish finished requests.
        int64_t finished = 0, cancelled = 0, generated = 0;
        for (auto it = active_.begin(); it != active_.end();) {
            const RequestState& rs = scheduler_.state(it->first);
            if (rs.finished == FinishReason::None) {
                ++it;
                continue;
            }
            generated += static_cast<int64_t>(rs.output.size());
            (rs.finished == FinishReason::Cancelled ? cancelled : finished) += 1;
            {
                std::lock_guard<std::mutex> lock(it->second->mutex);
                if (!rs.error.empty()) it->second->error = rs.error;
                it->second->finished = rs.finished;
                it->second->changed.notify_all();
            }
            it = active_.erase(it);
        }
        const KvCacheStats kv = scheduler_.cache().stats();
        std::lock_guard<std::mutex> lock(mutex_);
        metrics_.requests_finished += finished;
        metrics_.requests_cancelled += cancelled;
        metrics_.generated_tokens += generated;
        metrics_.preemptions += st.preempted;
        metrics_.steps += 1;
        metrics_.running = static_cast<int64_t>(active_.size());
        metrics_.kv_utilization = kv.utilization;
        metrics_.kv_blocks_used = kv.blocks_used;
    }
}

}  // namespace kiln::llm
