#include "llm/server/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <ctime>
#include <random>
#include <nlohmann/json.hpp>

#include "ir/error.h"
#include "llm/detokenizer.h"
#include "llm/llm_engine.h"
#include "llm/server/openai_choice.h"
#include "llm/server/openai_request.h"
#include "llm/utf8.h"
#include "server/http_guard.h"

namespace kiln::llm::server {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// JSON text that never throws on bytes that are not UTF-8 (messages may quote a user's
// input): they are written as U+FFFD.
std::string jsonText(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* errorType(int status) {
    if (status == 429) return "rate_limit_error";
    if (status == 404) return "not_found_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

void sendError(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    json err = {{"message", sanitizeUtf8(e.message)}, {"type", errorType(e.status)}, {"param", nullptr}, {"code", nullptr}};
    if (!e.param.empty()) err["param"] = e.param;
    if (!e.code.empty()) err["code"] = e.code;
    res.set_content(jsonText(json{{"error", err}}), "application/json");
}

}  // namespace

struct OpenAiServer::Impl {
    ServerOptions o;
    ServedModel served;
    std::shared_ptr<Tokenizer> tokenizer;
    LlmEngine engine;
    httplib::Server http;
    std::unique_ptr<kiln::server::RequestDeadlines> deadlines;
    std::atomic<int64_t> next_id{0}, in_flight{0};
    std::atomic<bool> cancel_all{false};
    socket_t listen_socket = -1;

    Impl(ServerOptions options, const LanguageModel& model, std::shared_ptr<Tokenizer> tok)
        : o(std::move(options)), tokenizer(std::move(tok)), engine(model, o.scheduler, o.max_queue) {
        served = {o.name, tokenizer.get(), model.config().vocab, model.config().max_positions, o.scheduler.num_blocks * o.scheduler.block_size};
        http.new_task_queue = [n = o.max_connections] { return new kiln::server::ElasticPool(n); };
        http.set_keep_alive_max_count(1000);
        // httplib listens with a backlog of 5, too short for a burst of clients connecting at
        // once; remember the listening socket so run() can widen it after binding.
        http.set_socket_options([this](socket_t sock) {
            httplib::default_socket_options(sock);
            listen_socket = sock;
        });
        http.set_payload_max_length(o.max_body_bytes);
        const auto secs = std::chrono::duration_cast<std::chrono::seconds>(o.read_timeout);
        http.set_read_timeout(std::max<time_t>(1, secs.count()), 0);
        http.set_logger([this](const httplib::Request& req, const httplib::Response&) {
            if (deadlines) deadlines->done(req);
        });
        // Answers httplib makes itself (404, 413, a handler's escaped exception) get a JSON body.
        http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            if (res.status == 413) return sendError(res, {413, "the request body is larger than the server's limit"});
            if (res.status == 404) return sendError(res, {404, "no route for " + req.method + " " + req.path});
            sendError(res, {res.status, "HTTP status " + std::to_string(res.status)});
        });
        http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
            res.body.clear();
            sendError(res, {500, "internal error"});
        });
        auto send = [](httplib::Response& res, int status, const std::string& message) { sendError(res, {status, message}); };
        using kiln::server::routeOnly;
        routeOnly(http, "GET", "/health", guarded([](const httplib::Request&, httplib::Response& res) { res.set_content("{\"status\":\"ok\"}", "application/json"); }), send);
        routeOnly(http, "GET", "/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
            res.set_content(jsonText(json{{"object", "list"}, {"data", {{{"id", o.name}, {"object", "model"}, {"owned_by", "kiln"}}}}}), "application/json");
        }), send);
        routeOnly(http, "GET", "/metrics", guarded([this](const httplib::Request&, httplib::Response& res) { res.set_content(metricsText(), "text/plain; version=0.0.4"); }), send);
        routeOnly(http, "POST", "/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) { complete(req, res, false); }), send);
        routeOnly(http, "POST", "/v1/chat/completions", guarded([this](const httplib::Request& req, httplib::Response& res) { complete(req, res, true); }), send);
    }

    // Every handler: marks its connection busy (the read deadline is met), counts the
    // request in flight, and turns any exception into a JSON error.
    httplib::Server::Handler guarded(httplib::Server::Handler h) {
        return [this, h](const httplib::Request& req, httplib::Response& res) {
            if (deadlines) deadlines->busy(req);
            ++in_flight;
            try {
                h(req, res);
            } catch (const ApiError& e) {
                sendError(res, e);
            } catch (const std::exception& e) {
                sendError(res, {500, std::string("internal error: ") + e.what()});
            }
            --in_flight;
        };
    }

    // n choices, one engine request each: seeded ones draw from seed + i, others from a
    // random seed. All or none: a full queue cancels the ones already in.
    std::vector<Choice> submitChoices(const ParsedRequest& p) {
        std::vector<Choice> choices;
        std::random_device entropy;
        for (int64_t i = 0; i < p.n; ++i) {
            Request r = p.request;
            r.sampling.seed = p.seeded ? p.request.sampling.seed + static_cast<uint64_t>(i) : (uint64_t(entropy()) << 32 | entropy());
            auto stream = engine.submit(r);
            if (!stream) {
                for (auto& c : choices) engine.cancel(c.stream());
                throw ApiError{429, "the server is at capacity; retry later"};
            }
            choices.emplace_back(std::move(stream), tokenizer.get(), p.stop);
        }
        return choices;
    }

    // A choice's poll; a stop string (or a server drain) cancels its stream.
    ChoiceDelta pollChoice(Choice& c, std::chrono::milliseconds wait) {
        ChoiceDelta d = c.poll(wait);
        if (c.stopMatched() && d.finish) engine.cancel(c.stream());
        else if (cancel_all && !c.done()) engine.cancel(c.stream());
        return d;
    }

    void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
        const json body = json::parse(req.body, nullptr, false);
        if (body.is_discarded()) throw ApiError{400, "the body is not valid JSON"};
        const ParsedRequest p = parseRequest(body, chat, served);
        std::vector<Choice> choices = submitChoices(p);
        const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
        const json head = {{"id", id}, {"object", chat ? (p.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
                           {"created", static_cast<int64_t>(std::time(nullptr))}, {"model", o.name}};
        if (p.stream) return streamTo(res, std::move(choices), head, chat, p);
        json out = head;
        out["choices"] = json::array();
        int64_t completion_tokens = 0;
        for (size_t i = 0; i < choices.size(); ++i) {
            std::string text;
            std::vector<int64_t> tokens;
            std::vector<TokenLogprob> lps;
            ChoiceDelta d;
            while (!choices[i].done()) {
                d = pollChoice(choices[i], std::chrono::milliseconds(100));
                text += d.text;
                tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
                lps.insert(lps.end(), d.logprobs.begin(), d.logprobs.end());
            }
            if (!d.error.empty()) {
                for (auto& c : choices) engine.cancel(c.stream());
                throw ApiError{500, d.error};
            }
            completion_tokens += choices[i].tokensTaken();
            json c = {{"index", i}, {"finish_reason", d.finish ? json(d.finish) : json(nullptr)}, {"logprobs", nullptr}};
            if (chat) c["message"] = {{"role", "assistant"}, {"content", text}};
            else c["text"] = text, c["token_ids"] = tokens;
            size_t offset = 0;
            if (p.logprobs) c["logprobs"] = chat ? chatLogprobs(tokenizer.get(), lps) : completionLogprobs(tokenizer.get(), lps, offset);
            out["choices"].push_back(c);
        }
        out["usage"] = usage(static_cast<int64_t>(p.request.prompt.size()), completion_tokens);
        res.set_content(jsonText(out), "application/json");
    }

    static json usage(int64_t prompt, int64_t completion_tokens) {
        return {{"prompt_tokens", prompt}, {"completion_tokens", completion_tokens}, {"total_tokens", prompt + completion_tokens}};
    }

    // Server-sent events: per choice, one chunk per batch of new tokens, text only as whole
    // characters and never a stop string; with include_usage a last chunk holds the usage.
    void streamTo(httplib::Response& res, std::vector<Choice> choices, const json& head, bool chat, const ParsedRequest& p) {
        struct State {
            std::vector<Choice> choices;
            std::vector<bool> role_sent;
            std::vector<size_t> offsets;  // completions' text_offset per choice
            bool finished = false;
        };
        auto state = std::make_shared<State>();
        state->role_sent.assign(choices.size(), false);
        state->offsets.assign(choices.size(), 0);
        state->choices = std::move(choices);
        const bool logprobs = p.logprobs, include_usage = p.include_usage;
        const auto prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
        auto event = [this, head, chat, state, logprobs](size_t i, const ChoiceDelta& d, bool final_event) {
            json c = {{"index", i}, {"finish_reason", final_event && d.finish ? json(d.finish) : json(nullptr)}, {"logprobs", nullptr}};
            if (chat) {
                c["delta"] = {{"content", final_event ? std::string() : d.text}};
                if (!state->role_sent[i]) c["delta"]["role"] = "assistant", state->role_sent[i] = true;
            } else {
                c["text"] = final_event ? std::string() : d.text, c["token_ids"] = final_event ? std::vector<int64_t>{} : d.tokens;
            }
            if (logprobs && !final_event)
                c["logprobs"] = chat ? chatLogprobs(tokenizer.get(), d.logprobs) : completionLogprobs(tokenizer.get(), d.logprobs, state->offsets[i]);
            json chunk = head;
            chunk["choices"] = json::array({c});
            return "data: " + jsonText(chunk) + "\n\n";
        };
        res.set_header("Cache-Control", "no-cache");
        ++in_flight;  // until the stream's last event: a drain waits for it
        res.set_chunked_content_provider("text/event-stream", [this, state, event, include_usage, prompt_tokens](size_t, httplib::DataSink& sink) {
            try {
                std::string out;
                bool all_done = true;
                const auto wait = std::chrono::milliseconds(200 / static_cast<int64_t>(state->choices.size()) + 1);
                int64_t completion_tokens = 0;
                for (size_t i = 0; i < state->choices.size(); ++i) {
                    Choice& c = state->choices[i];
                    const bool was_done = c.done();
                    const ChoiceDelta d = was_done ? ChoiceDelta{} : pollChoice(c, wait);
                    completion_tokens += c.tokensTaken();
                    if (!d.tokens.empty() || !d.text.empty()) out += event(i, d, false);
                    if (!was_done && c.done()) {
                        if (!d.error.empty()) out += "data: " + jsonText(json{{"error", {{"message", sanitizeUtf8(d.error)}, {"type", "server_error"}}}}) + "\n\n";
                        out += event(i, d, true);
                    }
                    all_done = all_done && c.done();
                }
                if (all_done) {
                    if (include_usage) {
                        const json chunk = {{"choices", json::array()}, {"usage", usage(prompt_tokens, completion_tokens)}};
                        out += "data: " + jsonText(chunk) + "\n\n";
                    }
                    out += "data: [DONE]\n\n";
                }
                if (!out.empty() && !sink.write(out.data(), out.size())) {  // the client went away: stop its requests
                    for (auto& c : state->choices) engine.cancel(c.stream());
                    return false;
                }
                if (all_done) sink.done();
                return true;
            } catch (const std::exception&) {
                for (auto& c : state->choices) engine.cancel(c.stream());
                return false;
            }
        }, [this, state](bool success) {
            if (!success)
                for (auto& c : state->choices) engine.cancel(c.stream());
            --in_flight;
        });
    }

    std::string metricsText() {
        const EngineMetrics m = engine.metrics();
        std::string s;
        auto metric = [&](const char* name, const char* type, const char* help, double v) {
            s += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + std::to_string(v) + "\n";
        };
        metric("kiln_requests_total", "counter", "Requests received", static_cast<double>(m.requests_total));
        metric("kiln_requests_rejected_total", "counter", "Requests refused with 429", static_cast<double>(m.requests_rejected));
        metric("kiln_requests_finished_total", "counter", "Requests completed", static_cast<double>(m.requests_finished));
        metric("kiln_requests_cancelled_total", "counter", "Requests cancelled", static_cast<double>(m.requests_cancelled));
        metric("kiln_prompt_tokens_total", "counter", "Prompt tokens admitted", static_cast<double>(m.prompt_tokens));
        metric("kiln_generation_tokens_total", "counter", "Tokens generated", static_cast<double>(m.generated_tokens));
        metric("kiln_preemptions_total", "counter", "Sequences preempted for KV space", static_cast<double>(m.preemptions));
        metric("kiln_requests_running", "gauge", "Requests admitted and unfinished", static_cast<double>(m.running));
        metric("kiln_kv_cache_blocks_used", "gauge", "KV cache blocks in use", static_cast<double>(m.kv_blocks_used));
        metric("kiln_kv_cache_blocks_total", "gauge", "KV cache blocks", static_cast<double>(m.kv_blocks_total));
        metric("kiln_kv_cache_utilization", "gauge", "Tokens stored per slot of the used blocks", m.kv_utilization);
        return s;
    }
};

OpenAiServer::OpenAiServer(ServerOptions options, const LanguageModel& model, std::shared_ptr<Tokenizer> tokenizer)
    : impl_(std::make_unique<Impl>(std::move(options), model, std::move(tokenizer))) {}

OpenAiServer::~OpenAiServer() = default;

void OpenAiServer::run(const std::function<void(int)>& on_listening) {
    Impl& s = *impl_;
    check(s.o.port >= 0 && s.o.port <= 65535, "--port " + std::to_string(s.o.port) + " is not a TCP port (0 to 65535)");
    const int port = s.o.port == 0 ? s.http.bind_to_any_port(s.o.host) : (s.http.bind_to_port(s.o.host, s.o.port) ? s.o.port : -1);
    check(port > 0, "cannot listen on " + s.o.host + ":" + std::to_string(s.o.port));
    s.deadlines = std::make_unique<kiln::server::RequestDeadlines>(port, s.o.read_timeout);
    if (s.listen_socket >= 0) ::listen(s.listen_socket, SOMAXCONN);  // re-listening on Linux only changes the backlog
    on_listening(port);
    s.http.listen_after_bind();
}

void OpenAiServer::stop(std::chrono::milliseconds drain) {
    Impl& s = *impl_;
    s.http.stop();
    const auto until = Clock::now() + drain;
    while (s.in_flight > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s.cancel_all = true;  // what is left ends now, as cancelled
    const auto grace = Clock::now() + std::chrono::milliseconds(500);
    while (s.in_flight > 0 && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (s.deadlines) s.deadlines->closeAll();
}

}  // namespace kiln::llm::server
