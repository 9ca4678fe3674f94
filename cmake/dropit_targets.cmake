# Helpers for dropit's own tests, examples and benchmarks (not installed).

# Warnings and sanitizers for a target of ours (never for the INTERFACE library itself).
function(dropit_set_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic
                                           -Wconversion -Wno-sign-conversion>)
  if(DROPIT_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DROPIT_SANITIZE}
                                             -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PRIVATE -fsanitize=${DROPIT_SANITIZE})
    if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND DROPIT_SANITIZE MATCHES "undefined")
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize-ignorelist=${PROJECT_SOURCE_DIR}/cmake/sanitizers/ubsan_ignorelist.txt>)
    endif()
  endif()
endfunction()

# dropit_add_test(NAME src... [LIBS lib...]): a doctest binary registered with ctest.
# tests/main.cpp supplies doctest's main; each binary's cases print in its output.
function(dropit_add_test name)
  cmake_parse_arguments(ARG "" "" "LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS} ${PROJECT_SOURCE_DIR}/tests/main.cpp)
  target_link_libraries(${name} PRIVATE dropit::dropit doctest::doctest ${ARG_LIBS})
  dropit_set_warnings(${name})
  if(DROPIT_SANITIZE)
    # The shared executor cases run their largest sizes smaller under sanitizers.
    target_compile_definitions(${name} PRIVATE DROPIT_TEST_SANITIZED)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()

# dropit_extract_snippet(<out-file> FILE <doc.md> LANG <cpp|json> [AFTER <marker>]):
# writes the first ```LANG fenced block of a Markdown file (the first after MARKER, if given) to
# <out-file>, so that documentation examples are compiled and run by tests exactly as written.
function(dropit_extract_snippet out_file)
  cmake_parse_arguments(ARG "" "FILE;LANG;AFTER" "" ${ARGN})
  file(READ ${ARG_FILE} _doc)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ARG_FILE})
  if(ARG_AFTER)
    string(FIND "${_doc}" "${ARG_AFTER}" _at)
    if(_at EQUAL -1)
      message(FATAL_ERROR "${ARG_FILE} has no '${ARG_AFTER}' marker")
    endif()
    string(SUBSTRING "${_doc}" ${_at} -1 _doc)
  endif()
  set(_fence "```${ARG_LANG}\n")
  string(FIND "${_doc}" "${_fence}" _begin)
  if(_begin EQUAL -1)
    message(FATAL_ERROR "${ARG_FILE} has no ${_fence} block")
  endif()
  string(LENGTH "${_fence}" _len)
  math(EXPR _begin "${_begin} + ${_len}")
  string(SUBSTRING "${_doc}" ${_begin} -1 _rest)
  string(FIND "${_rest}" "\n```" _end)
  string(SUBSTRING "${_rest}" 0 ${_end} _code)
  file(CONFIGURE OUTPUT ${out_file} CONTENT "${_code}\n" @ONLY)
endfunction()
