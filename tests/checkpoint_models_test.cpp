// The model builders: at batch 1 they reproduce the reference parser's graphs in the shared data
// (structure fingerprint and optimum), and their shapes follow the layer arithmetic.
#include <dropit/checkpoint.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ck = dropit::checkpoint;

#ifndef DROPIT_TEST_DATA_DIR
#error "DROPIT_TEST_DATA_DIR must name tests/data"
#endif

namespace {

/// What two graphs must share to be the same network up to vertex names: the sorted costs, the
/// sorted (in-degree, out-degree, cost) of every vertex, and the sorted (cost, cost) of every edge.
struct fingerprint {
  std::vector<std::tuple<std::size_t, std::size_t, ck::cost_t>> vertices;
  std::vector<std::pair<ck::cost_t, ck::cost_t>> edges;
  bool operator==(const fingerprint&) const = default;
};

fingerprint fingerprint_of(const ck::graph& g) {
  std::vector<std::size_t> in(g.vertex_count()), out(g.vertex_count());
  fingerprint f;
  for (const auto& e : g.edges()) {
    ++out[e.from];
    ++in[e.to];
    f.edges.emplace_back(g.cost(e.from), g.cost(e.to));
  }
  for (ck::vertex_index v = 0; v < g.vertex_count(); ++v)
    f.vertices.emplace_back(in[v], out[v], g.cost(v));
  std::sort(f.vertices.begin(), f.vertices.end());
  std::sort(f.edges.begin(), f.edges.end());
  return f;
}

}  // namespace

TEST_CASE("builders at batch 1 match the reference parser's graphs") {
  const std::filesystem::path dir = std::filesystem::path(DROPIT_TEST_DATA_DIR) / "ogc";
  struct pair_t {
    const char* file;
    ck::graph built;
  };
  const pair_t cases[] = {
      {"alexnet.json", ck::models::alexnet({1, 3, 224, 224}, 1)},
      {"resnet18.json", ck::models::resnet(18, {1, 3, 224, 224}, 1)},
      {"inception_v3.json", ck::models::inception_v3({1, 3, 300, 300}, 1)},
  };
  for (const auto& c : cases) {
    CAPTURE(c.file);
    const ck::graph ref = ck::load_graph_json(dir / c.file);
    CHECK(c.built.vertex_count() == ref.vertex_count());
    CHECK(c.built.edge_count() == ref.edge_count());
    CHECK(c.built.total_cost() == ref.total_cost());
    CHECK(fingerprint_of(c.built) == fingerprint_of(ref));
    CHECK(c.built.cost(c.built.source()) == ref.cost(ref.source()));
    CHECK(c.built.cost(c.built.target()) == ref.cost(ref.target()));
    CHECK(ck::solve(c.built).cost == ck::solve(ref).cost);
  }
}

TEST_CASE("layer arithmetic spot checks") {
  const ck::graph r50 = ck::models::resnet(50, {64, 3, 224, 224});
  // 1 input + conv1, bn1, maxpool + 16 bottlenecks x 7 + 4 downsamples x 2 + avgpool, flatten, fc
  CHECK(r50.vertex_count() == 127);
  CHECK(r50.cost(*r50.find("conv1")) == 64 * 64 * 112 * 112 * 4);
  CHECK(r50.cost(*r50.find("layer4.2.add")) == 64 * 2048 * 7 * 7 * 4);
  CHECK(r50.cost(*r50.find("fc")) == 64 * 1000 * 4);
  const ck::graph d201 = ck::models::densenet(201, {16, 3, 224, 224});
  // 1 + 3 stem + 98 layers x 5 + 3 transitions x 3 + norm5, pool, view, classifier
  CHECK(d201.vertex_count() == 507);
  CHECK(d201.cost(*d201.find("features.norm5")) == 16 * 1920 * 7 * 7 * 4);
  CHECK(d201.cost(*d201.find("features.denseblock1.denselayer6.cat")) == 16 * 256 * 56 * 56 * 4);
  const ck::graph d161 = ck::models::densenet(161, {1, 3, 224, 224}, 1);
  CHECK(d161.cost(*d161.find("features.conv0")) == 96 * 112 * 112);
  CHECK(d161.cost(*d161.find("features.norm5")) == 2208 * 7 * 7);
  const ck::graph v16 = ck::models::vgg(16, {1, 3, 224, 224}, 1);
  CHECK(v16.vertex_count() == 1 + 13 + 5 + 2 + 5);
  CHECK(v16.cost(*v16.find("features.30")) == 512 * 7 * 7);  // the last max pool
  const ck::graph inc = ck::models::inception_v3({1, 3, 299, 299}, 1);
  CHECK(inc.cost(*inc.find("Mixed_5b.cat")) == 256 * 35 * 35);
  CHECK(inc.cost(*inc.find("Mixed_6e.cat")) == 768 * 17 * 17);
  CHECK(inc.cost(*inc.find("Mixed_7c.cat")) == 2048 * 8 * 8);
}

TEST_CASE("every model builds, is valid, and its plan is consistent") {
  for (std::string_view name : ck::models::names()) {
    CAPTURE(name);
    const ck::models::input_shape in{2, 3, name == "inception_v3" ? 299 : 224,
                                     name == "inception_v3" ? 299 : 224};
    const ck::graph g = ck::models::make(name, in);
    const ck::plan p = ck::solve(g);
    CHECK(p.cost > 0);
    CHECK(p.cost < p.regular_cost);
    const ck::plan e = ck::evaluate(g, p.checkpoints);
    CHECK(e.cost == p.cost);
    CHECK(e.segments.size() == p.segments.size());
    CHECK(p.recompute > 0.0);
  }
}

TEST_CASE("the optimum scales exactly with batch and element size") {
  const ck::plan one = ck::solve(ck::models::resnet(34, {1, 3, 224, 224}, 1));
  const ck::plan many = ck::solve(ck::models::resnet(34, {128, 3, 224, 224}, 4));
  CHECK(many.cost == one.cost * 128 * 4);
  CHECK(many.regular_cost == one.regular_cost * 128 * 4);
}

TEST_CASE("bad model requests are rejected by name") {
  CHECK_THROWS_WITH_AS((void)ck::models::make("resnet51", {}), doctest::Contains("\"resnet51\""),
                       dropit::error);
  CHECK_THROWS_WITH_AS((void)ck::models::resnet(51, {}), doctest::Contains("ResNet-51"),
                       dropit::error);
  CHECK_THROWS_WITH_AS((void)ck::models::inception_v3({1, 3, 64, 64}),
                       doctest::Contains("inception_v3: the input is too small"), dropit::error);
  CHECK_THROWS_WITH_AS((void)ck::models::vgg(16, {0, 3, 224, 224}),
                       doctest::Contains("bad input shape"), dropit::error);
}
