// Node attributes: a small tagged union over the kinds ONNX uses.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ir/tensor.h"

namespace kiln {

struct Graph;

using Attribute = std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>,
                               std::vector<std::string>, Tensor, std::shared_ptr<Graph>>;

std::string attributeToString(const Attribute& a);

// Attributes of one node, with typed getters that name the node and attribute in errors.
class Attributes {
public:
    void set(const std::string& name, Attribute value) { values_[name] = std::move(value); }
    bool has(const std::string& name) const { return values_.count(name) != 0; }
    void erase(const std::string& name) { values_.erase(name); }
    const std::map<std::string, Attribute>& all() const { return values_; }

    int64_t getInt(const std::string& name, int64_t fallback) const;
    int64_t getInt(const std::string& name) const;
    float getFloat(const std::string& name, float fallback) const;
    std::string getString(const std::string& name, const std::string& fallback) const;
    std::vector<int64_t> getInts(const std::string& name, const std::vector<int64_t>& fallback = {}) const;
    std::vector<float> getFloats(const std::string& name, const std::vector<float>& fallback = {}) const;
    std::vector<std::string> getStrings(const std::string& name, const std::vector<std::string>& fallback = {}) const;
    const Tensor& getTensor(const std::string& name) const;
    std::shared_ptr<Graph> getGraph(const std::string& name) const;

    bool operator==(const Attributes& other) const;

private:
    template <typename T>
    const T* find(const std::string& name) const;
    std::map<std::string, Attribute> values_;
};

}  // namespace kiln
