#include "ir/parameter.h"

#include "ir/error.h"

namespace kiln {

const std::string& routeValue(const RouteValues& route, const std::string& name) {
    auto it = route.find(name);
    check(it != route.end(), "build route has no value for parameter '" + name + "'");
    return it->second;
}

}  // namespace kiln
