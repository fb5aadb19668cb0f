// An OpenAI-compatible HTTP server over the LLM runtime: /v1/completions and
// /v1/chat/completions (with server-sent-event streaming), /v1/models, /health and
// /metrics (Prometheus text). Every answer that is not a completion is an OpenAI-style
// JSON error; no request, however malformed, slow or abandoned, takes the server down.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "llm/language_model.h"
#include "llm/scheduler.h"
#include "llm/tokenizer.h"

namespace kiln::llm::server {

struct ServerOptions {
    std::string host = "127.0.0.1", name;
    int port = 8000;  // 0: any free port
    int64_t max_queue = 64;
    size_t max_body_bytes = 16 << 20;             // larger bodies get 413
    std::chrono::milliseconds read_timeout{10000};  // for a request's headers and body
    size_t max_connections = 1024;                 // connections served at once; more wait
    SchedulerOptions scheduler;
};

class OpenAiServer {
public:
    OpenAiServer(ServerOptions options, const LanguageModel& model, std::shared_ptr<Tokenizer> tokenizer);
    ~OpenAiServer();
    // Binds (throws Error when it cannot), calls on_listening(port), and serves until stop().
    void run(const std::function<void(int port)>& on_listening);
    // Stops taking connections and lets requests in flight finish for up to `drain`; then
    // cancels what is left and closes every connection. run() returns soon after.
    void stop(std::chrono::milliseconds drain);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::llm::server
