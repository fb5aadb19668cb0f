// Folds a constant zero Pad of the spatial dims into the following Conv's pads, or into an
// AveragePool's (which then counts the padding in its divisor, as the zeros were counted:
// TorchScript exports avg_pool2d(count_include_pad=True) as Pad + AveragePool).
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

void foldPadsIntoConv(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.pad_into_conv")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& pad = g.nodes[i];
        if (pad.op_type != "Pad" || pad.attrs.getString("mode", "constant") != "constant") continue;
        const int c = index.soleConsumer(pad.outputs[0]);
        if (c < 0 || (g.nodes[c].op_type != "Conv" && g.nodes[c].op_type != "AveragePool") || !g.nodes[c].domain.empty() || g.nodes[c].inputs[0] != pad.outputs[0])
            continue;
        Node& conv = g.nodes[c];
        if (conv.attrs.getString("auto_pad", "NOTSET") != "NOTSET") continue;
        const bool pool = conv.op_type == "AveragePool";
        if (pool && conv.attrs.getInt("ceil_mode", 0) != 0) continue;  // a ceil window may reach past the padded zeros
        std::vector<int64_t> pads;
        double value = 0;
        if (g.opset < 11) {
            pads = pad.attrs.getInts("pads");
            value = pad.attrs.getFloat("value", 0);
        } else {
            const Tensor* p = constantOf(g, pad.inputs[1]);
            if (!p || pad.inputs.size() > 3) continue;
            pads = p->toInt64Vector();
            if (pad.hasInput(2) && !scalarConstant(g, pad.inputs[2], &value)) continue;
        }
        if (value != 0 || pads.size() < 6 || pads.size() % 2) continue;
        const size_t rank = pads.size() / 2, spatial = rank - 2;
        bool ok = pads[0] == 0 && pads[1] == 0 && pads[rank] == 0 && pads[rank + 1] == 0;
        for (int64_t v : pads) ok &= v >= 0;
        if (!ok) continue;
        auto conv_pads = conv.attrs.getInts("pads", std::vector<int64_t>(2 * spatial, 0));
        if (conv_pads.size() != 2 * spatial) continue;
        if (pool && conv.attrs.getInt("count_include_pad", 0) == 0) {
            bool unpadded = true;  // else its own padding would be left out of the divisor
            for (int64_t v : conv_pads) unpadded &= v == 0;
            if (!unpadded) continue;
        }
        if (pool) conv.attrs.set("count_include_pad", int64_t{1});
        for (size_t d = 0; d < spatial; ++d) {
            conv_pads[d] += pads[2 + d];
            conv_pads[spatial + d] += pads[rank + 2 + d];
        }
        conv.attrs.set("pads", conv_pads);
        conv.inputs[0] = pad.inputs[0];
        erase[i] = true;
    }
    eraseNodes(g, erase);
}

}  // namespace

Pass padIntoConvPass() {
    return {"pad_into_conv", {{"fusion.pad_into_conv", {"on", "off"}, "on", "pad_into_conv", "Fold a constant zero Pad into the following Conv's or AveragePool's padding"}}, foldPadsIntoConv};
}

}  // namespace kiln
