#include "llm/utf8.h"

namespace kiln::llm {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// What starts at bytes[i]: `length` bytes that are one well-formed character (`complete`),
// or else the maximal subpart of one (at least the first byte), and whether that subpart
// was cut short by the end of `bytes` (`truncated`) rather than by a wrong byte. Follows
// Table 3-7 of the Unicode standard: no overlong forms, no surrogates, nothing past U+10FFFF.
struct Scan {
    size_t length;
    bool complete, truncated;
};

Scan scan(std::string_view bytes, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return {1, true, false};
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return {1, false, false};
    for (size_t k = 1; k < need; ++k) {
        if (i + k >= bytes.size()) return {k, false, true};
        const unsigned char x = b(i + k);
        if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return {k, false, false};
    }
    return {need, true, false};
}

}  // namespace

std::string sanitizeUtf8(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    for (size_t i = 0; i < bytes.size();) {
        const Scan s = scan(bytes, i);
        if (s.complete) out.append(bytes.substr(i, s.length));
        else out.append(kReplacement);
        i += s.length;
    }
    return out;
}

size_t completeUtf8Prefix(std::string_view bytes) {
    for (size_t i = 0; i < bytes.size();) {
        const Scan s = scan(bytes, i);
        if (s.truncated) return i;
        i += s.length;
    }
    return bytes.size();
}

}  // namespace kiln::llm
