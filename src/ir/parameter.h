// Declaration of a tunable compiler parameter. It lives in the lowest layer so that every
// pass, backend and runtime component can declare the parameters it reads next to the code
// that reads them; route/ collects them into the parameter space.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace kiln {

struct ParameterSpec {
    std::string name;                 // dotted, e.g. "fusion.conv_bias_act"
    std::vector<std::string> values;  // allowed values
    std::string default_value;
    std::string owner;                // pass / backend / runtime component that reads it
    std::string description;          // one line
    bool hidden = false;              // debug parameters: not listed, never expanded by globs
    // Op types of the nodes a kernel choice acts on: the parameter is in a model's space only
    // where its optimized graph has one (empty: a choice for every model).
    std::vector<std::string> ops = {};
};

// A complete assignment name -> value, as passes and backends read it.
using RouteValues = std::map<std::string, std::string>;

// Reads a parameter that must be present in a complete route.
const std::string& routeValue(const RouteValues& route, const std::string& name);
inline bool routeOn(const RouteValues& route, const std::string& name) { return routeValue(route, name) == "on"; }

}  // namespace kiln
