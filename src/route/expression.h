// Route expressions: a small language for sets of build routes.
//
//   expr    := cross ('|' cross)*             union of sets
//   cross   := term (' ' term)*               cross product of the terms' sets
//   term    := 'default'                      the default route
//            | GLOB '=' VALUE                 one value (GLOB may use '*': fusion.*)
//            | GLOB '=' '[' VALUE (',' VALUE)* ']'
//            | GLOB '=' '*'                   every allowed value
//            | '(' expr ')'
//            | 'random:' N                    N routes drawn from the other terms' values
//            | 'one-at-a-time'                the default, then one parameter changed at a time
//
// A strategy term combines only with assignment terms, whose parameters and values form
// its domain (the whole visible space when there are none). Unnamed parameters keep their
// defaults. Equivalent routes are produced once.
#pragma once
#include <string>
#include <vector>

#include "route/build_route.h"

namespace kiln {

struct ExpandedRoutes {
    std::vector<BuildRoute> routes;  // distinct, in first-seen order
    size_t generated = 0;            // before removing duplicates
};

// Throws Error with the column of the problem for a malformed expression, and for unknown
// parameters or values.
ExpandedRoutes expandRouteExpression(const std::string& expr, const ParameterSpace& space, uint64_t seed = 0);

}  // namespace kiln
