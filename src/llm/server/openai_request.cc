#include "llm/server/openai_request.h"

#include <algorithm>
#include <limits>

#include "ir/error.h"

namespace kiln::llm::server {

namespace {

using nlohmann::json;

constexpr int64_t kMaxChoices = 64, kMaxTopLogprobs = 20;

ApiError badField(const std::string& field, const std::string& message) { return {400, "'" + field + "' " + message, "", field}; }

// The field as T, or `fallback` when absent or null; a 400 for a wrong type or a value
// out of T's range (a JSON integer past 2^63 must not wrap).
template <typename T>
T field(const json& body, const char* key, T fallback) {
    if (!body.contains(key) || body[key].is_null()) return fallback;
    const json& v = body[key];
    if constexpr (std::is_same_v<T, bool>) {
        if (!v.is_boolean()) throw badField(key, "must be true or false");
        return v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
        if (!v.is_number_integer()) throw badField(key, "must be an integer");
        if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw badField(key, "is too large");
        if (std::is_unsigned_v<T> && !v.is_number_unsigned()) throw badField(key, "must not be negative");
        return v.get<T>();
    } else {
        if (!v.is_number()) throw badField(key, "must be a number");
        const double d = v.get<double>();
        if (!(d >= std::numeric_limits<T>::lowest() && d <= std::numeric_limits<T>::max())) throw badField(key, "is out of range");
        return static_cast<T>(d);
    }
}

std::vector<int64_t> tokenize(const std::string& text, const ServedModel& m, const char* param) {
    if (!m.tokenizer) throw ApiError{400, "this model has no tokenizer.json: send 'prompt' as a list of token ids", "", param};
    // Refuse a prompt that cannot fit before tokenizing it: each token stands for at most
    // maxTokenBytes() bytes, so a longer text has more tokens than the context holds.
    const size_t per_token = m.tokenizer->maxTokenBytes();
    if (per_token > 0 && text.size() / per_token > static_cast<size_t>(m.max_positions))
        throw ApiError{400, "This model's maximum context length is " + std::to_string(m.max_positions) + " tokens; the prompt's " +
                                std::to_string(text.size()) + " bytes are more than that many tokens",
                       "context_length_exceeded", param};
    try {
        return m.tokenizer->encode(text);
    } catch (const Error& e) {
        throw ApiError{400, std::string("the text cannot be tokenized: ") + e.what(), "", param};
    }
}

std::vector<int64_t> promptOf(const json& body, bool chat, const ServedModel& m) {
    if (chat) {
        if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
            throw badField("messages", "must be a non-empty list");
        std::string text;
        for (const auto& msg : body["messages"]) {  // a plain "role: content" template
            if (!msg.is_object() || !msg.contains("content") || !msg["content"].is_string()) throw badField("messages", "items need string 'content'");
            if (msg.contains("role") && !msg["role"].is_string()) throw badField("messages", "items need a string 'role'");
            text += msg.value("role", "user") + ": " + msg["content"].get<std::string>() + "\n";
        }
        return tokenize(text + "assistant:", m, "messages");
    }
    if (!body.contains("prompt")) throw badField("prompt", "is required");
    const json& p = body["prompt"];
    if (p.is_string()) return tokenize(p.get<std::string>(), m, "prompt");
    if (!p.is_array() || p.empty()) throw badField("prompt", "must be a string or a non-empty list of token ids");
    std::vector<int64_t> ids;
    ids.reserve(p.size());
    for (const json& t : p) {
        if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(m.vocab)))
            throw badField("prompt", "must be a string or a non-empty list of token ids");
        ids.push_back(t.get<int64_t>());
    }
    return ids;
}

// `stop`: a string or a list of up to 4 (OpenAI's limit), none empty.
std::vector<std::string> stopStrings(const json& body) {
    if (!body.contains("stop") || body["stop"].is_null()) return {};
    const json& s = body["stop"];
    std::vector<std::string> out;
    if (s.is_string()) out.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 4 && std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); }))
        out = s.get<std::vector<std::string>>();
    else throw badField("stop", "must be a string or a list of at most 4 strings");
    if (std::any_of(out.begin(), out.end(), [](const std::string& x) { return x.empty(); })) throw badField("stop", "must not hold an empty string");
    return out;
}

// Completions: logprobs = N (alternatives per token). Chat: logprobs = true, top_logprobs = N.
void logprobsOf(const json& body, bool chat, ParsedRequest& out) {
    int64_t top = -1;
    if (chat) {
        const bool on = field(body, "logprobs", false);
        const bool has_top = body.contains("top_logprobs") && !body["top_logprobs"].is_null();
        if (has_top && !on) throw badField("top_logprobs", "needs logprobs: true");
        if (on) top = field(body, "top_logprobs", int64_t(0));
        if (on && (top < 0 || top > kMaxTopLogprobs)) throw badField("top_logprobs", "must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
    } else if (body.contains("logprobs") && !body["logprobs"].is_null()) {
        top = field(body, "logprobs", int64_t(0));
        if (top < 0 || top > kMaxTopLogprobs) throw badField("logprobs", "must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
    }
    out.logprobs = top >= 0;
    out.request.logprobs = top;
}

void checkTokens(const std::vector<int64_t>& ids, int64_t vocab, const char* param) {
    for (int64_t t : ids)
        if (t < 0 || t >= vocab) throw ApiError{400, "token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(vocab), "", param};
}

}  // namespace

ParsedRequest parseRequest(const json& body, bool chat, const ServedModel& m) {
    if (!body.is_object()) throw ApiError{400, "the body must be a JSON object"};
    if (body.contains("model") && !body["model"].is_null()) {
        if (!body["model"].is_string()) throw badField("model", "must be a string");
        if (body["model"].get<std::string>() != m.name)
            throw ApiError{404, "The model '" + body["model"].get<std::string>() + "' does not exist; this server serves '" + m.name + "'", "model_not_found", "model"};
    }
    ParsedRequest out;
    out.stream = field(body, "stream", false);
    if (body.contains("stream_options") && !body["stream_options"].is_null()) {
        const json& so = body["stream_options"];
        if (!so.is_object()) throw badField("stream_options", "must be an object");
        if (!out.stream) throw badField("stream_options", "is only allowed with stream: true");
        out.include_usage = field(so, "include_usage", false);
    }
    out.n = field(body, "n", int64_t(1));
    if (out.n < 1 || out.n > kMaxChoices) throw badField("n", "must be in [1, " + std::to_string(kMaxChoices) + "]");
    out.seeded = body.contains("seed") && !body["seed"].is_null();
    out.stop = stopStrings(body);
    if (!out.stop.empty() && !m.tokenizer) throw ApiError{400, "'stop' strings need the model's tokenizer.json; use stop_token_ids", "", "stop"};
    logprobsOf(body, chat, out);
    out.request.ignore_eos = field(body, "ignore_eos", false);
    Request& r = out.request;
    // max_completion_tokens is the newer name (chat); absent both, up to the context (vLLM's default).
    const bool has_max_completion = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null();
    const char* max_field = has_max_completion ? "max_completion_tokens" : "max_tokens";
    r.max_tokens = field(body, max_field, int64_t(0));
    const bool max_given = body.contains(max_field) && !body[max_field].is_null();
    r.sampling.temperature = field(body, "temperature", 1.0f);
    r.sampling.top_p = field(body, "top_p", 1.0f);
    r.sampling.top_k = field(body, "top_k", int64_t(0));
    r.sampling.repetition_penalty = field(body, "repetition_penalty", 1.0f);
    r.sampling.seed = field(body, "seed", uint64_t(0));
    r.sampling.presence_penalty = field(body, "presence_penalty", 0.0f);
    r.sampling.frequency_penalty = field(body, "frequency_penalty", 0.0f);
    if (max_given && r.max_tokens < 1) throw badField(max_field, "must be at least 1");
    if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 100)) throw badField("temperature", "must be in [0, 100]");
    if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) throw badField("top_p", "must be in (0, 1]");
    if (r.sampling.top_k < 0) throw badField("top_k", "must not be negative");
    if (!(r.sampling.repetition_penalty > 0)) throw badField("repetition_penalty", "must be positive");
    for (const auto& [k, v] : {std::pair{"presence_penalty", r.sampling.presence_penalty}, std::pair{"frequency_penalty", r.sampling.frequency_penalty}})
        if (!(v >= -2 && v <= 2)) throw badField(k, "must be in [-2, 2]");
    if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
        const json& s = body["stop_token_ids"];
        if (!s.is_array() || !std::all_of(s.begin(), s.end(), [](const json& t) { return t.is_number_integer(); }))
            throw badField("stop_token_ids", "must be a list of token ids");
        for (const json& t : s)
            if (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(m.vocab)) throw badField("stop_token_ids", "holds an id outside the vocabulary");
        r.stop_tokens = s.get<std::vector<int64_t>>();
        checkTokens(r.stop_tokens, m.vocab, "stop_token_ids");
    }
    r.prompt = promptOf(body, chat, m);
    if (r.prompt.empty()) throw badField("prompt", "is empty");
    checkTokens(r.prompt, m.vocab, chat ? "messages" : "prompt");
    const int64_t prompt = static_cast<int64_t>(r.prompt.size());
    // The default: what the context leaves, within what the KV cache can hold for one request.
    if (!max_given) r.max_tokens = std::max<int64_t>(1, std::min(m.max_positions - prompt, m.kv_tokens - prompt + 1));
    if (prompt >= m.max_positions || r.max_tokens > m.max_positions - prompt)  // no sum that could overflow
        throw ApiError{400,
                       "This model's maximum context length is " + std::to_string(m.max_positions) + " tokens; the request asks for " +
                           std::to_string(prompt) + " prompt + " + std::to_string(r.max_tokens) + " completion tokens",
                       "context_length_exceeded", max_field};
    if (const int64_t needed = kvSlotsNeeded(prompt, r.max_tokens, m.max_positions); needed > m.kv_tokens)
        throw ApiError{400,
                       "the request needs " + std::to_string(needed) + " tokens of KV cache and the whole cache holds " +
                           std::to_string(m.kv_tokens) + " (the server's --num-blocks x --block-size); lower max_tokens or shorten the prompt",
                       "kv_cache_exceeded", max_field};
    return out;
}

}  // namespace kiln::llm::server
