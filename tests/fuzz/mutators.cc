#include "mutators.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::fuzz {

int64_t interestingInt(Rng& rng) {
    static const int64_t values[] = {0, -1, 1, 2, 3, 7, -2, 255, 65536, int64_t(1) << 31, (int64_t(1) << 31) - 1, int64_t(1) << 32,
                                     (int64_t(1) << 62) + 1, int64_t(1) << 62, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                                     -(int64_t(1) << 62), 1000000007};
    if (rng() % 4 == 0) return static_cast<int64_t>(rng() % 9) - 2;
    return values[rng() % (sizeof values / sizeof values[0])];
}

float interestingFloat(Rng& rng) {
    static const float values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                   0.f, -0.f, -1.f, 1.f, 1e9f, -1e9f, 1e-30f, 3.4e38f, 0.5f, 1e-45f};
    return values[rng() % (sizeof values / sizeof values[0])];
}

namespace {

void mutateAttribute(onnx::AttributeProto& a, Rng& rng) {
    switch (a.type()) {
        case onnx::AttributeProto::INT: a.set_i(interestingInt(rng)); break;
        case onnx::AttributeProto::FLOAT: a.set_f(interestingFloat(rng)); break;
        case onnx::AttributeProto::INTS:
            switch (rng() % 4) {
                case 0: a.clear_ints(); break;
                case 1: a.add_ints(interestingInt(rng)); break;
                case 2: if (a.ints_size()) a.mutable_ints()->RemoveLast(); break;
                default:
                    for (int k = 0; k < a.ints_size(); ++k)
                        if (rng() % 2) a.set_ints(k, interestingInt(rng));
            }
            break;
        case onnx::AttributeProto::FLOATS:
            if (rng() % 3 == 0) a.clear_floats();
            for (int k = 0; k < a.floats_size(); ++k)
                if (rng() % 2) a.set_floats(k, interestingFloat(rng));
            break;
        case onnx::AttributeProto::STRING: {
            static const char* values[] = {"", "garbage", "SAME_UPPER", "VALID", "nearest", "cubic", "linear", "NOTSET", "\xff\xfe"};
            a.set_s(values[rng() % (sizeof values / sizeof values[0])]);
            break;
        }
        default: a.set_type(static_cast<onnx::AttributeProto::AttributeType>(rng() % 15)); break;
    }
}

// Overwrites one element of an initializer's data with an interesting value of its type:
// shape inputs (Reshape, Expand, Slice, Pad, OneHot depth, Resize scales) drive sizes.
void mutateInitializerValue(onnx::TensorProto& t, Rng& rng) {
    std::string* raw = t.mutable_raw_data();
    const bool ints = t.data_type() == onnx::TensorProto::INT64 || t.data_type() == onnx::TensorProto::INT32;
    const size_t width = t.data_type() == onnx::TensorProto::INT64 ? 8 : 4;
    if (!raw->empty() && raw->size() >= width) {
        const size_t at = (rng() % (raw->size() / width)) * width;
        if (t.data_type() == onnx::TensorProto::INT64) {
            const int64_t v = interestingInt(rng);
            std::memcpy(raw->data() + at, &v, 8);
        } else if (t.data_type() == onnx::TensorProto::INT32) {
            const int32_t v = static_cast<int32_t>(interestingInt(rng));
            std::memcpy(raw->data() + at, &v, 4);
        } else if (t.data_type() == onnx::TensorProto::FLOAT) {
            const float v = interestingFloat(rng);
            std::memcpy(raw->data() + at, &v, 4);
        } else {
            (*raw)[rng() % raw->size()] = static_cast<char>(rng());
        }
        return;
    }
    if (ints && t.int64_data_size()) t.set_int64_data(static_cast<int>(rng() % t.int64_data_size()), interestingInt(rng));
    else if (ints && t.int32_data_size()) t.set_int32_data(static_cast<int>(rng() % t.int32_data_size()), static_cast<int32_t>(interestingInt(rng)));
    else if (t.float_data_size()) t.set_float_data(static_cast<int>(rng() % t.float_data_size()), interestingFloat(rng));
}

void mutateOnce(onnx::ModelProto& m, Rng& rng, const std::vector<std::string>& ops) {
    auto* g = m.mutable_graph();
    auto node = [&]() -> onnx::NodeProto* { return g->node_size() ? g->mutable_node(static_cast<int>(rng() % g->node_size())) : nullptr; };
    switch (rng() % 12) {
        case 0:
        case 1:
            if (auto* n = node(); n && n->attribute_size()) mutateAttribute(*n->mutable_attribute(static_cast<int>(rng() % n->attribute_size())), rng);
            break;
        case 2:  // a new attribute that the op may read: windows, axes, sizes
            if (auto* n = node()) {
                static const char* names[] = {"strides", "dilations", "pads", "kernel_shape", "axis", "axes", "group", "perm", "epsilon", "alpha", "depth", "k", "mode"};
                auto* a = n->add_attribute();
                a->set_name(names[rng() % (sizeof names / sizeof names[0])]);
                a->set_type(rng() % 2 ? onnx::AttributeProto::INTS : onnx::AttributeProto::INT);
                if (a->type() == onnx::AttributeProto::INT) a->set_i(interestingInt(rng));
                else for (int k = static_cast<int>(rng() % 5); k > 0; --k) a->add_ints(interestingInt(rng));
            }
            break;
        case 3:  // a declared dim of an input or output
            if (g->input_size()) {
                auto* shape = g->mutable_input(static_cast<int>(rng() % g->input_size()))->mutable_type()->mutable_tensor_type()->mutable_shape();
                if (shape->dim_size()) {
                    auto* d = shape->mutable_dim(static_cast<int>(rng() % shape->dim_size()));
                    if (rng() % 4 == 0) d->set_dim_param("n");
                    else d->set_dim_value(interestingInt(rng));
                } else {
                    shape->add_dim()->set_dim_value(interestingInt(rng));
                }
            }
            break;
        case 4:  // an initializer's dims
            if (g->initializer_size()) {
                auto* t = g->mutable_initializer(static_cast<int>(rng() % g->initializer_size()));
                if (t->dims_size() && rng() % 3) t->set_dims(static_cast<int>(rng() % t->dims_size()), interestingInt(rng));
                else t->add_dims(interestingInt(rng));
            }
            break;
        case 5:
        case 6:
            if (g->initializer_size()) mutateInitializerValue(*g->mutable_initializer(static_cast<int>(rng() % g->initializer_size())), rng);
            break;
        case 7:  // inputs dropped, emptied or pointed elsewhere
            if (auto* n = node(); n && n->input_size()) {
                const int k = static_cast<int>(rng() % n->input_size());
                if (rng() % 3 == 0) n->mutable_input()->RemoveLast();
                else if (rng() % 2) n->set_input(k, "");
                else n->set_input(k, g->node(static_cast<int>(rng() % g->node_size())).output(0));
            }
            break;
        case 8: {  // another opset
            auto* imp = m.opset_import_size() ? m.mutable_opset_import(0) : m.add_opset_import();
            imp->set_version(static_cast<int64_t>(rng() % 23));
            break;
        }
        case 9:
            if (auto* n = node(); n && !ops.empty()) n->set_op_type(ops[rng() % ops.size()]);
            break;
        case 10:  // external data: missing, escaping, a FIFO, a device, huge offsets
            if (g->initializer_size()) {
                auto* t = g->mutable_initializer(static_cast<int>(rng() % g->initializer_size()));
                static const char* where[] = {"weights.bin", "../escape.bin", "/etc/passwd", "fifo", "dev_zero", "", "sub/../weights.bin"};
                t->clear_raw_data();
                t->set_data_location(onnx::TensorProto::EXTERNAL);
                t->clear_external_data();
                auto* loc = t->add_external_data();
                loc->set_key("location");
                loc->set_value(where[rng() % (sizeof where / sizeof where[0])]);
                if (rng() % 2) {
                    auto* off = t->add_external_data();
                    off->set_key(rng() % 2 ? "offset" : "length");
                    off->set_value(rng() % 2 ? std::to_string(interestingInt(rng)) : "12abc");
                }
            }
            break;
        default:  // a value type changes
            if (g->initializer_size()) g->mutable_initializer(static_cast<int>(rng() % g->initializer_size()))->set_data_type(static_cast<int>(rng() % 17));
            break;
    }
}

}  // namespace

void mutateModel(onnx::ModelProto& m, Rng& rng, const std::vector<std::string>& supported_ops) {
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) mutateOnce(m, rng, supported_ops);
}

void mutateBytes(std::string& bytes, Rng& rng, size_t from) {
    if (bytes.size() <= from) return;
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0 && bytes.size() > from; --k) {
        const size_t at = from + rng() % (bytes.size() - from);
        switch (rng() % 5) {
            case 0: bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8))); break;
            case 1: bytes[at] = static_cast<char>(std::vector<int>{0, 0xff, 0x7f, 0x80, 0x01}[rng() % 5]); break;
            case 2: bytes.erase(at, std::min<size_t>(1 + rng() % 16, bytes.size() - at)); break;
            case 3: bytes.insert(at, bytes.substr(at, 1 + rng() % 16)); break;
            default:
                for (size_t i = at; i < std::min(bytes.size(), at + 8); ++i) bytes[i] = static_cast<char>(0xff);
        }
    }
}

namespace {

nlohmann::json interestingJson(Rng& rng) {
    switch (rng() % 12) {
        case 0: return nullptr;
        case 1: return "text";
        case 2: return "\xf0\x9f\x98";  // an incomplete UTF-8 character
        case 3: return nlohmann::json::array();
        case 4: return nlohmann::json::object();
        case 5: return true;
        case 6: return interestingFloat(rng);
        case 7: return std::numeric_limits<uint64_t>::max();
        case 8: return -1e300;
        case 9: return std::string(100000, 'a');
        default: return interestingInt(rng);
    }
}

// A random value slot of `j` (an object member or array element), or `j` itself.
nlohmann::json* pick(nlohmann::json& j, Rng& rng, int depth = 0) {
    if (depth > 6 || !(j.is_object() || j.is_array()) || j.empty() || rng() % 4 == 0) return &j;
    auto it = j.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % j.size()));
    return pick(*it, rng, depth + 1);
}

}  // namespace

void mutateJson(nlohmann::json& j, Rng& rng) {
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
        nlohmann::json* slot = pick(j, rng);
        if (slot == &j && rng() % 2 && j.is_object()) {
            static const char* keys[] = {"stream", "max_tokens", "n", "temperature", "top_p", "prompt", "messages", "stop_token_ids", "vocab_size", "hidden_size", "rope_theta"};
            j[keys[rng() % (sizeof keys / sizeof keys[0])]] = interestingJson(rng);
        } else {
            *slot = interestingJson(rng);
        }
    }
}

}  // namespace kiln::fuzz
