// SparseCache::load: a payload taken from bytes restores what its pack restores, and bytes that
// are not exactly a pack's payload are refused with the cache unchanged. Accepted corruptions are
// checked against the format re-encoded here from scratch (test_support.hpp's oracles).
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <cstring>
#include <memory_resource>
#include <new>
#include <string>
#include <vector>

using namespace dropit_test;

namespace {

using bytes = std::vector<std::byte>;

template <class Cache>
bytes payload_of(const Cache& c) {
  return {c.payload().begin(), c.payload().end()};
}

/// Restores a cache into a new vector (filled with 7s first, so no stale zero passes).
template <class Cache>
auto restored(const Cache& c) {
  using T = typename Cache::value_type;
  std::vector<T> out(c.size(), from_double<T>(7.0));
  c.restore(dropit::host, std::span<T>(out));
  return out;
}

template <class U>
void put(bytes& b, std::size_t at, U v) {
  std::memcpy(b.data() + at, &v, sizeof(U));
}

/// The payload format.hpp describes for these kept positions, built here bit by bit: the values
/// section copied from `values_from`, zero padding, then positions and block offsets. n < 2^32.
bytes encode(const dropit::packed_layout& l, const std::vector<std::size_t>& kept,
             const bytes& values_from) {
  bytes b(l.total_bytes, std::byte{0});
  const std::size_t values_end = l.scales_offset + l.scales_bytes;
  std::memcpy(b.data(), values_from.data(), std::max(values_end, l.values_bytes));
  switch (l.positions) {
    case dropit::position_encoding::bitmask:
      for (const std::size_t i : kept) {
        const std::size_t at = l.positions_offset + i / 32 * 4;
        std::uint32_t w;
        std::memcpy(&w, b.data() + at, 4);
        put(b, at, w | std::uint32_t{1} << (i % 32));
      }
      for (std::size_t blk = 0; blk < ceil_div(l.n, 1024); ++blk)
        put(b, l.block_offsets_offset + blk * 4,
            static_cast<std::uint32_t>(std::lower_bound(kept.begin(), kept.end(), blk * 1024) -
                                       kept.begin()));
      break;
    case dropit::position_encoding::index32:
      for (std::size_t j = 0; j < kept.size(); ++j)
        put(b, l.positions_offset + j * 4, static_cast<std::uint32_t>(kept[j]));
      break;
    case dropit::position_encoding::elias_fano: {
      const ef_oracle_code c = elias_fano_oracle(l.n, kept);
      for (std::size_t w = 0; w < c.low.size(); ++w)
        put(b, l.positions_offset + w * 8, c.low[w]);
      for (std::size_t w = 0; w < c.high.size(); ++w)
        put(b, l.positions_offset + c.low.size() * 8 + w * 8, c.high[w]);
      for (std::size_t blk = 0; blk < c.block_counts.size(); ++blk)
        put(b, l.block_offsets_offset + blk * 4, static_cast<std::uint32_t>(c.block_counts[blk]));
      break;
    }
    default:
      break;
  }
  return b;
}

template <class P, class C>
using cache_t = dropit::SparseCache<float, P, C>;

}  // namespace

TEST_CASE_TEMPLATE("a loaded payload restores what its pack restores", T, DROPIT_TEST_TYPES) {
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{33}, std::size_t{5000}, std::size_t{70001}}) {
    const auto x = normal_values<T>(n, 7 + n);
    for (const double gamma : {0.0, 0.5, 0.9, 0.99, 0.999, 1.0}) {
      for (const auto choice :
           {dropit::position_choice::smallest, dropit::position_choice::no_elias_fano}) {
        CAPTURE(n);
        CAPTURE(gamma);
        auto round_trip = [&](auto packed, auto loaded) {
          packed.positions() = choice;
          packed.pack(dropit::host, std::span<const T>(x));
          // Taken from an odd address: load reads any alignment.
          bytes shifted(packed.bytes() + 1);
          if (packed.bytes() > 0)
            std::memcpy(shifted.data() + 1, packed.payload().data(), packed.bytes());
          loaded.load(dropit::host, packed.size(), packed.kept(), packed.layout().positions,
                      std::span<const std::byte>(shifted).subspan(1));
          CHECK(loaded.layout() == packed.layout());
          CHECK(payload_of(loaded) == payload_of(packed));
          CHECK(loaded.restore_scale() == packed.restore_scale());
          const auto a = restored(packed), b = restored(loaded);
          CHECK(same_bits(std::span<const T>(a), std::span<const T>(b)));
        };
        round_trip(dropit::SparseCache<T, dropit::MinK<>>{dropit::MinK<>{gamma}},
                   dropit::SparseCache<T, dropit::MinK<>>{dropit::MinK<>{gamma}});
        round_trip(dropit::SparseCache<T, dropit::Random<>>{dropit::Random<>{gamma, 3}},
                   dropit::SparseCache<T, dropit::Random<>>{dropit::Random<>{gamma, 3}});
        using int8 = dropit::codec::int8;
        round_trip(dropit::SparseCache<T, dropit::MinK<>, int8>{dropit::MinK<>{gamma}},
                   dropit::SparseCache<T, dropit::MinK<>, int8>{dropit::MinK<>{gamma}});
        using fp8 = dropit::codec::fp8_e4m3;
        round_trip(dropit::SparseCache<T, dropit::Identity, fp8>{},
                   dropit::SparseCache<T, dropit::Identity, fp8>{});
      }
    }
  }
}

TEST_CASE("every bit flipped outside the values is refused or gives a payload of the format") {
  // bitmask (0.5), Elias-Fano (0.9), bitmask without Elias-Fano (0.9), index list (0.999); with
  // exact and int8 values (int8 adds a scales section and its padding).
  struct setup {
    double gamma;
    dropit::position_choice choice;
    dropit::position_encoding expect;
  };
  const std::size_t n = 3001;
  const auto x = normal_values<float>(n, 11);  // no zero: restored zeros are dropped elements
  for (const setup s :
       {setup{0.5, dropit::position_choice::smallest, dropit::position_encoding::bitmask},
        setup{0.9, dropit::position_choice::smallest, dropit::position_encoding::elias_fano},
        setup{0.9, dropit::position_choice::no_elias_fano, dropit::position_encoding::bitmask},
        setup{0.999, dropit::position_choice::smallest, dropit::position_encoding::index32}}) {
    auto flips = [&](auto cache) {
      cache.positions() = s.choice;
      cache.pack(dropit::host, std::span<const float>(x));
      const dropit::packed_layout l = cache.layout();
      REQUIRE(l.positions == s.expect);
      const bytes good = payload_of(cache);
      std::size_t refused = 0, accepted = 0;
      for (std::size_t bit = l.values_bytes * 8; bit < good.size() * 8; ++bit) {
        if (bit / 8 >= l.scales_offset && bit / 8 < l.scales_offset + l.scales_bytes)
          continue;  // scales may be any bits
        bytes bad = good;
        bad[bit / 8] ^= std::byte{1} << (bit % 8);
        auto target = decltype(cache){cache.policy()};
        target.load(dropit::host, n, l.k, l.positions, good);  // holds something first
        try {
          target.load(dropit::host, n, l.k, l.positions, bad);
        } catch (const dropit::error& e) {
          CHECK(std::string(e.what()).find("load: ") != std::string::npos);
          CHECK(payload_of(target) == good);  // unchanged
          ++refused;
          continue;
        }
        ++accepted;
        // Accepted: it must be exactly the format's encoding of the positions it restores.
        const auto out = restored(target);
        const auto kept = nonzero_positions(out);
        REQUIRE(kept.size() == l.k);
        CHECK(encode(l, kept, bad) == bad);
      }
      CAPTURE(s.gamma);
      CAPTURE(accepted);
      CHECK(refused > 0);
      // A bitmask flip changes a count; a low-bit or index-list flip may move one position.
      if (s.expect == dropit::position_encoding::bitmask) {
        CHECK(accepted == 0);
      } else {
        CHECK(accepted > 0);
      }
    };
    flips(cache_t<dropit::MinK<>, dropit::codec::exact>{dropit::MinK<>{s.gamma}});
    flips(cache_t<dropit::MinK<>, dropit::codec::int8>{dropit::MinK<>{s.gamma}});
  }
}

TEST_CASE("load refuses descriptions no pack writes, and keeps the cache as it was") {
  const auto x = normal_values<float>(5000, 3);
  cache_t<dropit::MinK<>, dropit::codec::exact> a{dropit::MinK<>{0.9}};
  a.pack(dropit::host, std::span<const float>(x));
  REQUIRE(a.layout().positions == dropit::position_encoding::elias_fano);
  const bytes good = payload_of(a);
  cache_t<dropit::MinK<>, dropit::codec::exact> b{dropit::MinK<>{0.9}};
  b.pack(dropit::host, std::span<const float>(x).first(100));
  const bytes before = payload_of(b);
  auto refuses = [&](std::size_t n, std::size_t k, dropit::position_encoding e, const bytes& p,
                     const std::string& message) {
    CAPTURE(message);
    try {
      b.load(dropit::host, n, k, e, p);
      FAIL("accepted");
    } catch (const dropit::error& err) {
      CHECK(std::string(err.what()).find(message) != std::string::npos);
    }
    CHECK(b.size() == 100);
    CHECK(payload_of(b) == before);
  };
  using enum dropit::position_encoding;
  refuses(5000, 5001, elias_fano, good, "load: k = 5001 kept elements of n = 5000");
  refuses(std::size_t{1} << 60, 1, index64, good, "elements is more than the");
  refuses(5000, 500, index32, good,
          "stores its positions as elias_fano or bitmask, not as index32");
  refuses(5000, 5000, bitmask, good, "stores its positions as none, not as bitmask");
  refuses(5000, 501, elias_fano, good, "the payload has");
  bytes longer = good;
  longer.push_back(std::byte{0});
  refuses(5000, 500, elias_fano, longer, "the payload has");
  refuses(5000, 500, elias_fano, bytes(good.begin(), good.end() - 1), "the payload has");

  // An index list that repeats or leaves n, built by hand.
  cache_t<dropit::MinK<>, dropit::codec::exact> c{dropit::MinK<>{0.999}};
  c.pack(dropit::host, std::span<const float>(x));
  const dropit::packed_layout l = c.layout();
  REQUIRE(l.positions == index32);
  bytes list = payload_of(c);
  put(list, l.positions_offset + 4, std::uint32_t{0});
  put(list, l.positions_offset, std::uint32_t{0});
  refuses(5000, l.k, index32, list, "does not ascend");
  list = payload_of(c);
  put(list, l.positions_offset + 4 * (l.k - 1), std::uint32_t{5000});
  refuses(5000, l.k, index32, list, "not below n = 5000");

  // What the memory resource throws reaches the caller; the cache is unchanged.
  struct refusing : std::pmr::memory_resource {
    void* do_allocate(std::size_t, std::size_t) override { throw std::bad_alloc(); }
    void do_deallocate(void*, std::size_t, std::size_t) override {}
    bool do_is_equal(const memory_resource& o) const noexcept override { return this == &o; }
  } out_of_memory;
  CHECK_THROWS_AS(
      b.load(dropit::host_executor{.resource = &out_of_memory}, 5000, 500, elias_fano, good),
      std::bad_alloc);
  CHECK(payload_of(b) == before);
}
