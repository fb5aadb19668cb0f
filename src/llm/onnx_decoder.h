// Decoder weights from where a model comes: a Hugging Face folder (config.json +
// model.safetensors) or an ONNX export of the whole forward pass, whose layers are read off
// the graph. Exporters rename and merge weights (PyTorch's dynamo exporter keeps one
// initializer for identical tensors, e.g. every LayerNorm weight of a fresh model, and drops
// all-zero biases), so the reader goes by the graph's structure, not by names. GPT-2 family:
// the i-th LayerNormalization is a layer's first or second norm, the i-th linear node
// (Gemm/MatMul with a constant weight) is c_attn, c_proj, c_fc or the MLP's c_proj. Llama
// family: RMSNorms (decomposed or one node) the same way, seven linear nodes per layer (q, k,
// v, o, gate, up, down), head size and RoPE theta from the rotary inv_freq constant. Other
// graphs get an error naming the file.
#pragma once
#include <filesystem>
#include <map>
#include <string>

#include "ir/graph.h"
#include "llm/decoder_config.h"

namespace kiln::llm {

struct DecoderWeights {
    DecoderConfig config;
    std::map<std::string, Tensor> weights;  // by Hugging Face name, as readSafetensors gives them
};

// The decoder in an imported ONNX graph (`where` names the file in errors).
DecoderWeights decoderFromOnnxGraph(const Graph& g, const std::string& where);
// A folder with config.json and model.safetensors, or with model.onnx (or an .onnx file).
DecoderWeights loadDecoderWeights(const std::filesystem::path& path);

}  // namespace kiln::llm
