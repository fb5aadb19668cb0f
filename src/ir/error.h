// The one error type of Kiln: expected failures (bad model, bad flag, bad file) throw it
// with a message that names the node, file or flag at fault. The CLI prints it as one line.
#pragma once
#include <stdexcept>
#include <string>
#include <type_traits>

namespace kiln {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Checks a user-facing condition; throws Error with the message when it fails.
inline void check(bool condition, const std::string& message) {
    if (!condition) throw Error(message);
}
// The same with the message made only on failure (message() returns it): for checks on
// every run, where building the string would cost more than the check.
template <typename MakeMessage, std::enable_if_t<std::is_invocable_r_v<std::string, MakeMessage>, int> = 0>
inline void check(bool condition, MakeMessage&& message) {
    if (!condition) throw Error(message());
}

}  // namespace kiln
