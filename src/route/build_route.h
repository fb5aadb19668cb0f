// The parameter space and build routes: one value for every parameter, with a canonical
// text form (sorted name=value pairs joined by ';') and a stable hash.
#pragma once
#include <string>
#include <vector>

#include "ir/parameter.h"

namespace kiln {

class ParameterSpace {
public:
    explicit ParameterSpace(std::vector<ParameterSpec> parameters);
    const std::vector<ParameterSpec>& parameters() const { return parameters_; }
    const ParameterSpec* find(const std::string& name) const;
    // Looks a parameter up; throws Error listing the close names when it is unknown.
    const ParameterSpec& get(const std::string& name) const;
    // Visible parameters whose name matches a glob with '*' wildcards.
    std::vector<const ParameterSpec*> match(const std::string& glob) const;

private:
    std::vector<ParameterSpec> parameters_;
};

bool globMatch(const std::string& glob, const std::string& name);

class BuildRoute {
public:
    static BuildRoute defaults(const ParameterSpace& space);
    // Parses "name=value;name=value" (';', ',' or spaces separate pairs); parameters not
    // named keep their defaults. Throws Error naming the bad pair and the valid choices.
    static BuildRoute parse(const std::string& text, const ParameterSpace& space);

    // Sets one value; throws Error for an unknown name or a disallowed value.
    void set(const std::string& name, const std::string& value, const ParameterSpace& space);
    const std::string& get(const std::string& name) const { return routeValue(values_, name); }
    const RouteValues& values() const { return values_; }

    std::string text() const;  // canonical: every parameter, sorted
    // Only the parameters that differ from their defaults ("default" when none do).
    std::string changesText(const ParameterSpace& space) const;
    std::string hash() const;  // 16 hex digits of FNV-1a 64 over text()
    bool operator==(const BuildRoute& o) const { return values_ == o.values_; }

private:
    RouteValues values_;
};

}  // namespace kiln
