// `kiln serve MODEL_DIR`: starts the OpenAI-compatible server (llm/server) on a model
// folder. SIGTERM and SIGINT drain it: no new connections, requests in flight get
// --drain-timeout to finish, then the rest are cancelled and the process exits.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <thread>

#include "llm/server/openai_server.h"
#include "tools/commands.h"
#include "tools/llm_common.h"

namespace kiln::tools {

namespace {

struct ServeOptions {
    std::string model;
    LlmTarget target;
    double drain_seconds = 3, read_timeout_seconds = 10;
    llm::server::ServerOptions server;
};

void execute(ServeOptions& o) {
    check(o.drain_seconds >= 0 && o.drain_seconds <= 3600, "--drain-timeout must be in [0, 3600] seconds");
    check(o.read_timeout_seconds >= 1 && o.read_timeout_seconds <= 3600, "--read-timeout must be in [1, 3600] seconds");
    o.server.read_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.read_timeout_seconds * 1000));
    if (o.server.name.empty()) o.server.name = std::filesystem::path(o.model).filename().string();
    // The signals are taken by one thread (sigwait), never by a handler interrupting
    // arbitrary code: blocked here, before any other thread starts, so all inherit that.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGUSR2);  // from this thread: run() has ended, the waiter may go
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    applyLlmRoute(o.target, o.server.scheduler);
    LoadedLlm m = loadLlm(o.model, o.target);
    llm::server::OpenAiServer server(o.server, *m.model, m.tokenizer);
    std::thread waiter([&] {
        int sig = 0;
        sigwait(&signals, &sig);
        if (sig == SIGUSR2) return;  // run() ended on its own
        server.stop(std::chrono::milliseconds(static_cast<int64_t>(o.drain_seconds * 1000)));
    });
    auto end_waiter = [&] {
        pthread_kill(waiter.native_handle(), SIGUSR2);
        waiter.join();
    };
    try {
        server.run([&](int port) {
            std::printf("kiln serve: %s on http://%s:%d\n", o.server.name.c_str(), o.server.host.c_str(), port);
            std::fflush(stdout);
        });
    } catch (...) {
        end_waiter();
        throw;
    }
    end_waiter();
}

}  // namespace

void addServeCommand(CLI::App& app) {
    auto o = std::make_shared<ServeOptions>();
    CLI::App* cmd = app.add_subcommand("serve", "Serve a decoder model over an OpenAI-compatible HTTP API");
    cmd->add_option("model", o->model, "Model folder (config.json, model.safetensors or its shards, optional tokenizer.json)")->required();
    addLlmTargetOption(*cmd, o->target);
    auto& s = o->server;
    cmd->add_option("--host", s.host, "Address to listen on")->capture_default_str();
    cmd->add_option("--port", s.port, "Port (0: any free port, printed at start)")->capture_default_str()->check(CLI::Range(0, 65535));
    cmd->add_option("--served-model-name", s.name, "Model id reported by /v1/models and required in 'model' (default: the folder's name)");
    cmd->add_option("--max-queue", s.max_queue, "Outstanding requests before new ones get 429")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    cmd->add_option("--max-body-bytes", s.max_body_bytes, "Largest request body; larger ones get 413")->capture_default_str()->check(CLI::Range(size_t(1024), size_t(1) << 32));
    cmd->add_option("--max-connections", s.max_connections, "Connections served at once (one thread each); more wait")->capture_default_str()->check(CLI::Range(size_t(4), size_t(65536)));
    cmd->add_option("--read-timeout", o->read_timeout_seconds, "Seconds a client may take to send a request's headers and body")->capture_default_str();
    cmd->add_option("--drain-timeout", o->drain_seconds, "Seconds requests in flight get to finish after SIGTERM")->capture_default_str();
    cmd->add_option("--max-batch-size", s.scheduler.max_batch_size, "Sequences per step")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
    cmd->add_option("--max-num-tokens", s.scheduler.max_num_tokens, "Tokens per step (chunked prefill budget)")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
    cmd->add_option("--block-size", s.scheduler.block_size, "KV cache block size in tokens")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
    cmd->add_option("--num-blocks", s.scheduler.num_blocks, "KV cache blocks")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 30));
    cmd->callback([o] { execute(*o); });
}

}  // namespace kiln::tools
