// `kiln serve` as a child process on loopback, for the server tests: started with
// --port 0, it prints the port it took; SIGTERM ends it when the test is done.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

namespace kiln::testing {

struct ServerProcess {
    pid_t pid = -1;
    int port = 0;
    ServerProcess(const std::filesystem::path& dir, const std::string& extra) {
        int fds[2];
        EXPECT_EQ(pipe(fds), 0);
        pid = fork();
        if (pid == 0) {
            dup2(fds[1], 1);
            close(fds[0]);
            const std::string cmd = std::string(KILN_BIN) + " serve " + dir.string() + " --port 0 " + extra;
            execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
            _exit(127);
        }
        close(fds[1]);
        std::string line;
        char c;
        while (read(fds[0], &c, 1) == 1 && c != '\n') line += c;  // "kiln serve: NAME on http://127.0.0.1:PORT"
        close(fds[0]);
        const size_t colon = line.rfind(':');
        port = colon == std::string::npos ? 0 : std::atoi(line.c_str() + colon + 1);
    }
    ~ServerProcess() {
        if (pid > 0) {
            kill(pid, SIGTERM);
            int status = 0;
            waitpid(pid, &status, 0);
        }
    }
};

// The data of each server-sent event in `body`, up to "data: [DONE]".
inline std::vector<std::string> sseEvents(const std::string& body) {
    std::vector<std::string> events;
    for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
        const size_t end = body.find("\n\n", at);
        std::string data = body.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
        if (data == "[DONE]") break;
        events.push_back(std::move(data));
        if (end == std::string::npos) break;
        at = end;
    }
    return events;
}

// POSTs `body` (a streamed request) to `path` on its own connection and hangs up after the
// first chunk of the answer, as a client that goes away.
inline void streamThenHangUp(int port, const std::string& path, const std::string& body) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    bool first = true;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
        const bool more = !first;
        first = false;
        return more;
    };
    httplib::Response res;
    httplib::Error err;
    httplib::Client dropping("127.0.0.1", port);
    dropping.send(req, res, err);
}

}  // namespace kiln::testing
