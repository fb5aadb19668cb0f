// UTF-8 at the edges where text leaves Kiln: tokens decode to bytes, and a token boundary
// may fall inside one character (byte-level BPE splits emoji and CJK characters).
#pragma once
#include <string>
#include <string_view>

namespace kiln::llm {

// `bytes` with every ill-formed sequence replaced by U+FFFD, one per maximal ill-formed
// subpart (the Unicode "substitution of maximal subparts" practice, as Python and ICU do).
std::string sanitizeUtf8(std::string_view bytes);

// Length of the longest prefix of `bytes` that does not end inside a character that later
// bytes could still complete: a trailing lead byte with fewer continuation bytes than it
// announces is held back; everything before it (valid or not) is returned.
size_t completeUtf8Prefix(std::string_view bytes);

}  // namespace kiln::llm
