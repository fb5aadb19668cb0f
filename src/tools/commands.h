// Subcommands of the `kiln` CLI. Each add*Command registers its options and a callback;
// callbacks throw kiln::Error, which main() turns into one `kiln: error:` line.
#pragma once
#include <CLI/CLI.hpp>

namespace kiln::tools {

void addRunCommand(CLI::App& app);
void addBuildCommand(CLI::App& app);
void addCalibrateCommand(CLI::App& app);
void addBenchCommand(CLI::App& app);
void addInspectCommand(CLI::App& app);
void addRoutesCommand(CLI::App& app);
void addTuneCommand(CLI::App& app);
void addGenerateCommand(CLI::App& app);
void addBenchLlmCommand(CLI::App& app);
void addServeCommand(CLI::App& app);

}  // namespace kiln::tools
