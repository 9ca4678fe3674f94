// doctest's main for every dropit test binary: each binary prints its cases and a summary, and a
// skipped case says so in the output.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
