// The JSON graph reader (nlohmann::json's strict parser plus dropit's positions, paths, duplicate
// keys and depth limit): the shared reference graphs, every error path (with the line, column and
// key it reports), and the plan writer.
#include <dropit/checkpoint.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace ck = dropit::checkpoint;

#ifndef DROPIT_TEST_DATA_DIR
#error "DROPIT_TEST_DATA_DIR must name tests/data"
#endif

namespace {

const std::filesystem::path data_dir = DROPIT_TEST_DATA_DIR;

/// The message `parse_graph_json` throws for `text`, or "" if it does not throw.
std::string error_of(const std::string& text) {
  try {
    (void)ck::parse_graph_json(text, "g.json");
  } catch (const dropit::error& e) {
    return e.what();
  }
  return "";
}

/// Reads the last `"key": <number>` in a JSON text the test controls (a plan's top-level fields
/// come after its segments' costs).
double number_after(const std::string& text, const std::string& key) {
  const auto at = text.rfind(dropit::detail::concat('"', key, '"'));
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(text.find(':', at) + 1));
}

const char* const tiny =
    R"({"source": 0, "target": "out", "vertices": [{"id": 0, "cost": 4}, {"id": "mid", "cost": 2},
 {"id": "out", "cost": 1, "shape": [1, 2]}], "edges": [{"u": 0, "v": "mid", "compute": 1.5},
 {"u": "mid", "v": "out", "cost": 0}], "comment": "extra keys are ignored"})";

}  // namespace

TEST_CASE("the shared reference graphs: reach the reference optimum") {
  struct ref {
    const char* file;
    std::size_t vertices, edges;
    ck::cost_t best, regular;
  };
  // Vertex and edge counts, optimum and regular sum as stored in the files.
  for (const ref r :
       {ref{"alexnet.json", 16, 15, 276800, 764776}, ref{"resnet18.json", 53, 60, 2107392, 6073320},
        ref{"inception_v3.json", 221, 255, 5388384, 23592792}}) {
    CAPTURE(r.file);
    const auto path = data_dir / "ogc" / r.file;
    const ck::graph g = ck::load_graph_json(path);
    CHECK(g.vertex_count() == r.vertices);
    CHECK(g.edge_count() == r.edges);
    CHECK(g.total_cost() == r.regular);
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(static_cast<ck::cost_t>(number_after(text, "reference_best_total_cost")) == r.best);
    const ck::plan p = ck::solve(g);
    CHECK(p.cost <= r.best);
    CHECK(p.cost == r.best);  // and no lower: the reference is optimal on these graphs
    CHECK(ck::evaluate(g, p.checkpoints).cost == p.cost);
  }
}

TEST_CASE("a small graph: ids, costs, compute, extra keys") {
  const ck::graph g = ck::parse_graph_json(tiny);
  REQUIRE(g.vertex_count() == 3);
  CHECK(g.id(0) == "0");
  CHECK(g.id(g.source()) == "0");
  CHECK(g.id(g.target()) == "out");
  CHECK(g.cost(*g.find("mid")) == 2);
  CHECK(g.edges()[0].compute == 1.5);
  const ck::plan p = ck::solve(g);
  CHECK(p.cost == 2);
  const std::string js = ck::to_json(g, p);
  CHECK(js.find("\"cost\": 2,") != std::string::npos);
  CHECK(js.find("\"regular_cost\": 7,") != std::string::npos);
  // The written plan names vertex 0 as a number and "mid" as a string.
  CHECK(js.find("\"entry\": 0,") != std::string::npos);
  CHECK(js.find("\"vertices\": [\"mid\"]") != std::string::npos);
}

TEST_CASE("plan JSON round-trips through the reader") {
  const ck::graph g = ck::load_graph_json(data_dir / "ogc" / "resnet18.json");
  const ck::plan p = ck::solve(g);
  const std::string js = ck::to_json(g, p);
  // The writer's output is valid strict JSON with the fields the CLI documents: read it back as
  // a graph-shaped document would fail (no vertices), so check via the error it reports.
  CHECK(error_of(js).find("missing key \"vertices\"") != std::string::npos);
  CHECK(number_after(js, "cost") == static_cast<double>(p.cost));
  CHECK(number_after(js, "regular_cost") == 6073320.0);
  CHECK(js.find("\"checkpoints\": [") != std::string::npos);
  CHECK(js.find("\"solve_seconds\": ") != std::string::npos);
  CHECK(js.find(dropit::detail::concat("\"max_segment_cost\": ", p.max_segment_cost)) !=
        std::string::npos);
}

TEST_CASE("strings: escapes and unicode, read and written") {
  const std::string text =
      R"({"source": "a\"b", "target": "\u00e9\ud83d\ude00", "vertices": [{"id": "a\"b", "cost": 1},)"
      R"( {"id": "m\\id\t", "cost": 3}, {"id": "é😀", "cost": 2}],)"
      R"( "edges": [{"u": "a\"b", "v": "m\\id\t"}, {"u": "m\\id\t", "v": "\u00e9\ud83d\ude00"}]})";
  const ck::graph g = ck::parse_graph_json(text);
  CHECK(g.id(0) == "a\"b");
  CHECK(g.id(1) == "m\\id\t");
  CHECK(g.id(2) == "\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(g.target() == 2);
  const std::string js = ck::to_json(g, ck::solve(g));
  CHECK(js.find(R"("entry": "a\"b", "exit": "é😀", "cost": 3, "vertices": ["m\\id\t"])") !=
        std::string::npos);
  // The graph writer's output reads back as the same graph.
  const ck::graph again = ck::parse_graph_json(ck::to_json(g));
  REQUIRE(again.vertex_count() == 3);
  for (ck::vertex_index v = 0; v < 3; ++v)
    CHECK(again.id(v) == g.id(v));
  CHECK(again.edge_count() == 2);
}

TEST_CASE("costs: any finite non-negative number, a fraction rounded up to whole bytes") {
  auto cost_of = [](const std::string& literal) {
    const ck::graph g = ck::parse_graph_json(
        R"({"source": 0, "target": 2, "vertices": [{"id": 0, "cost": 1}, {"id": 1, "cost": )" +
        literal + R"(}, {"id": 2, "cost": 1}], "edges": [{"u": 0, "v": 1}, {"u": 1, "v": 2}]})");
    return g.cost(1);
  };
  CHECK(cost_of("0") == 0);
  CHECK(cost_of("-0") == 0);
  CHECK(cost_of("-0.0") == 0);
  CHECK(cost_of("0.0") == 0);
  CHECK(cost_of("0e-400") == 0);
  CHECK(cost_of("7") == 7);
  CHECK(cost_of("5.0") == 5);
  CHECK(cost_of("1e3") == 1000);
  CHECK(cost_of("1E+3") == 1000);
  CHECK(cost_of("0.5") == 1);
  CHECK(cost_of("2.5") == 3);
  CHECK(cost_of("2.0000001") == 3);
  CHECK(cost_of("1e-5") == 1);
  CHECK(cost_of("1e-400") == 1);  // too small for a double, but above zero
  CHECK(cost_of("0.000001e-320") == 1);
  CHECK(cost_of("0.5e-400") == 1);
  CHECK(cost_of("123.5e-999") == 1);
  CHECK(cost_of("602111.25") == 602112);
  CHECK(cost_of("1.5e9") == 1500000000);
  CHECK(cost_of("9223372036854775805") == 9223372036854775805);  // exact; the total is 2^63 - 1
  CHECK(cost_of("9.2e18") == 9200000000000000000);
  // A plan is made of the rounded costs: keep "b", recompute {"a"} and {"c"}: 2 + 11.
  const ck::graph g = ck::parse_graph_json(
      R"({"source": "s", "target": "t", "vertices": [{"id": "s", "cost": 0.5},
          {"id": "a", "cost": 10.2}, {"id": "b", "cost": 1.5}, {"id": "c", "cost": 10.1},
          {"id": "t", "cost": 4.9}], "edges": [{"u": "s", "v": "a"}, {"u": "a", "v": "b"},
          {"u": "b", "v": "c"}, {"u": "c", "v": "t"}]})");
  CHECK(g.total_cost() == 1 + 11 + 2 + 11 + 5);
  const ck::plan p = ck::solve(g);
  CHECK(p.cost == 13);
  REQUIRE(p.checkpoints.size() == 1);
  CHECK(g.id(p.checkpoints[0]) == "b");
}

TEST_CASE("syntax errors name the line and column, then the path of the value being read") {
  // The grammar is checked by nlohmann::json: its wording is matched loosely (a key phrase), the
  // position (line:column in bytes, where the reader stopped) and the path exactly.
  struct bad {
    std::string text, where, says;
  };
  const bad cases[] = {
      {"", "1:1: ", "unexpected end of input"},
      {"{\"a\": 1,}", "1:9: ", "unexpected '}'"},
      {"[1, 2,]", "1:7: [2]: ", "unexpected ']'"},
      {"{\n  \"a\": 01\n}", "2:9: ", "unexpected number literal"},  // 0, then 1
      {"{\n\n    \"a\" 1}", "3:9: a: ", "expected ':'"},
      {"{\"a\": tru}", "1:10: a: ", "invalid literal"},
      {"{\"a\": \"x", "1:9: a: ", "missing closing quote"},
      {"{\"a\": \"x\ny\"}", "1:9: a: ", "control character U+000A"},
      {"{\"a\": \"\\q\"}", "1:9: a: ", "forbidden character after backslash"},
      {"{\"a\": \"\\u12g4\"}", "1:12: a: ", "must be followed by 4 hex digits"},
      {"{\"a\": \"\\udc00\"}", "1:13: a: ", "surrogate U+DC00..U+DFFF must follow"},
      {"{\"a\": \"\\ud800x\"}", "1:14: a: ", "must be followed by U+DC00..U+DFFF"},
      {"{\"a\": 1} x", "1:10: ", "expected end of input"},
      {"{\"a\": -}", "1:8: a: ", "expected digit after '-'"},
      {"{\"a\": 1.}", "1:9: a: ", "expected digit after '.'"},
      {"{\"a\": 1e}", "1:9: a: ", "after exponent"},
      {"{\"a\": 1e999}", "1:7: a: ", "number overflow parsing '1e999'"},
      {"{\"a\": NaN}", "1:7: a: ", "invalid literal"},
      {"{\"a\": [{\"b\": -Infinity}]}", "1:15: a[0].b: ", "expected digit after '-'"},
      {"{\"a\": [1 2]}", "1:10: a[1]: ", "expected ']'"},
      {"{\"a\": 1 \"b\": 2}", "1:11: ", "expected '}'"},
      {"// c\n{}", "1:1: ", "invalid literal"},
  };
  for (const bad& b : cases) {
    CAPTURE(b.text);
    const std::string got = error_of(b.text);
    CHECK(got.starts_with("dropit: g.json:" + b.where));
    CHECK(got.find(b.says) != std::string::npos);
  }
  CHECK(error_of("{\"a\": 1, \"a\": 2}") == "dropit: g.json:1:10: duplicate key \"a\"");
  CHECK(error_of(std::string(600, '[') + std::string(600, ']')) ==
        "dropit: g.json:1:513: values nested deeper than 512");
  // A UTF-8 byte order mark is skipped (RFC 8259 lets a parser ignore one); positions still count
  // its three bytes.
  CHECK(error_of("\xef\xbb\xbf" + std::string(tiny)) == "");
  CHECK(error_of("\xef\xbb\xbf[]") ==
        "dropit: g.json:1:4: document: expected an object, got an array");
}

TEST_CASE("objects with many keys: every duplicate found, in time linear in the keys") {
  // 200,000 extra keys (ignored by the graph reader); a pairwise duplicate check took minutes.
  std::string text = R"({"source": 0, "target": 1, "vertices": [{"id": 0, "cost": 1},)"
                     R"( {"id": 1, "cost": 1}], "edges": [{"u": 0, "v": 1}])";
  for (int i = 0; i < 200000; ++i)
    text += dropit::detail::concat(", \"k", i, "\": ", i);
  const auto g = ck::parse_graph_json(text + "}", "g.json");
  CHECK(g.vertex_count() == 2);
  // The same object with "k123456" again at the end: reported where the second one starts.
  const std::string again = text + ", ";
  CHECK(
      error_of(again + "\"k123456\": 0}") ==
      dropit::detail::concat("dropit: g.json:1:", again.size() + 1, ": duplicate key \"k123456\""));
}

TEST_CASE("schema errors name the key and where it is") {
  auto doc = [](const std::string& vertices, const std::string& edges,
                const std::string& ends = R"("source": 1, "target": 2)") {
    return "{" + ends + ",\n\"vertices\": " + vertices + ",\n\"edges\": " + edges + "}";
  };
  const std::string vs = R"([{"id": 1, "cost": 1}, {"id": 2, "cost": 1}])";
  const std::string es = R"([{"u": 1, "v": 2}])";
  CHECK(error_of(doc(vs, es)) == "");
  CHECK(error_of("[]") == "dropit: g.json:1:1: document: expected an object, got an array");
  CHECK(error_of(R"({"source": 1, "target": 2, "edges": []})") ==
        "dropit: g.json:1:1: document: missing key \"vertices\"");
  CHECK(error_of(doc("{}", es)) ==
        "dropit: g.json:2:13: vertices: expected an array, got an object");
  CHECK(error_of(doc(R"([{"id": 1, "cost": 1}, 5])", es)) ==
        "dropit: g.json:2:36: vertices[1]: expected an object, got a number");
  CHECK(error_of(doc(R"([{"cost": 1}])", es)) ==
        "dropit: g.json:2:14: vertices[0]: missing key \"id\"");
  CHECK(error_of(doc(R"([{"id": true, "cost": 1}])", es)) ==
        "dropit: g.json:2:21: vertices[0].id: expected an integer or a string id, got a boolean");
  CHECK(error_of(doc(R"([{"id": 1.5, "cost": 1}])", es)) ==
        "dropit: g.json:2:21: vertices[0].id: expected an integer or a string id, got 1.5");
  const std::string bad_cost =
      "vertices[0].cost: expected a finite non-negative number of bytes (at most 2^63 - 1), got ";
  // Negative, too large for int64 (2^63 included: 9223372036854775807.0 rounds to it).
  for (const std::string cost :
       {"-3", "-0.5", "-1e-400", "99999999999999999999", "9.3e18", "9223372036854775807.0"}) {
    CAPTURE(cost);
    CHECK(error_of(doc("[{\"id\": 1, \"cost\": " + cost + "}]", es)) ==
          "dropit: g.json:2:32: " + bad_cost + cost);
  }
  // Beyond a double (the JSON parser's own error, at the literal), and not JSON numbers at all.
  for (const std::string cost : {"1e400", "0.00001e999", "NaN", "Infinity", "-inf"}) {
    CAPTURE(cost);
    const std::string got = error_of(doc("[{\"id\": 1, \"cost\": " + cost + "}]", es));
    CHECK(got.starts_with(cost == "-inf" ? "dropit: g.json:2:33: vertices[0].cost: "
                                         : "dropit: g.json:2:32: vertices[0].cost: "));
    CHECK(got.find(cost.ends_with("e400") || cost.ends_with("e999") ? "number overflow"
                   : cost == "-inf"                                 ? "expected digit after '-'"
                                    : "invalid literal") != std::string::npos);
  }
  CHECK(error_of(doc(R"([{"id": 1, "cost": 9223372036854775807}, {"id": 2, "cost": 1}])", es)) ==
        "dropit: g.json:2:72: vertices[1].cost: the total cost overflows 64 bits");
  CHECK(error_of(doc(R"([{"id": 1, "cost": "7"}])", es)) ==
        "dropit: g.json:2:32: vertices[0].cost: expected a non-negative number of bytes, got a "
        "string");
  CHECK(error_of(doc(R"([{"id": 1, "cost": 1}, {"id": "1", "cost": 1}])", es)) ==
        "dropit: g.json:2:43: vertices[1].id: duplicate vertex id \"1\"");
  CHECK(error_of(doc(vs, R"([{"u": 1, "v": 3}])")) ==
        "dropit: g.json:3:25: edges[0].v: unknown vertex id \"3\"");
  // A string value is located at its opening quote, escaped quotes and backslashes inside it.
  CHECK(error_of(doc(vs, R"([{"u": 1, "v": "q\\\"z\\"}])")) ==
        "dropit: g.json:3:25: edges[0].v: unknown vertex id \"q\\\"z\\\"");
  CHECK(error_of(doc(vs, R"([{"v": 2}])")) == "dropit: g.json:3:11: edges[0]: missing key \"u\"");
  CHECK(error_of(doc(vs, R"([{"u": 1, "v": 2, "cost": 5}])"))
            .find("edges[0].cost: edges carry no memory") != std::string::npos);
  CHECK(error_of(doc(vs, R"([{"u": 1, "v": 2, "compute": -1}])")) ==
        "dropit: g.json:3:39: edges[0].compute: expected a finite non-negative number, got -1");
  CHECK(error_of(doc(vs, es, R"("source": 7, "target": 2)")) ==
        "dropit: g.json:1:12: source: unknown vertex id \"7\"");
  CHECK(error_of(doc(vs, es, R"("source": 1)")) ==
        "dropit: g.json:1:1: document: missing key \"target\"");
  // Graph errors come after the syntax is fine, and name the vertex.
  CHECK(error_of(doc(vs, R"([{"u": 1, "v": 2}, {"u": 2, "v": 1}])")) ==
        "dropit: g.json: checkpoint: the graph has a cycle through vertex \"1\": \"1\" -> \"2\" -> "
        "\"1\"");
  CHECK(error_of(
            doc(R"([{"id": 1, "cost": 1}, {"id": 2, "cost": 1}, {"id": "x", "cost": 1}])", es)) ==
        "dropit: g.json: checkpoint: vertex \"x\" is not reachable from source \"1\"");
}

TEST_CASE("files: a missing file is reported by name") {
  CHECK_THROWS_WITH_AS((void)ck::load_graph_json(data_dir / "no-such-file.json"),
                       doctest::Contains("no-such-file.json"), dropit::error);
}

TEST_CASE("mangled files are rejected with dropit::error, never anything worse") {
  std::ifstream in(data_dir / "ogc" / "resnet18.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937_64 rng(5);
  const char bytes[] = "{}[],:\"\\0123456789-+.eEtrufalsn \n\x01\xff";
  int parsed = 0, rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string t = text;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % t.size();
      switch (rng() % 3) {
        case 0:
          t[at] = bytes[rng() % (sizeof bytes - 1)];
          break;
        case 1:
          t.erase(at, 1 + rng() % 8);
          break;
        default:
          t.insert(at, 1, bytes[rng() % (sizeof bytes - 1)]);
          break;
      }
    }
    try {
      const ck::graph g = ck::parse_graph_json(t, "fuzz.json");
      CHECK(ck::solve(g).cost >= 0);
      ++parsed;
    } catch (const dropit::error& err) {
      CHECK(std::string_view(err.what()).starts_with("dropit: fuzz.json"));
      ++rejected;
    }
  }
  CHECK(parsed + rejected == 3000);
  CHECK(rejected > 1000);  // most edits break something
}

TEST_CASE("v2 keys: vertex times and storage options, read, written and planned") {
  const std::string text = R"({"source": "s", "target": "t", "vertices": [
 {"id": "s", "cost": 1},
 {"id": "a", "cost": 8, "time": 5, "storage": [{"name": "MinK 0.9", "bytes": 2.5, "time": 1},
                                               {"name": "int8", "bytes": 3}]},
 {"id": "b", "cost": 6},
 {"id": "t", "cost": 1}],
 "edges": [{"u": "s", "v": "a"}, {"u": "a", "v": "b", "compute": 4}, {"u": "b", "v": "t"}]})";
  const ck::graph g = ck::parse_graph_json(text, "g.json");
  const ck::vertex_index a = *g.find("a"), b = *g.find("b");
  CHECK(g.has_time(a));
  CHECK(g.time(a) == 5.0);
  CHECK(!g.has_time(b));
  CHECK(g.time(b) == 4.0);  // no "time": its input edges' compute
  REQUIRE(g.storage(a).size() == 2);
  CHECK(g.storage(a)[0].name == "MinK 0.9");
  CHECK(g.storage(a)[0].bytes == 3);  // rounded up, as costs are
  CHECK(g.storage(a)[0].time == 1.0);
  CHECK(g.storage(a)[1].time == 0.0);  // "time" is optional
  CHECK(g.storage(b).empty());
  // The graph writer keeps both keys; reading its output gives the same graph.
  const std::string written = ck::to_json(g);
  CHECK(written.find(R"("time": 5, "storage": [{"name": "MinK 0.9", "bytes": 3, "time": 1})") !=
        std::string::npos);
  const ck::graph again = ck::parse_graph_json(written);
  CHECK(again.time(*again.find("a")) == 5.0);
  CHECK(!again.has_time(*again.find("b")));
  REQUIRE(again.storage(*again.find("a")).size() == 2);
  CHECK(again.storage(*again.find("a"))[1].name == "int8");
  // Budget 9: "a" stored as int8 (3 bytes, no time) and "b" kept: 3 + 6; the plan writer lists
  // the compressed vertex with its option, and the extra time.
  const ck::plan p = ck::solve_budget(g, 9);
  CHECK(p.cost == 9);
  REQUIRE(p.compressed.size() == 1);
  CHECK(p.compressed[0].vertex == a);
  CHECK(p.compressed[0].option == 1);
  const std::string js = ck::to_json(g, p);
  CHECK(js.find(R"("compressed": [)"
                "\n"
                R"(    {"vertex": "a", "option": "int8", "bytes": 3, "time": 0})") !=
        std::string::npos);
  CHECK(number_after(js, "compressed_cost") == 3.0);
  CHECK(number_after(js, "extra_time") == 0.0);
  CHECK(js.find("\"exact\": true") != std::string::npos);
  // Budget 3: "a" compressed and "b" dropped is not allowed ("b" would be recomputed from the
  // compressed "a"): 3 + 6 is the least with "a" compressed; dropping both costs 14.
  CHECK_THROWS_WITH_AS((void)ck::solve_budget(g, 8), doctest::Contains("the least memory is 9"),
                       dropit::error);
  // A plan of solve() still writes every key: no compression; solve() drops "a" and "b" (one
  // segment of 14), so the extra time is their times, 5 + 4, while `recompute` sums the edges'
  // compute into them, 0 + 4.
  const ck::plan old_plan = ck::solve(g);
  REQUIRE(old_plan.cost == 14);
  const std::string old = ck::to_json(g, old_plan);
  CHECK(old.find("\"compressed\": [],") != std::string::npos);
  CHECK(number_after(old, "extra_time") == 9.0);
  CHECK(number_after(old, "recompute") == 4.0);
}

TEST_CASE("v2 keys: errors name the line, column and key path") {
  auto doc = [](const std::string& extra) {
    return std::string(R"({"source": 1, "target": 2, "vertices": [{"id": 1, "cost": 1},)") + "\n" +
           R"({"id": 3, "cost": 5)" + extra + "},\n" + R"({"id": 2, "cost": 1}],)" +
           R"( "edges": [{"u": 1, "v": 3}, {"u": 3, "v": 2}]})";
  };
  CHECK(error_of(doc("")) == "");
  CHECK(error_of(doc(R"(, "time": 2.5, "storage": [])")) == "");
  CHECK(error_of(doc(R"(, "time": -1)")) ==
        "dropit: g.json:2:30: vertices[1].time: expected a finite non-negative number, got -1");
  CHECK(error_of(doc(R"(, "time": "1")")) ==
        "dropit: g.json:2:30: vertices[1].time: expected a finite non-negative number, got a "
        "string");
  CHECK(error_of(doc(R"(, "storage": {})")) ==
        "dropit: g.json:2:33: vertices[1].storage: expected an array, got an object");
  CHECK(error_of(doc(R"(, "storage": [7])")) ==
        "dropit: g.json:2:34: vertices[1].storage[0]: expected an object, got a number");
  CHECK(error_of(doc(R"(, "storage": [{"bytes": 1}])")) ==
        "dropit: g.json:2:34: vertices[1].storage[0]: missing key \"name\"");
  CHECK(error_of(doc(R"(, "storage": [{"name": 4, "bytes": 1}])")) ==
        "dropit: g.json:2:43: vertices[1].storage[0].name: expected a string, got a number");
  CHECK(error_of(doc(R"(, "storage": [{"name": "", "bytes": 1}])")) ==
        "dropit: g.json:2:43: vertices[1].storage[0].name: expected a non-empty name");
  CHECK(error_of(doc(R"(, "storage": [{"name": "q"}])")) ==
        "dropit: g.json:2:34: vertices[1].storage[0]: missing key \"bytes\"");
  CHECK(error_of(doc(R"(, "storage": [{"name": "q", "bytes": -2}])")) ==
        "dropit: g.json:2:57: vertices[1].storage[0].bytes: expected a finite non-negative "
        "number of bytes (at most 2^63 - 1), got -2");
  CHECK(error_of(doc(R"(, "storage": [{"name": "q", "bytes": 1, "time": -0.5}])")) ==
        "dropit: g.json:2:68: vertices[1].storage[0].time: expected a finite non-negative number, "
        "got -0.5");
  CHECK(error_of(doc(R"(, "storage": [{"name": "q", "bytes": 1}, {"name": "q", "bytes": 2}])")) ==
        "dropit: g.json:2:70: vertices[1].storage[1].name: duplicate storage option \"q\"");
  CHECK(error_of(doc(R"(, "storage": [{"name": "q", "bytes": 1, "time": NaN}])"))
            .starts_with("dropit: g.json:2:68: vertices[1].storage[0].time: syntax error"));
}
