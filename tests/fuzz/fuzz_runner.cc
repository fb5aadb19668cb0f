#include "fuzz_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "ir/error.h"

namespace kiln::fuzz {

namespace {
// The child's exit codes; anything else, or a signal, is a crash.
constexpr int kRan = 0, kClean = 10, kUnclear = 11;
}  // namespace

void Tally::add(Outcome o) {
    ++tried;
    switch (o) {
        case Outcome::Ran: ++ran; break;
        case Outcome::CleanError: ++clean; break;
        case Outcome::UnclearError: ++unclear; break;
        case Outcome::Crash: ++crashes; break;
        case Outcome::Hang: ++hangs; break;
    }
}

Outcome runIsolated(const std::function<void()>& work, std::chrono::seconds limit, bool verbose, std::string* detail) {
    int fds[2];
    if (pipe(fds) != 0) return Outcome::Crash;
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (!verbose) {
            const int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
        }
        auto report = [&](const std::string& what) {
            const ssize_t n = write(fds[1], what.data(), std::min<size_t>(what.size(), 4000));
            (void)n;
        };
        int code = kRan;
        try {
            work();
        } catch (const Error& e) {
            report(e.what());
            code = kClean;
        } catch (const std::exception& e) {
            report(std::string("non-kiln exception: ") + e.what());
            code = kUnclear;
        } catch (...) {
            report("non-kiln exception of unknown type");
            code = kUnclear;
        }
        _exit(code);  // no destructors or atexit handlers of the parent's state
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    std::string message;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    bool done = false;
    for (auto pause = std::chrono::microseconds(200); !done;) {
        char buf[1024];
        for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<size_t>(n));
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            close(fds[0]);
            if (detail) *detail = "no answer within " + std::to_string(limit.count()) + " s";
            return Outcome::Hang;
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
    char buf[1024];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    if (detail) *detail = message;
    if (WIFSIGNALED(status)) {
        if (detail) *detail = std::string("killed by signal ") + strsignal(WTERMSIG(status));
        return Outcome::Crash;
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == kRan) return Outcome::Ran;
    if (code == kClean) return Outcome::CleanError;
    if (code == kUnclear) return Outcome::UnclearError;
    if (detail) *detail = "exit code " + std::to_string(code) + (message.empty() ? "" : ": " + message);
    return Outcome::Crash;  // a sanitizer's report exits with its own code
}

std::string tallyTable(const std::map<std::string, Tally>& tallies) {
    std::string out = "| input kind | inputs tried | ran | clean errors | unclear errors | crashes | hangs |\n|---|---|---|---|---|---|---|\n";
    Tally total;
    auto row = [&](const std::string& name, const Tally& t) {
        char line[256];
        std::snprintf(line, sizeof line, "| %s | %lld | %lld | %lld | %lld | %lld | %lld |\n", name.c_str(), static_cast<long long>(t.tried), static_cast<long long>(t.ran),
                      static_cast<long long>(t.clean), static_cast<long long>(t.unclear), static_cast<long long>(t.crashes), static_cast<long long>(t.hangs));
        out += line;
    };
    for (const auto& [name, t] : tallies) {
        row(name, t);
        total.tried += t.tried, total.ran += t.ran, total.clean += t.clean, total.unclear += t.unclear, total.crashes += t.crashes, total.hangs += t.hangs;
    }
    row("**all**", total);
    return out;
}

}  // namespace kiln::fuzz
