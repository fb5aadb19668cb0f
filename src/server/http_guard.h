// What keeps an HTTP server on cpp-httplib answering under slow, idle and abusive clients:
// a thread per connection (so /health never waits behind slow clients), a deadline on
// reading each request (slowloris), and a way to cut every connection when a drain ends.
#pragma once
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::server {

// A task queue that starts a thread whenever no idle one is waiting, up to `max_threads`
// (past that, connections queue). httplib's fixed pool lets slow clients hold every worker.
class ElasticPool : public httplib::TaskQueue {
public:
    explicit ElasticPool(size_t max_threads) : max_threads_(max_threads) {}
    ~ElasticPool() override { shutdown(); }
    void enqueue(std::function<void()> fn) override;
    void shutdown() override;

private:
    void work();
    size_t max_threads_, idle_ = 0;
    bool stop_ = false;
    std::mutex mutex_;
    std::condition_variable ready_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
};

// Closes connections that take longer than `timeout` to deliver a request's headers and
// body, measured from the connection's first sight or from its last response. Handlers
// call busy() when a request has arrived and the logger calls done() after its response,
// so a long streamed answer is never cut. It finds the server's connections by scanning
// the process's sockets bound to `port`.
class RequestDeadlines {
public:
    RequestDeadlines(int port, std::chrono::milliseconds timeout);
    ~RequestDeadlines();
    void busy(const httplib::Request& req);
    void done(const httplib::Request& req);
    // Shuts down every connection of the server now (the end of a drain).
    void closeAll();

private:
    struct Connection {
        std::chrono::steady_clock::time_point since;
        bool busy = false;
    };
    void watch();
    void set(const std::string& peer, bool busy);
    int port_;
    std::chrono::milliseconds timeout_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::map<std::string, Connection> connections_;  // by peer "address:port"
    bool stop_ = false, close_all_ = false;
    std::thread thread_;
};

// Registers `handler` for `method` on `path`, and a 405 answer for the other methods there.
void routeOnly(httplib::Server& http, const std::string& method, const std::string& path, httplib::Server::Handler handler,
               const std::function<void(httplib::Response&, int, const std::string&)>& send_error);

}  // namespace kiln::server
