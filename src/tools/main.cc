// The `kiln` command-line tool: a thin layer over the library.
#include <cstdlib>
#include <iostream>

#include "backends/cpu/fast/tactics.h"
#include "ir/error.h"
#include "ir/tensor.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
    CLI::App app{"Kiln: an inference compiler with a global performance tuner", "kiln"};
    app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION);
    app.require_subcommand(1);
    app.fallthrough();  // global options may come after the command
    size_t max_tensor_bytes = 0;
    app.add_option("--max-tensor-bytes", max_tensor_bytes, "Largest tensor, in bytes, a model or input may make Kiln allocate (default: physical memory, or KILN_MAX_TENSOR_BYTES)")
        ->check(CLI::PositiveNumber)
        ->each([](const std::string& v) { kiln::setMaxTensorBytes(std::stoull(v)); });
    app.add_option("--threads", "CPU threads for kernels and BLAS (default: all cores, or OMP_NUM_THREADS)")
        ->check(CLI::PositiveNumber)
        ->each([](const std::string& v) { kiln::setCpuThreads(std::stoi(v)); });
    kiln::tools::addRunCommand(app);
    kiln::tools::addBuildCommand(app);
    kiln::tools::addCalibrateCommand(app);
    kiln::tools::addBenchCommand(app);
    kiln::tools::addInspectCommand(app);
    kiln::tools::addRoutesCommand(app);
    kiln::tools::addTuneCommand(app);
    kiln::tools::addGenerateCommand(app);
    kiln::tools::addBenchLlmCommand(app);
    kiln::tools::addServeCommand(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "kiln: error: " << e.what() << " (see --help)\n";
        return 2;
    } catch (const kiln::Error& e) {
        std::cerr << "kiln: error: " << e.what() << "\n";
        return 1;
    } catch (const std::bad_alloc&) {
        std::cerr << "kiln: error: out of memory\n";
        return 3;
    } catch (const std::exception& e) {
        std::cerr << "kiln: error: internal error: " << e.what() << "\n";
        return 4;
    }
    return 0;
}
