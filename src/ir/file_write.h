// Every file Kiln writes goes through here, so that nothing a user asked for is lost in
// silence: a full disk, a short write or a failed close is an Error naming the file, and a
// replaced file is never left half-written (the bytes go to a temporary name in the same
// folder, are synced, and are renamed over the target).
#pragma once
#include <filesystem>
#include <string_view>

namespace kiln {

// Writes `bytes` as the whole of `path`, atomically. Throws Error naming `path`.
void writeFileAtomically(const std::filesystem::path& path, std::string_view bytes);
// Appends `bytes` to `path` (created if missing) and syncs it: for append-only logs such as
// the tuning cache, where a crash must lose at most the record being written.
void appendToFile(const std::filesystem::path& path, std::string_view bytes);

}  // namespace kiln
