#include "llm/scheduler.h"

#include <algorithm>

#include "ir/error.h"

namespace kiln::llm {

Scheduler::Scheduler(const LanguageModel& model, SchedulerOptions options)
    : model_(model), options_(options), cache_(model.makeCache(options.block_size, options.num_blocks)) {
    check(options.max_batch_size > 0 && options.max_num_tokens > 0, "max_batch_size and max_num_tokens must be positive");
}

int64_t Scheduler::add(Request r) {
    check(!r.prompt.empty(), "a request needs at least one prompt token");
    check(r.max_tokens >= 0, "max_tokens must be >= 0");
    for (int64_t t : r.prompt)  // checked here so one bad request never fails a batch
        check(t >= 0 && t < model_.config().vocab, "token id " + std::to_string(t) + " outside the vocabulary of " + std::to_string(model_.config().vocab));
    Sampler sampler(r.sampling);  // validates the sampling parameters now, not mid-batch
    if (!r.ignore_eos)
        for (int64_t eos : model_.config().eos_token_ids)
            if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), eos) == r.stop_tokens.end()) r.stop_tokens.push_back(eos);
    const int64_t kv_tokens = options_.num_blocks * options_.block_size;
    const int64_t limit = std::min(model_.config().max_positions, kv_tokens);
    const int64_t prompt = static_cast<int64_t>(r.prompt.size());
    // A sequence that could outgrow the whole KV cache would fail every step it runs in:
    // refused here, alone.
    const int64_t needed = kvSlotsNeeded(prompt, r.max_tokens, model_.config().max_positions);
    check(prompt >= limit || needed <= kv_tokens, [&] {
        return "the request needs " + std::to_string(needed) + " tokens of KV cache and the whole cache holds " + std::to_string(kv_tokens) +
               " (num_blocks x block_size): lower max_tokens or raise num_blocks";
    });
    const int64_t id = next_id_++;
    RequestState& s = states_[id];
    s.id = id;
    s.sampler = sampler;
    s.request = std::move(r);
    if (prompt >= limit) s.finished = FinishReason::ContextLength;
    else if (s.request.max_tokens == 0) s.finished = FinishReason::Length;
    else waiting_.push_back(id);
    return id;
}

void Scheduler::cancel(int64_t id) {
    RequestState& s = states_.at(id);
    if (s.finished != FinishReason::None) return;
    s.finished = FinishReason::Cancelled;
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
    for (auto it = running_.begin(); it != running_.end(); ++it)
        if (it->id == id) {
            cache_.freeSequence(it->seq);
            running_.erase(it);
            break;
        }
}

void Scheduler::finish(Running& r, FinishReason why) {
    states_.at(r.id).finished = why;
    cache_.freeSequence(r.seq);
}

void Scheduler::preemptNewest() {
    Running& r = running_.back();
    cache_.freeSequence(r.seq);
    ++states_.at(r.id).preemptions;
    waiting_.push_front(r.id);  // resumes first, recomputing prompt + generated tokens
    running_.pop_back();
}

bool Scheduler::step(StepStats* stats) {
    StepStats st;
    // Admit waiting requests while there is room in the batch.
    while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_batch_size) {
        const int64_t id = waiting_.front();
        waiting_.pop_front();
        RequestState& s = states_.at(id);
        Running r{id, cache_.addSequence(), s.request.prompt, 0};
        r.tokens.insert(r.tokens.end(), s.output.begin(), s.output.end());  // a resumed request recomputes these
        r.computed = cache_.sharePrefix(r.seq, r.tokens);
        running_.push_back(std::move(r));
    }
    if (running_.empty()) return false;
    // Plan: decodes first (one token each), then prompt chunks, within the token budget.
    int64_t budget = options_.max_num_tokens;
    std::vector<std::pair<size_t, int64_t>> work;  // running index, tokens this step
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
        const int64_t pending = static_cast<int64_t>(running_[i].tokens.size()) - running_[i].computed;
        if (pending == 1) work.emplace_back(i, 1), --budget;
    }
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
        const int64_t pending = static_cast<int64_t>(running_[i].tokens.size()) - running_[i].computed;
        if (pending > 1) {
            const int64_t n = std::min(pending, budget);
            work.emplace_back(i, n);
            budget -= n;
        }
    }
    // Reserve KV blocks; preempt the newest sequences until everything planned fits.
    for (size_t w = 0; w < work.size();) {
        auto [i, n] = work[w];
        if (cache_.reserve(running_[i].seq, n)) {
            ++w;
            continue;
        }
        if (running_.size() == 1) {  // alone and still too large: this request fails, no other
            states_.at(running_[0].id).error = "the KV cache is too small for this sequence: raise num_blocks";
            finish(running_[0], FinishReason::Cancelled);
            running_.clear();
            work.clear();
            break;
        }
        const size_t newest = running_.size() - 1;
        preemptNewest();  // its blocks, this step's included, go back to the pool
        ++st.preempted;
        auto of_newest = [&](const auto& p) { return p.first == newest; };
        const size_t before = static_cast<size_t>(std::count_if(work.begin(), work.begin() + static_cast<std::ptrdiff_t>(w), of_newest));
        work.erase(std::remove_if(work.begin(), work.end(), of_newest), work.end());
        w -= before;
    }
    if (work.empty()) {  // the one sequence failed
        if (stats) *stats = st;
        return true;
    }
    std::vector<SequenceChunk> chunks;
    for (auto [i, n] : work) chunks.push_back({running_[i].seq, std::span<const int64_t>(running_[i].tokens).subspan(running_[i].computed, n)});
    // When every sequence that samples this step samples greedily, only the argmax ids
    // come back from the model (no logits copied out).
    bool argmax_only = true;
    for (auto [i, n] : work) {
        const Running& r = running_[i];
        const RequestState& s = states_.at(r.id);
        if (r.computed + n >= static_cast<int64_t>(r.tokens.size()) && (!s.sampler.greedy() || s.request.logprobs >= 0)) argmax_only = false;
    }
    std::vector<float> all_logits;
    std::vector<int64_t> argmax;
    if (argmax_only) argmax = model_.forwardBatchArgmax(cache_, chunks);
    else all_logits = model_.forwardBatch(cache_, chunks);
    const size_t vocab = static_cast<size_t>(model_.config().vocab);
    std::vector<size_t> done;
    for (size_t w = 0; w < work.size(); ++w) {
        auto [i, n] = work[w];
        Running& r = running_[i];
        r.computed += n;
        (n == 1 && r.computed > static_cast<int64_t>(states_.at(r.id).request.prompt.size()) ? st.decode_tokens : st.prefill_tokens) += n;
        if (r.computed < static_cast<int64_t>(r.tokens.size())) continue;  // prompt chunk: no token yet
        RequestState& s = states_.at(r.id);
        const int64_t token = argmax_only ? argmax[w] : s.sampler.next(std::span<const float>(all_logits.data() + w * vocab, vocab), r.tokens, s.output);
        if (s.request.logprobs >= 0) s.logprobs.push_back(tokenLogprob(std::span<const float>(all_logits.data() + w * vocab, vocab), token, s.request.logprobs));
        s.output.push_back(token);
        r.tokens.push_back(token);
        if (on_token) on_token(r.id, token);
        const auto& stops = s.request.stop_tokens;
        if (std::find(stops.begin(), stops.end(), token) != stops.end()) finish(r, FinishReason::Stop), done.push_back(i);
        else if (static_cast<int64_t>(s.output.size()) >= s.request.max_tokens) finish(r, FinishReason::Length), done.push_back(i);
        else if (static_cast<int64_t>(r.tokens.size()) >= model_.config().max_positions) finish(r, FinishReason::ContextLength), done.push_back(i);
    }
    st.sequences = static_cast<int64_t>(work.size());
    std::sort(done.rbegin(), done.rend());
    for (size_t i : done) running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    if (stats) *stats = st;
    return true;
}

void Scheduler::runToCompletion() {
    while (step()) {
    }
}

}  // namespace kiln::llm
