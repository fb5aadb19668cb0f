#include "ir/file_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ir/error.h"

namespace kiln {

namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const char* what, int err) {
    throw Error(path.string() + ": " + what + " (" + std::strerror(err) + ")");
}

// write(2) until every byte is out; short writes continue, EINTR retries.
void writeAll(int fd, std::string_view bytes, const std::filesystem::path& path) {
    for (size_t done = 0; done < bytes.size();) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail(path, "cannot write the file", n < 0 ? errno : ENOSPC);
        done += static_cast<size_t>(n);
    }
}

// Writes, syncs and closes `fd`; closes it on failure too.
void writeSyncClose(int fd, std::string_view bytes, const std::filesystem::path& path) {
    try {
        writeAll(fd, bytes, path);
        if (::fsync(fd) != 0) fail(path, "cannot write the file to disk", errno);
    } catch (...) {
        ::close(fd);
        throw;
    }
    if (::close(fd) != 0) fail(path, "cannot write the file to disk", errno);
}

}  // namespace

void writeFileAtomically(const std::filesystem::path& path, std::string_view bytes) {
    const std::filesystem::path temp = path.string() + ".tmp-" + std::to_string(::getpid());
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(path, "cannot create the file", errno);
    try {
        writeSyncClose(fd, bytes, path);
    } catch (...) {
        ::unlink(temp.c_str());
        throw;
    }
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        fail(path, "cannot replace the file", err);
    }
}

void appendToFile(const std::filesystem::path& path, std::string_view bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) fail(path, "cannot open the file for appending", errno);
    writeSyncClose(fd, bytes, path);
}

}  // namespace kiln
