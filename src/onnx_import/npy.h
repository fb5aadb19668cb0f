// NumPy .npy files (format versions 1-3, little-endian, C order).
#pragma once
#include <filesystem>

#include "ir/tensor.h"

namespace kiln {

Tensor loadNpy(const std::filesystem::path& path);
void saveNpy(const Tensor& t, const std::filesystem::path& path);

}  // namespace kiln
