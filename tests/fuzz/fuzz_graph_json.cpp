// libFuzzer target: the checkpoint planner's JSON graph reader on arbitrary text.
//
// Every input either reads (then the graph is planned, written back with to_json, and read again
// to the same plan cost) or throws dropit::error whose message starts with the origin; anything
// else (another exception, a crash, a hang, a sanitizer report) is a finding.
#include <dropit/checkpoint.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace ck = dropit::checkpoint;

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_graph_json: %s %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ck::graph g;
  try {
    g = ck::parse_graph_json(text, "fuzz.json");
  } catch (const dropit::error& e) {
    const std::string_view what = e.what();
    if (what.find("fuzz.json") == std::string_view::npos)
      fail("the error does not name the origin:", std::string(what));
    return 0;
  }
  // A graph that reads is valid: it plans, and its JSON reads back to the same plan cost.
  if (g.vertex_count() > 64) return 0;  // keep one run fast; the reader is what is fuzzed
  const ck::plan p = ck::solve(g);
  const ck::graph again = ck::parse_graph_json(ck::to_json(g), "again.json");
  if (ck::solve(again).cost != p.cost) fail("to_json -> parse_graph_json changed the plan cost");
  return 0;
}
