#include "llm/server/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <ctime>
#include <nlohmann/json.hpp>

#include "ir/error.h"
#include "llm/detokenizer.h"
#include "llm/llm_engine.h"
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

const char* reasonText(FinishReason f) {
    switch (f) {
        case FinishReason::Stop: return "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Cancelled: return "cancelled";
        case FinishReason::ContextLength: return "length";
        default: return nullptr;
    }
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

    void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
        const json body = json::parse(req.body, nullptr, false);
        if (body.is_discarded()) throw ApiError{400, "the body is not valid JSON"};
        ParsedRequest p = parseRequest(body, chat, served);
        auto stream = engine.submit(p.request);
        if (!stream) throw ApiError{429, "the server is at capacity; retry later"};
        const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
        const json head = {{"id", id}, {"object", chat ? (p.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
                           {"created", static_cast<int64_t>(std::time(nullptr))}, {"model", o.name}};
        if (p.stream) return streamTo(res, stream, head, chat);
        std::unique_lock<std::mutex> lock(stream->mutex);
        while (!stream->changed.wait_for(lock, std::chrono::milliseconds(100), [&] { return stream->finished != FinishReason::None; }))
            if (cancel_all) {
                lock.unlock();
                engine.cancel(stream);
                lock.lock();
            }
        if (!stream->error.empty()) throw ApiError{500, stream->error};
        json out = head;
        const std::string text = decodeText(tokenizer.get(), stream->tokens);
        json c = {{"index", 0}, {"finish_reason", reasonText(stream->finished)}};
        if (chat) c["message"] = {{"role", "assistant"}, {"content", text}};
        else c["text"] = text, c["token_ids"] = stream->tokens;
        out["choices"] = json::array({c});
        const size_t n = stream->tokens.size(), prompt = p.request.prompt.size();
        out["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", n}, {"total_tokens", prompt + n}};
        res.set_content(jsonText(out), "application/json");
    }

    // Server-sent events: one chunk per batch of new tokens, text only as whole characters.
    void streamTo(httplib::Response& res, const std::shared_ptr<Stream>& stream, const json& head, bool chat) {
        struct State {
            size_t sent = 0;
            IncrementalDetokenizer text;
            bool role_sent = false;
        };
        auto state = std::make_shared<State>(State{0, IncrementalDetokenizer(tokenizer.get()), false});
        auto event = [head, chat, state](const std::vector<int64_t>& tokens, const std::string& text, const char* finish) {
            json c = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
            if (chat) {
                c["delta"] = {{"content", text}};
                if (!state->role_sent) c["delta"]["role"] = "assistant", state->role_sent = true;
            } else {
                c["text"] = text, c["token_ids"] = tokens;
            }
            json chunk = head;
            chunk["choices"] = json::array({c});
            return "data: " + jsonText(chunk) + "\n\n";
        };
        res.set_header("Cache-Control", "no-cache");
        ++in_flight;  // until the stream's last event: a drain waits for it
        res.set_chunked_content_provider("text/event-stream", [this, stream, state, event](size_t, httplib::DataSink& sink) {
            try {
                std::unique_lock<std::mutex> lock(stream->mutex);
                stream->changed.wait_for(lock, std::chrono::milliseconds(200), [&] { return stream->tokens.size() > state->sent || stream->finished != FinishReason::None; });
                std::vector<int64_t> fresh(stream->tokens.begin() + static_cast<std::ptrdiff_t>(state->sent), stream->tokens.end());
                const FinishReason f = stream->finished;
                const std::string error = stream->error;
                lock.unlock();
                if (cancel_all && f == FinishReason::None) engine.cancel(stream);
                state->sent += fresh.size();
                std::string out;
                if (!fresh.empty()) out += event(fresh, state->text.add(fresh), nullptr);
                if (f != FinishReason::None) {
                    const std::string rest = state->text.finish();
                    if (!rest.empty()) out += event({}, rest, nullptr);
                    if (!error.empty()) out += "data: " + jsonText(json{{"error", {{"message", sanitizeUtf8(error)}, {"type", "server_error"}}}}) + "\n\n";
                    out += event({}, "", error.empty() ? reasonText(f) : "error") + "data: [DONE]\n\n";
                }
                if (!out.empty() && !sink.write(out.data(), out.size())) {  // the client went away: stop its request
                    engine.cancel(stream);
                    return false;
                }
                if (f != FinishReason::None) sink.done();
                return true;
            } catch (const std::exception&) {
                engine.cancel(stream);
                return false;
            }
        }, [this, stream](bool success) {
            if (!success) engine.cancel(stream);
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
