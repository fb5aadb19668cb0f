// Subcommands of the `kiln` CLI. Each add*Command registers its options and a callback;
// callbacks throw kiln::Error, which main() turns into one `kiln: error:` line.
#pragma once
#include <CLI/CLI.hpp>

namespace kiln::tools {

void addRunCommand(CLI::App& app);

}  // namespace kiln::tools
