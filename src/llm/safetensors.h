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
void writeSafetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors);

}  // namespace kiln::llm
