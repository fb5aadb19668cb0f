#include "test_helpers.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kiln::testing {

namespace fs = std::filesystem;

TempDir::TempDir() {
    static std::mt19937_64 rng(std::random_device{}());
    path_ = fs::temp_directory_path() / ("kiln-test-" + std::to_string(rng()));
    fs::create_directories(path_);
}
TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
}

onnx::ModelProto makeModel(const std::vector<int64_t>& shape, int64_t opset) {
    onnx::ModelProto m;
    m.set_ir_version(8);
    auto* imp = m.add_opset_import();
    imp->set_domain("");
    imp->set_version(opset);
    auto* g = m.mutable_graph();
    g->set_name("test");
    for (auto [name, list] : {std::pair{"x", g->add_input()}, std::pair{"y", g->add_output()}}) {
        list->set_name(name);
        auto* tt = list->mutable_type()->mutable_tensor_type();
        tt->set_elem_type(onnx::TensorProto::FLOAT);
        if (std::string(name) == "x")
            for (int64_t d : shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
    }
    return m;
}

onnx::NodeProto* addNode(onnx::ModelProto& m, const std::string& op, const std::vector<std::string>& inputs,
                         const std::vector<std::string>& outputs) {
    auto* n = m.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(m.graph().node_size()));
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return n;
}

void saveModel(const onnx::ModelProto& m, const fs::path& path) { writeFile(path, m.SerializeAsString()); }

void writeFile(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string readFile(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

Tensor randomTensor(const Dims& dims, std::mt19937& rng, float lo, float hi) {
    Tensor t(DType::F32, dims);
    std::uniform_real_distribution<float> d(lo, hi);
    for (auto& v : t.span<float>()) v = d(rng);
    return t;
}

int runCommand(const std::string& command, std::string* output) {
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    if (!pipe) return -1;
    std::array<char, 4096> buf{};
    std::string out;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
    int status = pclose(pipe);
    if (output) *output = out;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace kiln::testing
