#include "server/http_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace kiln::server {

void ElasticPool::enqueue(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return;
    jobs_.push_back(std::move(fn));
    if (idle_ == 0 && threads_.size() < max_threads_) threads_.emplace_back([this] { work(); });
    else ready_.notify_one();
}

void ElasticPool::shutdown() {
    std::vector<std::thread> threads;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        threads.swap(threads_);
    }
    ready_.notify_all();
    for (auto& t : threads) t.join();
}

void ElasticPool::work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        ++idle_;
        ready_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;  // stopping, nothing left to serve
        std::function<void()> job = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        job();
        lock.lock();
    }
}

namespace {

std::string peerName(const sockaddr_storage& a) {
    char host[INET6_ADDRSTRLEN] = {};
    int port = 0;
    if (a.ss_family == AF_INET) {
        const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
        inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
        port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
        const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
        inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
        port = ntohs(v6->sin6_port);
    }
    return std::string(host) + ":" + std::to_string(port);
}

int localPort(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
    return -1;
}

// The process's connected TCP sockets whose local port is `port`, by peer name.
std::map<std::string, int> connectedSockets(int port) {
    std::map<std::string, int> out;
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return out;
    while (dirent* e = readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end) continue;
        struct stat st;
        if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        sockaddr_storage local{}, peer{};
        socklen_t ll = sizeof local, pl = sizeof peer;
        if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 || localPort(local) != port) continue;
        if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;  // the listening socket
        out[peerName(peer)] = static_cast<int>(fd);
    }
    closedir(dir);
    return out;
}

std::string peerOf(const httplib::Request& req) { return req.remote_addr + ":" + std::to_string(req.remote_port); }

}  // namespace

RequestDeadlines::RequestDeadlines(int port, std::chrono::milliseconds timeout) : port_(port), timeout_(timeout) {
    thread_ = std::thread([this] { watch(); });
}

RequestDeadlines::~RequestDeadlines() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void RequestDeadlines::set(const std::string& peer, bool busy) {
    std::lock_guard<std::mutex> lock(mutex_);
    connections_[peer] = {std::chrono::steady_clock::now(), busy};
}
void RequestDeadlines::busy(const httplib::Request& req) { set(peerOf(req), true); }
void RequestDeadlines::done(const httplib::Request& req) { set(peerOf(req), false); }

void RequestDeadlines::closeAll() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        close_all_ = true;
    }
    wake_.notify_all();
}

void RequestDeadlines::watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
        wake_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stop_ || close_all_; });
        if (stop_) break;
        lock.unlock();
        const std::map<std::string, int> sockets = connectedSockets(port_);
        lock.lock();
        const auto now = std::chrono::steady_clock::now();
        std::map<std::string, Connection> seen;
        for (const auto& [peer, fd] : sockets) {
            auto it = connections_.find(peer);
            const Connection c = it == connections_.end() ? Connection{now, false} : it->second;
            // shutdown(), not close(): the thread serving the socket still owns it; its read
            // or write fails at once and it closes the socket itself.
            if (close_all_ || (!c.busy && now - c.since > timeout_)) shutdown(fd, SHUT_RDWR);
            else seen[peer] = c;
        }
        connections_.swap(seen);  // forget connections that are gone
    }
}

void routeOnly(httplib::Server& http, const std::string& method, const std::string& path, httplib::Server::Handler handler,
               const std::function<void(httplib::Response&, int, const std::string&)>& send_error) {
    auto refuse = [method, send_error](const httplib::Request& req, httplib::Response& res) {
        res.set_header("Allow", method);
        send_error(res, 405, "method " + req.method + " is not allowed here; use " + method);
    };
    const std::pair<const char*, httplib::Server& (httplib::Server::*)(const std::string&, httplib::Server::Handler)> methods[] = {
        {"GET", &httplib::Server::Get}, {"POST", &httplib::Server::Post}, {"PUT", &httplib::Server::Put},
        {"PATCH", &httplib::Server::Patch}, {"DELETE", &httplib::Server::Delete}, {"OPTIONS", &httplib::Server::Options}};
    for (const auto& [name, add] : methods) (http.*add)(path, name == method ? handler : httplib::Server::Handler(refuse));
}

}  // namespace kiln::server
