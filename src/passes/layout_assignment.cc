// Convolution data layout (layout.conv):
// - nhwc: 2-D Conv/FusedConv nodes run on channels-last data: the activation is transposed to
//   NHWC before and back to NCHW after the conv (the node gets data_layout="NHWC"); adjacent
//   transposes cancel afterwards.
// - nchw8c / nchw16c (CPU): conv chains run on channel-blocked activations (channel_blocks.h)
//   with weights packed at build time, the layouts oneDNN's AVX2 (8) and AVX-512 (16)
//   convolutions read directly. A
//   BlockChannels node enters a chain and an UnblockChannels node leaves it only where a
//   value meets a node outside it, so a CNN's conv stack stays blocked end to end; pooling
//   on a chain's output joins it (BlockedPool), and so do elementwise ops (per-channel
//   constants packed into blocks: squeeze-excitation gates, unfolded BatchNorms) and channel
//   Concats whose parts fill whole blocks (DenseNet, Inception, SqueezeNet).
// - auto: on the CPU when Kiln has oneDNN (the only kernels that run it fast), nchw16c where
//   the building machine has AVX-512 (oneDNN runs 8-channel blocks with its AVX2 kernels:
//   half the vector width) and nchw8c elsewhere; else NCHW.
#include <cmath>
#include <map>
#include <set>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/reference/channel_blocks.h"
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

#ifdef KILN_WITH_DNNL
constexpr bool kBlockedConvKernels = true;
#else
constexpr bool kBlockedConvKernels = false;
#endif

void assignChannelsLastLayout(Graph& g) {
    std::vector<Node> added;
    for (auto& n : g.nodes) {
        if (n.op_type != "Conv" && n.op_type != "FusedConv") continue;
        if (n.attrs.getString("data_layout", "NCHW") != "NCHW") continue;
        const ValueInfo* vi = g.findValueInfo(n.inputs[0]);
        if (!vi || !vi->shape.rank_known || vi->shape.dims.size() != 4) continue;
        auto to_nhwc = [&](const std::string& v) {
            std::string name = freshName(g, v + "_nhwc");
            Node t{freshName(g, name + "_transpose"), "Transpose", "", {v}, {name}, {}};
            t.attrs.set("perm", std::vector<int64_t>{0, 2, 3, 1});
            added.push_back(t);
            g.value_info[name] = ValueInfo{name, DType::Undefined, {}};
            return name;
        };
        n.inputs[0] = to_nhwc(n.inputs[0]);
        if (n.inputs.size() > 3 && !n.inputs[3].empty()) n.inputs[3] = to_nhwc(n.inputs[3]);  // residual
        const std::string result = n.outputs[0];
        n.outputs[0] = freshName(g, result + "_nhwc");
        g.value_info[n.outputs[0]] = ValueInfo{n.outputs[0], DType::Undefined, {}};
        n.attrs.set("data_layout", std::string("NHWC"));
        n.op_type = "FusedConv";  // the kiln-domain conv carries the layout attribute
        n.domain = "kiln";
        Node back{freshName(g, result + "_to_nchw"), "Transpose", "", {n.outputs[0]}, {result}, {}};
        back.attrs.set("perm", std::vector<int64_t>{0, 3, 1, 2});
        added.push_back(back);
    }
    for (auto& n : added) g.nodes.push_back(std::move(n));
    // value_info placeholders only reserved names; drop them so types stay inferred at run time.
    for (auto it = g.value_info.begin(); it != g.value_info.end();)
        it = it->second.dtype == DType::Undefined ? g.value_info.erase(it) : std::next(it);
}

// The packed weight layout a conv runs with on blocked data, or "" when it cannot: f32
// constant 2-D weights, explicit pads, and one group (a plain input when it has fewer than 8
// channels, as a first layer does), depthwise (one filter per channel) or groups of whole
// channel blocks; with `any_groups`, smaller groups too, with plain weights (oneDNN runs
// those in its own layouts, reordering around the conv: still faster than leaving the chain
// for the im2col kernel: 3.2 -> 1.4 ms for a ResNeXt conv of 4-channel groups on one core).
std::string blockedWeightLayout(const Graph& g, const Node& n, int64_t block, bool any_groups = true) {
    if ((n.op_type != "Conv" || !n.domain.empty()) && (n.op_type != "FusedConv" || n.domain != "kiln")) return "";
    if (n.attrs.getString("data_layout", "NCHW") != "NCHW" || n.inputs.size() < 2) return "";
    const std::string pad = n.attrs.getString("auto_pad", "NOTSET");
    if (pad != "NOTSET" && pad != "VALID") return "";
    const Tensor* w = constantOf(g, n.inputs[1]);
    if (!w || w->dtype() != DType::F32 || w->rank() != 4) return "";
    if (const ValueInfo* x = g.findValueInfo(n.inputs[0]))
        if ((x->dtype != DType::Undefined && x->dtype != DType::F32) || (x->shape.rank_known && x->shape.dims.size() != 4)) return "";
    const int64_t group = n.attrs.getInt("group", 1), out_channels = w->dims()[0], per_group = w->dims()[1];
    if (group == 1) return packedConvWeightLayout(per_group < kChannelBlock ? PackedConvWeights::Ohwio : PackedConvWeights::OIhwIO, block);
    if (per_group == 1 && out_channels == group) return packedConvWeightLayout(PackedConvWeights::Goihwg, block);
    // Grouped (ResNeXt, RegNet): oneDNN's blocked kernels need whole blocks per group.
    const bool whole_blocks = per_group % block == 0 && out_channels % group == 0 && (out_channels / group) % block == 0;
    if (whole_blocks) return packedConvWeightLayout(PackedConvWeights::GOIhwIO, block);
    return any_groups && kBlockedConvKernels && out_channels % group == 0 ? packedConvWeightLayout(PackedConvWeights::Goihw, block) : "";
}

// A pooling node that can stay in a blocked chain: 2-D windows or global, one output.
bool blockablePool(const Node& n) {
    static const std::set<std::string> pools = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
    if (!n.domain.empty() || !pools.count(n.op_type) || (n.outputs.size() > 1 && !n.outputs[1].empty())) return false;
    return n.op_type.rfind("Global", 0) == 0 || n.attrs.getInts("kernel_shape").size() == 2;
}

// The channel count of a plain 4-D f32 value, from its inferred shape; -1 when unknown.
int64_t plainChannels(const Graph& g, const std::string& v) {
    const ValueInfo* vi = g.findValueInfo(v);
    if (!vi || vi->dtype != DType::F32 || !vi->shape.rank_known || vi->shape.dims.size() != 4 || !vi->shape.dims[1].known()) return -1;
    return vi->shape.dims[1].size;
}

// A constant that broadcasts over an NCHW map per channel ([C, 1, 1] or [1, C, 1, 1], f32).
bool perChannelConstant(const Graph& g, const std::string& v, int64_t channels) {
    const Tensor* t = constantOf(g, v);
    if (!t || t->dtype() != DType::F32 || t->numel() != channels || (t->rank() != 3 && t->rank() != 4)) return false;
    const Dims& d = t->dims();
    const size_t c = d.size() - 3;
    for (size_t k = 0; k < d.size(); ++k)
        if (k != c && d[k] != 1) return false;
    return true;
}

// Elementwise ops a blocked chain keeps: they map the zero lanes past the last channel to
// finite values, which the packed weights after them multiply by zero (Div, Log, Sqrt and
// Reciprocal could make them inf or NaN, and stay out).
bool blockableUnary(const Node& n) {
    static const std::set<std::string> ops = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Gelu", "Erf", "Neg", "Abs", "Softplus", "Elu", "Clip"};
    return n.domain.empty() && ops.count(n.op_type) && n.outputs.size() == 1;
}
bool blockableBinary(const Node& n) {
    static const std::set<std::string> ops = {"Add", "Sub", "Mul", "Max", "Min"};
    return n.domain.empty() && ops.count(n.op_type) && n.inputs.size() == 2 && n.outputs.size() == 1;
}

// A blocked value divided by a constant without zeros (a scalar or one per channel): the
// zero lanes stay zero (HardSwish as exporters write it: x * relu6(x + 3) / 6).
bool blockableDivision(const Graph& g, const Node& n, const std::map<std::string, int64_t>& channels) {
    if (!n.domain.empty() || n.op_type != "Div" || n.inputs.size() != 2 || n.outputs.size() != 1 || !channels.count(n.inputs[0])) return false;
    const Tensor* d = constantOf(g, n.inputs[1]);
    if (!d || d->dtype() != DType::F32 || (d->numel() != 1 && !perChannelConstant(g, n.inputs[1], channels.at(n.inputs[0])))) return false;
    for (float v : d->span<float>())
        if (v == 0 || !std::isfinite(v)) return false;
    return true;
}

void assignBlockedLayout(Graph& g, int64_t block) {
    // In graph (topological) order: convs by their weights; pools, elementwise ops and
    // channel Concats when a data input comes blocked from a node converted before them.
    std::map<size_t, std::string> converted;  // node index -> packed weight layout, or "pool", "eltwise", "concat"
    std::map<std::string, int64_t> channels;  // output of a converted node -> its channel count
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        std::string kind = blockedWeightLayout(g, n, block);
        if (!kind.empty()) {
            channels[n.outputs[0]] = constantOf(g, n.inputs[1])->dims()[0];
        } else if (blockablePool(n) && channels.count(n.inputs[0])) {
            kind = "pool", channels[n.outputs[0]] = channels[n.inputs[0]];
        } else if (blockableUnary(n) && channels.count(n.inputs[0])) {
            double v;
            bool scalars = true;  // Clip's bounds
            for (size_t k = 1; k < n.inputs.size(); ++k) scalars &= n.inputs[k].empty() || scalarConstant(g, n.inputs[k], &v);
            if (scalars) kind = "eltwise", channels[n.outputs[0]] = channels[n.inputs[0]];
        } else if (blockableDivision(g, n, channels)) {
            kind = "eltwise", channels[n.outputs[0]] = channels[n.inputs[0]];
        } else if (blockableBinary(n) && (channels.count(n.inputs[0]) || channels.count(n.inputs[1]))) {
            const int64_t c = channels.count(n.inputs[0]) ? channels[n.inputs[0]] : channels[n.inputs[1]];
            bool ok = true;
            for (const auto& in : n.inputs) {
                double v;
                ok &= (channels.count(in) && channels[in] == c) || scalarConstant(g, in, &v) || perChannelConstant(g, in, c) || plainChannels(g, in) == c;
            }
            if (ok) kind = "eltwise", channels[n.outputs[0]] = c;
        } else if (n.op_type == "Concat" && n.domain.empty() && n.outputs.size() == 1 && !n.inputs.empty()) {
            const int64_t axis = n.attrs.getInt("axis", 0);
            bool ok = axis == 1 || axis == -3, any_blocked = false;
            int64_t total = 0;
            for (size_t k = 0; k < n.inputs.size() && ok; ++k) {
                const int64_t c = channels.count(n.inputs[k]) ? channels[n.inputs[k]] : plainChannels(g, n.inputs[k]);
                any_blocked |= channels.count(n.inputs[k]) > 0;
                // Blocks concatenate as they are when every part but the last fills its blocks.
                ok = c > 0 && (k + 1 == n.inputs.size() || c % block == 0);
                total += c;
            }
            if (ok && any_blocked) kind = "concat", channels[n.outputs[0]] = total;
        }
        if (!kind.empty()) converted[i] = kind;
    }
    if (converted.empty()) return;
    // A converted node's output also exists in NCHW (an UnblockChannels node) when anything
    // but a converted node's blocked input or residual reads it.
    const GraphIndex index(g);
    const std::string plain_input = packedConvWeightLayout(PackedConvWeights::Ohwio, block), data_layout = blockedDataLayout(block);
    const std::string suffix = "_nchw" + std::to_string(block) + "c";
    auto readsBlocked = [&](int c, const std::string& v) {
        const auto it = converted.find(static_cast<size_t>(c));
        if (it == converted.end()) return false;
        const Node& n = g.nodes[it->first];
        if (it->second == "pool" || it->second == "eltwise" || it->second == "concat") return true;
        for (size_t k = 0; k < n.inputs.size(); ++k)
            if (n.inputs[k] == v && !(k == 3 || (k == 0 && it->second != plain_input))) return false;
        return true;
    };
    std::map<std::string, std::string> blocked;  // NCHW value -> its blocked twin
    std::map<std::string, std::string> packed;   // weight initializer + layout -> packed initializer
    std::vector<Node> added;
    auto blockedValue = [&](const std::string& v) {
        auto it = blocked.find(v);
        if (it != blocked.end()) return it->second;
        const std::string name = freshName(g, v + suffix);
        Node to_blocked{freshName(g, name + "_block"), "BlockChannels", "kiln", {v}, {name}, {}};
        to_blocked.attrs.set("block", block);
        added.push_back(to_blocked);
        return blocked[v] = name;
    };
    for (const auto& [v, c] : channels) {
        blocked[v] = freshName(g, v + suffix);
        g.value_info[blocked[v]] = ValueInfo{blocked[v], DType::F32, Shape::unknown()};  // f32 for the chain fusion after
    }
    for (const auto& [i, kind] : converted) {
        Node& n = g.nodes[i];
        const std::string out = n.outputs[0];
        if (kind == "eltwise" || kind == "concat") {
            const int64_t c = channels.at(out);
            for (auto& in : n.inputs) {
                double v;
                if (in.empty() || scalarConstant(g, in, &v)) continue;
                if (channels.count(in)) {
                    in = blocked.at(in);
                } else if (kind == "eltwise" && perChannelConstant(g, in, c)) {
                    std::string& pc = packed[in + "/" + data_layout];
                    if (pc.empty()) {
                        pc = freshName(g, in + suffix);
                        g.initializers[pc] = blockChannels(constantOf(g, in)->reshaped({1, c, 1, 1}), block);
                    }
                    in = pc;
                } else {
                    in = blockedValue(in);
                }
            }
        } else if (kind == "pool") {
            n.attrs.set("pool", n.op_type);
            n.attrs.set("channels", channels.at(out));
            n.op_type = "BlockedPool";
            n.inputs[0] = blocked.at(n.inputs[0]);
        } else {
            const Tensor& w = *constantOf(g, n.inputs[1]);
            std::string& pw = packed[n.inputs[1] + "/" + kind];
            if (pw.empty()) {
                pw = freshName(g, n.inputs[1] + "_" + kind);
                g.initializers[pw] = packConvWeights(w, kind);
            }
            n.inputs.resize(std::max<size_t>(n.inputs.size(), 3));
            n.inputs[1] = pw;
            if (kind != plain_input) n.inputs[0] = blockedValue(n.inputs[0]);
            else n.attrs.set("src_layout", std::string("NCHW"));
            if (n.hasInput(3)) n.inputs[3] = blockedValue(n.inputs[3]);
            n.op_type = "FusedConv";
            n.attrs.set("data_layout", data_layout);
            n.attrs.set("weight_layout", kind);
            n.attrs.set("weight_dims", std::vector<int64_t>(w.dims().begin(), w.dims().end()));
        }
        if (kind == "concat") n.attrs.set("axis", int64_t{1});  // the blocks' axis of [N, C/B, H, W, B]
        if (kind != "eltwise" && kind != "concat") n.domain = "kiln";
        n.outputs.resize(1);
        n.outputs[0] = blocked.at(out);
        bool plain_use = index.isGraphOutput(out);
        for (int c : index.consumers(out)) plain_use = plain_use || !readsBlocked(c, out);
        if (plain_use) {
            Node back{freshName(g, out + "_unblock"), "UnblockChannels", "kiln", {n.outputs[0]}, {out}, {}};
            back.attrs.set("channels", channels.at(out));
            added.push_back(back);
        }
    }
    for (auto& n : added) g.nodes.push_back(std::move(n));
}

// How many convs a block size keeps blocked in oneDNN's blocked kernels. Each one left out
// breaks the chain with a block and an unblock around it, or reorders inside the conv.
size_t blockableConvs(const Graph& g, int64_t block) {
    size_t n = 0;
    for (const auto& node : g.nodes) n += !blockedWeightLayout(g, node, block, false).empty();
    return n;
}

// Blocks of 16 on AVX-512 unless blocks of 8 keep clearly more convs in the chain: grouped
// convs of 8 channels per group (RegNet) block only by 8. On the 2-core AVX-512 VM,
// regnet_y_400mf ran in 9.1 ms with nchw8c and 12.5 with nchw16c; resnext50_32x4d, whose
// 8-channel groups are 4 of 16 grouped convs, in 42 ms with nchw16c and 51 with nchw8c.
int64_t autoBlock(const Graph& g) {
    if (!cpuHasAvx512()) return kChannelBlock;
    return blockableConvs(g, kWideChannelBlock) * 10 >= blockableConvs(g, kChannelBlock) * 9 ? kWideChannelBlock : kChannelBlock;
}

void assignConvLayout(Graph& g, const RouteValues& route) {
    const std::string& layout = routeValue(route, "layout.conv");
    const bool cpu = passTarget(route) == "cpu";
    if (layout == "nhwc") assignChannelsLastLayout(g);
    else if (cpu && layout == "nchw8c") assignBlockedLayout(g, kChannelBlock);
    else if (cpu && layout == "nchw16c") assignBlockedLayout(g, kWideChannelBlock);
    else if (cpu && layout == "auto" && kBlockedConvKernels) assignBlockedLayout(g, autoBlock(g));
}

}  // namespace

Pass layoutAssignmentPass() {
    return {"layout_assignment",
            {{"layout.conv", {"auto", "nchw", "nhwc", "nchw8c", "nchw16c"}, "auto", "layout_assignment",
              "Data layout of 2-D convolutions: channels-first, channels-last, channel-blocked by 8 or 16 (CPU only; packed weights), or "
              "auto (on the CPU with oneDNN nchw16c where the building machine has AVX-512 and 16-channel blocks keep most convs blocked, else nchw8c; else nchw)"}},
            assignConvLayout};
}

}  // namespace kiln
