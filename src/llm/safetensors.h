// Reading and writing the safetensors format (Hugging Face weights): an 8-byte
// little-endian header length, a JSON header mapping each tensor name to its dtype, shape
// and byte range, then the raw data. Every range, size and dtype is checked; a bad file
// is an Error naming the file and the tensor.
#pragma once
#include <filesystem>
#include <map>
#include <string>

#include "ir/tensor.h"

namespace kiln::llm {

std::map<std::string, Tensor> readSafetensors(const std::filesystem::path& path);
// A model folder's weights: model.safetensors, or the shards model.safetensors.index.json
// names (its weight_map: tensor -> file in the folder). Every mapped tensor must be in its
// shard, and no tensor in two.
std::map<std::string, Tensor> readSafetensorsCheckpoint(const std::filesystem::path& dir);
void writeSafetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors);

}  // namespace kiln::llm
