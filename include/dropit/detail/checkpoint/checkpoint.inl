/**
 * @file checkpoint.inl
 * @brief The implementation of <dropit/checkpoint.hpp>, in the order its parts depend on each
 * other.
 */
#pragma once

// The order matters (each part uses the ones above it).
// clang-format off
#include <dropit/detail/checkpoint/division_tree.hpp>
#include <dropit/detail/checkpoint/graph.inl>
#include <dropit/detail/checkpoint/json.hpp>
#include <dropit/detail/checkpoint/models.hpp>
#include <dropit/detail/checkpoint/solve.inl>
#include <dropit/detail/checkpoint/budget.inl>
#include <dropit/detail/checkpoint/step.inl>
// clang-format on
