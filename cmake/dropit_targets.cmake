# Helpers for dropit's own tests, examples and benchmarks (not installed).

# Warnings and sanitizers for a target of ours (never for the INTERFACE library itself).
function(dropit_set_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic
                                           -Wconversion -Wno-sign-conversion>)
  if(DROPIT_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DROPIT_SANITIZE}
                                             -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PRIVATE -fsanitize=${DROPIT_SANITIZE})
  endif()
endfunction()

# dropit_add_test(NAME src... [LIBS lib...]): a doctest binary registered with ctest.
# tests/main.cpp supplies doctest's main; each binary's cases print in its output.
function(dropit_add_test name)
  cmake_parse_arguments(ARG "" "" "LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS} ${PROJECT_SOURCE_DIR}/tests/main.cpp)
  target_link_libraries(${name} PRIVATE dropit::dropit doctest::doctest ${ARG_LIBS})
  dropit_set_warnings(${name})
  add_test(NAME ${name} COMMAND ${name})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
