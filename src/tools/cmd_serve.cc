// `kiln serve MODEL_DIR`: an OpenAI-compatible HTTP server over the LLM runtime:
// /v1/completions and /v1/chat/completions (with server-sent-event streaming),
// /v1/models, /health and /metrics (Prometheus text). Bad requests get OpenAI-style JSON
// errors; when the request queue is full the answer is 429.
#include <sys/socket.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "llm/llm_engine.h"
#include "tools/commands.h"
#include "tools/llm_common.h"

namespace kiln::tools {

namespace {

using nlohmann::json;

struct ServeOptions {
    std::string model, host = "127.0.0.1", name;
    LlmTarget target;
    int port = 8000;
    int64_t max_queue = 64;
    llm::SchedulerOptions scheduler;
};

struct BadRequest {
    int status;
    std::string message, code = {}, param = {};
};

void sendError(httplib::Response& res, const BadRequest& e) {
    res.status = e.status;
    json err = {{"message", e.message}, {"type", e.status == 429 ? "rate_limit_error" : "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}};
    if (!e.param.empty()) err["param"] = e.param;
    if (!e.code.empty()) err["code"] = e.code;
    res.set_content(json{{"error", err}}.dump(), "application/json");
}

const char* reasonText(llm::FinishReason f) {
    switch (f) {
        case llm::FinishReason::Stop: return "stop";
        case llm::FinishReason::Length: return "length";
        case llm::FinishReason::Cancelled: return "cancelled";
        case llm::FinishReason::ContextLength: return "length";
        default: return nullptr;
    }
}

class Server {
public:
    Server(ServeOptions o, LoadedLlm m) : o_(std::move(o)), m_(std::move(m)), engine_(*m_.model, o_.scheduler, o_.max_queue) {
        if (o_.name.empty()) o_.name = std::filesystem::path(o_.model).filename().string();
        // Streaming responses hold a worker for their whole length: a pool sized for the
        // queue, and connections kept open across many requests.
        const size_t workers = static_cast<size_t>(std::max<int64_t>(16, o_.max_queue + 8));
        http_.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
        http_.set_keep_alive_max_count(1000);
        // httplib listens with a backlog of 5, too short for a burst of clients connecting at
        // once; remember the listening socket so listen() can widen it after binding.
        http_.set_socket_options([this](socket_t sock) {
            httplib::default_socket_options(sock);
            listen_socket_ = sock;
        });
        http_.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{\"status\":\"ok\"}", "application/json"); });
        http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(json{{"object", "list"}, {"data", {{{"id", o_.name}, {"object", "model"}, {"owned_by", "kiln"}}}}}.dump(), "application/json");
        });
        http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { res.set_content(metricsText(), "text/plain; version=0.0.4"); });
        http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, false); });
        http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, true); });
    }

    void listen() {
        const int port = o_.port == 0 ? http_.bind_to_any_port(o_.host) : (http_.bind_to_port(o_.host, o_.port) ? o_.port : -1);
        check(port > 0, "cannot listen on " + o_.host + ":" + std::to_string(o_.port));
        std::printf("kiln serve: %s on http://%s:%d\n", o_.name.c_str(), o_.host.c_str(), port);
        std::fflush(stdout);
        if (listen_socket_ >= 0) ::listen(listen_socket_, SOMAXCONN);  // re-listening on Linux only changes the backlog
        http_.listen_after_bind();
    }
    void stop() { http_.stop(); }

private:
    socket_t listen_socket_ = -1;
    llm::Request parse(const json& body, bool chat, std::string* prompt_text) {
        llm::Request r;
        if (chat) {
            if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
                throw BadRequest{400, "'messages' must be a non-empty list", "", "messages"};
            if (!m_.tokenizer) throw BadRequest{400, "this model has no tokenizer.json: use /v1/completions with token ids", "", "messages"};
            for (const auto& msg : body["messages"]) {  // a plain "role: content" template
                if (!msg.is_object() || !msg.contains("content") || !msg["content"].is_string()) throw BadRequest{400, "each message needs string 'content'", "", "messages"};
                *prompt_text += msg.value("role", "user") + ": " + msg["content"].get<std::string>() + "\n";
            }
            *prompt_text += "assistant:";
            r.prompt = m_.tokenizer->encode(*prompt_text);
        } else {
            if (!body.contains("prompt")) throw BadRequest{400, "'prompt' is required", "", "prompt"};
            const json& p = body["prompt"];
            if (p.is_string()) {
                if (!m_.tokenizer) throw BadRequest{400, "this model has no tokenizer.json: send 'prompt' as a list of token ids", "", "prompt"};
                r.prompt = m_.tokenizer->encode(p.get<std::string>());
            } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& t) { return t.is_number_integer(); })) {
                r.prompt = p.get<std::vector<int64_t>>();
            } else {
                throw BadRequest{400, "'prompt' must be a string or a non-empty list of token ids", "", "prompt"};
            }
        }
        if (r.prompt.empty()) throw BadRequest{400, "the prompt is empty", "", "prompt"};
        auto number = [&](const char* key, auto fallback) {
            using T = decltype(fallback);
            if (!body.contains(key) || body[key].is_null()) return fallback;
            if (!body[key].is_number()) throw BadRequest{400, std::string("'") + key + "' must be a number", "", key};
            return body[key].get<T>();
        };
        r.max_tokens = number("max_tokens", int64_t(16));
        r.sampling.temperature = number("temperature", 1.0f);
        r.sampling.top_p = number("top_p", 1.0f);
        r.sampling.top_k = number("top_k", int64_t(0));
        r.sampling.repetition_penalty = number("repetition_penalty", 1.0f);
        r.sampling.seed = number("seed", uint64_t(0));
        if (r.max_tokens < 1) throw BadRequest{400, "'max_tokens' must be at least 1", "", "max_tokens"};
        if (r.sampling.temperature < 0 || r.sampling.temperature > 100) throw BadRequest{400, "'temperature' must be in [0, 100]", "", "temperature"};
        if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) throw BadRequest{400, "'top_p' must be in (0, 1]", "", "top_p"};
        if (body.contains("stop_token_ids") && body["stop_token_ids"].is_array()) r.stop_tokens = body["stop_token_ids"].get<std::vector<int64_t>>();
        const int64_t context = m_.model->config().max_positions;
        if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > context)
            throw BadRequest{400,
                             "This model's maximum context length is " + std::to_string(context) + " tokens; the request asks for " +
                                 std::to_string(r.prompt.size()) + " prompt + " + std::to_string(r.max_tokens) + " completion tokens",
                             "context_length_exceeded", "max_tokens"};
        for (int64_t t : r.prompt)
            if (t < 0 || t >= m_.model->config().vocab) throw BadRequest{400, "token id " + std::to_string(t) + " is outside the vocabulary", "", "prompt"};
        return r;
    }

    std::string text(const std::vector<int64_t>& tokens) const { return m_.tokenizer ? m_.tokenizer->decode(tokens) : std::string(); }

    json choice(bool chat, const std::vector<int64_t>& tokens, const char* finish, bool delta) const {
        json c = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
        if (chat) c[delta ? "delta" : "message"] = {{"role", "assistant"}, {"content", text(tokens)}};
        else c["text"] = text(tokens);
        if (!chat) c["token_ids"] = tokens;
        return c;
    }

    void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
        const json body = json::parse(req.body, nullptr, false);
        if (!body.is_object()) return sendError(res, {400, "the body must be a JSON object"});
        llm::Request r;
        std::string prompt_text;
        try {
            r = parse(body, chat, &prompt_text);
        } catch (const BadRequest& e) {
            return sendError(res, e);
        } catch (const std::exception& e) {
            return sendError(res, {400, e.what()});
        }
        auto stream = engine_.submit(r);
        if (!stream) return sendError(res, {429, "the server is at capacity; retry later"});
        const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
        const json head = {{"id", id}, {"object", chat ? (body.value("stream", false) ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
                           {"created", static_cast<int64_t>(std::time(nullptr))}, {"model", o_.name}};
        if (body.value("stream", false)) {
            res.set_header("Cache-Control", "no-cache");
            auto sent = std::make_shared<size_t>(0);
            res.set_chunked_content_provider("text/event-stream", [this, stream, sent, head, chat](size_t, httplib::DataSink& sink) {
                std::unique_lock<std::mutex> lock(stream->mutex);
                stream->changed.wait_for(lock, std::chrono::milliseconds(200), [&] { return stream->tokens.size() > *sent || stream->finished != llm::FinishReason::None; });
                std::vector<int64_t> fresh(stream->tokens.begin() + static_cast<std::ptrdiff_t>(*sent), stream->tokens.end());
                const llm::FinishReason f = stream->finished;
                const std::string error = stream->error;
                lock.unlock();
                *sent += fresh.size();
                if (!fresh.empty()) {
                    json chunk = head;
                    chunk["choices"] = {choice(chat, fresh, nullptr, true)};
                    const std::string event = "data: " + chunk.dump() + "\n\n";
                    if (!sink.write(event.data(), event.size())) {  // the client went away: stop its request
                        engine_.cancel(stream);
                        return false;
                    }
                }
                if (f != llm::FinishReason::None) {
                    json last = head;
                    last["choices"] = {choice(chat, {}, error.empty() ? reasonText(f) : "error", true)};
                    const std::string event = "data: " + last.dump() + "\n\ndata: [DONE]\n\n";
                    sink.write(event.data(), event.size());
                    sink.done();
                }
                return true;
            }, [this, stream](bool success) {
                if (!success) engine_.cancel(stream);
            });
            return;
        }
        std::unique_lock<std::mutex> lock(stream->mutex);
        stream->changed.wait(lock, [&] { return stream->finished != llm::FinishReason::None; });
        if (!stream->error.empty()) return sendError(res, {400, stream->error});
        json out = head;
        out["choices"] = {choice(chat, stream->tokens, reasonText(stream->finished), false)};
        out["usage"] = {{"prompt_tokens", r.prompt.size()}, {"completion_tokens", stream->tokens.size()}, {"total_tokens", r.prompt.size() + stream->tokens.size()}};
        res.set_content(out.dump(), "application/json");
    }

    std::string metricsText() {
        const llm::EngineMetrics m = engine_.metrics();
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

    ServeOptions o_;
    LoadedLlm m_;
    llm::LlmEngine engine_;
    httplib::Server http_;
    std::atomic<int64_t> next_id_{0};
};

Server* g_server = nullptr;

void execute(ServeOptions& o) {
    Server server(o, loadLlm(o.model, o.target));
    g_server = &server;
    std::signal(SIGTERM, [](int) { if (g_server) g_server->stop(); });
    std::signal(SIGINT, [](int) { if (g_server) g_server->stop(); });
    server.listen();
    g_server = nullptr;
}

}  // namespace

void addServeCommand(CLI::App& app) {
    auto o = std::make_shared<ServeOptions>();
    CLI::App* cmd = app.add_subcommand("serve", "Serve a decoder model over an OpenAI-compatible HTTP API");
    cmd->add_option("model", o->model, "Model folder (config.json, model.safetensors, optional tokenizer.json)")->required();
    addLlmTargetOption(*cmd, o->target);
    cmd->add_option("--host", o->host, "Address to listen on");
    cmd->add_option("--port", o->port, "Port (0: any free port, printed at start)");
    cmd->add_option("--served-model-name", o->name, "Model id reported by /v1/models");
    cmd->add_option("--max-queue", o->max_queue, "Outstanding requests before new ones get 429");
    cmd->add_option("--max-batch-size", o->scheduler.max_batch_size, "Sequences per step");
    cmd->add_option("--max-num-tokens", o->scheduler.max_num_tokens, "Tokens per step (chunked prefill budget)");
    cmd->add_option("--block-size", o->scheduler.block_size, "KV cache block size in tokens");
    cmd->add_option("--num-blocks", o->scheduler.num_blocks, "KV cache blocks");
    cmd->callback([o] { execute(*o); });
}

}  // namespace kiln::tools
