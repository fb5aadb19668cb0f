#include "llm/server/openai_choice.h"

#include "llm/utf8.h"

namespace kiln::llm::server {

using nlohmann::json;

Choice::Choice(std::shared_ptr<Stream> stream, const Tokenizer* tokenizer, std::vector<std::string> stops)
    : stream_(std::move(stream)), detokenizer_(tokenizer), stops_(std::move(stops)) {}

ChoiceDelta Choice::poll(std::chrono::milliseconds wait) {
    ChoiceDelta d;
    if (done_) return d;
    std::unique_lock<std::mutex> lock(stream_->mutex);
    stream_->changed.wait_for(lock, wait, [&] { return stream_->tokens.size() > read_ || stream_->finished != FinishReason::None; });
    const std::vector<int64_t> fresh(stream_->tokens.begin() + static_cast<std::ptrdiff_t>(read_), stream_->tokens.end());
    std::vector<TokenLogprob> fresh_lps;
    if (stream_->logprobs.size() == stream_->tokens.size())
        fresh_lps.assign(stream_->logprobs.begin() + static_cast<std::ptrdiff_t>(read_), stream_->logprobs.end());
    const FinishReason f = stream_->finished;
    d.error = stream_->error;
    lock.unlock();
    read_ += fresh.size();
    for (size_t i = 0; i < fresh.size(); ++i) {  // one at a time: a stop string ends the choice at the token that completes it
        d.tokens.push_back(fresh[i]);
        if (i < fresh_lps.size()) d.logprobs.push_back(fresh_lps[i]);
        ++taken_;
        d.text += stops_.add(detokenizer_.add(std::span<const int64_t>(&fresh[i], 1)));
        if (stops_.stopped()) {
            done_ = stop_matched_ = true;
            d.finish = "stop";
            d.error.clear();
            return d;
        }
    }
    if (f == FinishReason::None) return d;
    d.text += stops_.add(detokenizer_.finish());
    if (stops_.stopped()) {
        d.finish = "stop";
    } else {
        d.text += stops_.finish();
        d.finish = d.error.empty() ? finishReasonText(f) : "error";
    }
    done_ = true;
    return d;
}

const char* finishReasonText(FinishReason f) {
    switch (f) {
        case FinishReason::Stop: return "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Cancelled: return "cancelled";
        case FinishReason::ContextLength: return "length";
        default: return nullptr;
    }
}

namespace {

std::string tokenText(const Tokenizer* tokenizer, int64_t id) { return tokenizer ? tokenizer->decode({id}) : "token_id:" + std::to_string(id); }

json bytesOf(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

}  // namespace

json completionLogprobs(const Tokenizer* tokenizer, const std::vector<TokenLogprob>& lps, size_t& offset) {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
    for (const auto& lp : lps) {
        const std::string text = tokenText(tokenizer, lp.token);
        tokens.push_back(sanitizeUtf8(text));
        token_lps.push_back(lp.logprob);
        json top = json::object();
        for (const auto& [id, v] : lp.top) top[sanitizeUtf8(tokenText(tokenizer, id))] = v;
        tops.push_back(top);
        offsets.push_back(offset);
        offset += text.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chatLogprobs(const Tokenizer* tokenizer, const std::vector<TokenLogprob>& lps) {
    json content = json::array();
    for (const auto& lp : lps) {
        const std::string text = tokenText(tokenizer, lp.token);
        json top = json::array();
        for (const auto& [id, v] : lp.top) {
            const std::string t = tokenText(tokenizer, id);
            top.push_back({{"token", sanitizeUtf8(t)}, {"logprob", v}, {"bytes", bytesOf(t)}});
        }
        content.push_back({{"token", sanitizeUtf8(text)}, {"logprob", lp.logprob}, {"bytes", bytesOf(text)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
}

}  // namespace kiln::llm::server
