// The value codecs (codec.hpp, detail/codec.hpp) against codec_oracle.hpp: e4m3 over every code
// and every rounding case, chunk encoding and decoding with NaN, infinities, zeros and tiny
// values, stochastic rounding's bias, the codec sections of the layout, and the host payload's
// sections byte for byte. Every executor's restore is checked in executor_cases.inl.
#include <dropit/dropit.hpp>

#include "codec_oracle.hpp"
#include "test_support.hpp"
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace dropit_test;
namespace dd = dropit::detail;

TEST_CASE("e4m3: every code decodes to its value, and encodes back") {
  for (unsigned c = 0; c < 256; ++c) {
    CAPTURE(c);
    const double want = oracle_e4m3_value(c);
    const float got = dd::e4m3_decode(static_cast<std::uint8_t>(c));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      CHECK(dd::e4m3_encode(got) == (c & 0x80u ? 0xff : 0x7f));
      continue;
    }
    CHECK(static_cast<double>(got) == want);
    CHECK(std::signbit(got) == ((c & 0x80u) != 0));
    CHECK(dd::e4m3_encode(got) == c);
  }
  CHECK(dd::e4m3_decode(0x7e) == 448.0f);
  CHECK(dd::e4m3_decode(0x01) == 0x1p-9f);
}

TEST_CASE("e4m3: encoding rounds to the nearest code, ties to even, and saturates") {
  std::vector<float> probes;
  // Every midpoint between neighbouring codes (the ties), and the floats just around it.
  for (unsigned c = 0; c < 0x7e; ++c) {
    const float mid = static_cast<float>((oracle_e4m3_value(c) + oracle_e4m3_value(c + 1)) / 2);
    for (float p : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)})
      for (float s : {1.0f, -1.0f})
        probes.push_back(s * p);
  }
  // Beyond the range, the specials, float subnormals, and random values over every exponent.
  for (float v : {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, 3.4e38f, 0.0f, -0.0f, 1e-40f,
                  -1e-40f, 0x1p-10f, 0x1p-11f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    probes.push_back(v);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int i = 0; i < 20000; ++i) {
    const int e = static_cast<int>(gen() % 30) - 20;  // 2^-20 .. 2^9
    probes.push_back((gen() & 1 ? -1.0f : 1.0f) * std::ldexp(mant(gen), e));
  }
  int wrong = 0;
  for (float p : probes) {
    if (dd::e4m3_encode(p) != oracle_e4m3_code(p)) {
      if (++wrong <= 5) {
        CAPTURE(p);
        CHECK(unsigned{dd::e4m3_encode(p)} == unsigned{oracle_e4m3_code(p)});
      }
    }
  }
  CHECK(wrong == 0);
}

namespace {

template <class T>
std::vector<T> chunk_inputs(std::size_t n, std::uint64_t seed) {
  auto x = normal_values<T>(n, seed);
  const double inf = std::numeric_limits<double>::infinity();
  if (n > 3000) {
    x[5] = from_double<T>(std::numeric_limits<double>::quiet_NaN());
    x[700] = from_double<T>(inf);
    x[1500] = from_double<T>(-inf);
    for (std::size_t i = 2048; i < 3072; ++i)  // a chunk of zeros, one of tiny values
      x[i] = from_double<T>(0.0);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      for (std::size_t i = 3072; i < std::min<std::size_t>(n, 4096); ++i)
        x[i] = from_double<T>(1e-35 * to_double(x[i]));
    }
  }
  return x;
}

/// Encodes and decodes values with the library's chunk bodies.
template <class T>
std::pair<oracle_coded, std::vector<T>> library_code(const std::vector<T>& values,
                                                     dropit::value_codec kind, bool stochastic,
                                                     std::uint64_t seed) {
  oracle_coded out;
  out.codes.resize(values.size());
  out.scales.resize(dd::codec_chunks(values.size()));
  dd::codec_params p;
  p.kind = kind;
  p.stochastic = stochastic;
  p.salt = dd::mix64(seed);
  for (std::size_t c = 0; c < out.scales.size(); ++c)
    dd::encode_chunk(values.data(), values.size(), c, p, out.codes.data(), out.scales.data());
  std::vector<T> back(values.size());
  for (std::size_t c = 0; c < out.scales.size(); ++c)
    dd::decode_chunk(out.codes.data(), out.scales.data(), values.size(), c, kind, back.data());
  return {out, back};
}

}  // namespace

TEST_CASE_TEMPLATE("int8 and e4m3 chunks: codes, scales and decoded values equal the oracle's", T,
                   DROPIT_TEST_TYPES) {
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{1024}, std::size_t{5000}}) {
    const auto x = chunk_inputs<T>(n, 11 + n);
    for (int mode = 0; mode < 3; ++mode) {
      const bool fp8 = mode == 2, stochastic = mode == 1;
      CAPTURE(n);
      CAPTURE(mode);
      const auto kind = fp8 ? dropit::value_codec::fp8_e4m3 : dropit::value_codec::int8;
      const auto [coded, back] = library_code(x, kind, stochastic, 77);
      const auto want = oracle_encode(x, fp8, stochastic, 77);
      CHECK(coded.codes == want.codes);
      CHECK(coded.scales.size() == want.scales.size());
      CHECK((want.scales.empty() ||
             std::memcmp(coded.scales.data(), want.scales.data(), want.scales.size() * 4) == 0));
      CHECK(same_bits<T>(back, oracle_decode<T>(want, fp8)));
      // The error bound: half a step of the chunk's scale (a whole step when stochastic), e4m3's
      // relative step 2^-4 (plus the subnormal step), NaN where the input was not finite.
      for (std::size_t i = 0; i < n; ++i) {
        const double v = to_double(x[i]), r = to_double(back[i]);
        if (!std::isfinite(v)) {
          CHECK(std::isnan(r));
          continue;
        }
        const double s = coded.scales[i / 1024];
        if (s == 0.0) {  // a chunk of zeros, or of values below 2^-100: restored as zeros
          CHECK(r == 0.0);
          CHECK(std::fabs(v) < 0x1p-100);
          continue;
        }
        // (half types round the decoded float once more: 2^-9 relative for bfloat16)
        const double bound =
            (fp8 ? std::fabs(v) / 16 + s * 0x1p-10 : (stochastic ? 1.0 : 0.5) * s * (1 + 1e-6)) +
            (sizeof(T) == 2 ? std::fabs(v) * 0x1p-8 : 0.0);
        if (std::fabs(r - v) > bound) {
          CAPTURE(i);
          CAPTURE(v);
          CAPTURE(r);
          CHECK(std::fabs(r - v) <= bound);
          break;
        }
      }
    }
  }
}

TEST_CASE("int8 stochastic rounding is unbiased over seeds, and reproducible per seed") {
  std::vector<float> x(1024);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i))) * 3.0f;
  const int seeds = 4000;
  std::vector<double> sum(x.size(), 0.0);
  for (int s = 0; s < seeds; ++s) {
    const auto [coded, back] = library_code(x, dropit::value_codec::int8, true, s);
    for (std::size_t i = 0; i < x.size(); ++i)
      sum[i] += back[i];
  }
  // One step is 3/127; the mean of 4000 draws is within 4 standard deviations (at most half a
  // step / sqrt(4000)) of x, where rounding to nearest is off by up to half a step.
  const double step = 3.0 / 127;
  double worst = 0, nearest_worst = 0;
  const auto nearest = library_code(x, dropit::value_codec::int8, false, 0).second;
  for (std::size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::fabs(sum[i] / seeds - x[i]));
    nearest_worst = std::max(nearest_worst, std::fabs(static_cast<double>(nearest[i]) - x[i]));
  }
  CHECK(worst < 4 * 0.5 * step / std::sqrt(static_cast<double>(seeds)));
  CHECK(nearest_worst > 0.4 * step);  // so the check above is not vacuous
  CHECK(library_code(x, dropit::value_codec::int8, true, 9).first.codes ==
        library_code(x, dropit::value_codec::int8, true, 9).first.codes);
  CHECK(library_code(x, dropit::value_codec::int8, true, 9).first.codes !=
        library_code(x, dropit::value_codec::int8, true, 10).first.codes);
}

TEST_CASE("the layout of a coded payload: codes, then scales, then positions, 16-byte aligned") {
  using dropit::make_layout;
  using dropit::value_codec;
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{100000}}) {
    for (double g : {0.0, 0.5, 0.9, 0.99, 1.0}) {
      const std::size_t k = expected_k(n, g);
      for (auto c : {value_codec::int8, value_codec::fp8_e4m3}) {
        CAPTURE(n);
        CAPTURE(g);
        const auto l = make_layout(n, k, 4, c);
        const auto exact = make_layout(n, k, 4);
        CHECK(l.codec == c);
        CHECK(l.value_size == 1);
        CHECK(l.values_bytes == k);
        CHECK(l.scales_bytes == ceil_div(k, 1024) * 4);
        CHECK(l.positions == exact.positions);
        CHECK(l.positions_bytes == exact.positions_bytes);
        CHECK(l.block_offsets_bytes == exact.block_offsets_bytes);
        if (k > 0) CHECK(l.scales_offset == (k + 15) / 16 * 16);
        if (k > 0 && k < n) {
          CHECK(l.positions_offset == (l.scales_offset + l.scales_bytes + 15) / 16 * 16);
          CHECK(l.total_bytes - l.positions_offset == exact.total_bytes - exact.positions_offset);
        } else {
          CHECK(l.total_bytes == l.scales_offset + l.scales_bytes);
        }
        // The gaps are exactly the bytes no section covers.
        std::vector<int> covered(l.total_bytes, 0);
        auto cover = [&](std::size_t at, std::size_t bytes) {
          for (std::size_t b = at; b < at + bytes; ++b)
            ++covered[b];
        };
        cover(l.values_offset, l.values_bytes);
        cover(l.scales_offset, l.scales_bytes);
        cover(l.positions_offset, l.positions_bytes);
        cover(l.block_offsets_offset, l.block_offsets_bytes);
        const auto gaps = dropit::padding_of(l);
        for (int i = 0; i < dropit::padding_gaps::count; ++i) {
          CHECK(gaps.end[i] - gaps.begin[i] < 16);
          cover(gaps.begin[i], gaps.end[i] - gaps.begin[i]);
        }
        CHECK(std::count(covered.begin(), covered.end(), 1) == static_cast<long>(covered.size()));
      }
    }
  }
}

TEST_CASE("bytes per element with a value codec (n = 2^24)") {
  using dropit::value_codec;
  const std::size_t n = std::size_t{1} << 24;
  auto per = [&](double g, value_codec c) {
    return static_cast<double>(dropit::make_layout(n, expected_k(n, g), 4, c).total_bytes) /
           static_cast<double>(n);
  };
  // Identity + int8: dense quantized storage, 4x smaller than fp32 (issue target <= 1.02).
  CHECK(per(0.0, value_codec::int8) <= 1.02);
  CHECK(per(0.0, value_codec::int8) == doctest::Approx(1.0 + 4.0 / 1024).epsilon(1e-4));
  // MinK 0.9: 0.1 values + 0.0004 scales + Elias-Fano's 3 low bits, 1 + 1/8 high bits per kept
  // (0.0656) + 0.0005 offsets.
  CHECK(per(0.9, value_codec::int8) ==
        doctest::Approx(0.1 + 0.1 * 4 / 1024 + (0.1 * 4 + 1.0 / 8) / 8 + 4.0 / 8192).epsilon(1e-3));
  CHECK(per(0.9, value_codec::fp8_e4m3) == per(0.9, value_codec::int8));
}

namespace {

/// Packs chunk_inputs(n) with MinK at several gammas with int8 (stochastic and to nearest) and
/// e4m3; checks the payload's sections against the oracle and the restore of int8 to nearest.
template <class T>
void run_coded_case(std::size_t n) {
  const auto x = chunk_inputs<T>(n, n);

  for (double g : {0.0, 0.5, 0.9, 0.99}) {
    CAPTURE(n);
    CAPTURE(g);
    const dropit::MinK<> p{g};
    const auto kept = oracle_mink<T>(x, p.kept(n));
    std::vector<T> values;
    for (std::size_t i : kept)
      values.push_back(x[i]);
    dropit::SparseCache<T, dropit::MinK<>> exact{p};
    dropit::SparseCache<T, dropit::MinK<>, dropit::codec::int8> i8{p,
                                                                   {.stochastic = true, .seed = 3}};
    dropit::SparseCache<T, dropit::MinK<>, dropit::codec::fp8_e4m3> f8{p};
    const dropit::host_executor exec{.threads = 2, .adaptive = false};
    exact.pack(exec, std::span<const T>(x));
    i8.pack(exec, std::span<const T>(x));
    f8.pack(exec, std::span<const T>(x));
    dropit::SparseCache<T, dropit::MinK<>, dropit::codec::int8> nearest{p};
    nearest.pack(exec, std::span<const T>(x));
    std::vector<T> back(n);
    nearest.restore(exec, std::span<T>(back));
    CHECK(same_bits<T>(back, oracle_coded_dense<T>(x, kept, false)));
    const auto want_nearest = oracle_encode(values, false);
    CHECK(std::memcmp(nearest.payload().data(), want_nearest.codes.data(),
                      want_nearest.codes.size()) == 0);
    for (int which = 0; which < 2; ++which) {
      const auto& l = which == 0 ? i8.layout() : f8.layout();
      const auto bytes = which == 0 ? i8.payload() : f8.payload();
      const auto want = oracle_encode(values, which == 1, which == 0, 3);
      CHECK(std::memcmp(bytes.data() + l.values_offset, want.codes.data(), want.codes.size()) == 0);
      CHECK(std::memcmp(bytes.data() + l.scales_offset, want.scales.data(),
                        want.scales.size() * 4) == 0);
      const auto& el = exact.layout();
      CHECK(std::memcmp(bytes.data() + l.positions_offset,
                        exact.payload().data() + el.positions_offset,
                        el.total_bytes - el.positions_offset) == 0);
      for (std::size_t b = 0; b < bytes.size(); ++b) {  // the padding is zero
        const auto gaps = dropit::padding_of(l);
        for (int i = 0; i < dropit::padding_gaps::count; ++i)
          if (b >= gaps.begin[i] && b < gaps.end[i]) CHECK(bytes[b] == std::byte{0});
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE(
    "a coded host payload holds the oracle's codes and scales and the exact "
    "payload's positions",
    T, DROPIT_TEST_TYPES) {
  // Every instruction set: fp32 int8 has AVX2 and AVX-512 paths (detail/host/codec_simd.hpp).
  auto& cap = dropit::detail::host_isa_cap();
  const int saved_cap = cap.load();
  for (int isa = 0; isa <= 2; ++isa) {
    for (std::size_t n : {std::size_t{3000}, (std::size_t{1} << 18) + 5}) {
      cap.store(isa);
      CAPTURE(isa);
      run_coded_case<T>(n);
    }
  }
  cap.store(saved_cap);
}

#if DROPIT_HOST_X86
TEST_CASE("the AVX-512 e4m3 chunk paths give the portable bytes: every code, tie and boundary") {
  if (dd::detect_host_isa() < dd::host_isa::avx512) {
    MESSAGE("skipped: this CPU lacks AVX-512");
    return;
  }
  // Values y the code sees exactly (each chunk holds 448, so its scale is 1): every code's value,
  // every midpoint between neighbouring codes (the ties) and the floats next to them, both signs;
  // a sweep over the float bits up to 448; zeros, float subnormals, NaN and infinities.
  std::vector<float> y;
  auto both = [&](float f) {
    y.push_back(f);
    y.push_back(-f);
  };
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = dd::e4m3_decode(static_cast<std::uint8_t>(c));
    const float hi = dd::e4m3_decode(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact: one more significand bit than the codes have
    for (const float f :
         {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), std::nextafter(lo, 1e9f)})
      both(f);
  }
  for (std::uint32_t b = 0; b <= 0x43e00000u; b += 9973)
    both(dd::bits_to_float(b));
  for (const std::uint32_t b : {0x1u, 0x7fffffu, 0x800000u, 0x3c7fffffu, 0x3c800000u, 0x43e00000u})
    both(dd::bits_to_float(b));
  both(std::numeric_limits<float>::infinity());
  both(std::numeric_limits<float>::quiet_NaN());
  dd::codec_params p;
  p.kind = dropit::value_codec::fp8_e4m3;
  std::size_t chunks = 0;
  for (std::size_t at = 0; at < y.size(); at += 1000) {
    // 1001 values: up to 1000 of y, then 448; and the same chunk scaled by 3 (scale != 1).
    for (const float times : {1.0f, 3.0f}) {
      std::vector<float> v(y.begin() + static_cast<std::ptrdiff_t>(at),
                           y.begin() + static_cast<std::ptrdiff_t>(std::min(y.size(), at + 1000)));
      v.push_back(448.0f);
      for (float& f : v)
        f *= times;
      std::vector<std::uint8_t> want(v.size()), got(v.size());
      float want_scale = 0, got_scale = 0;
      dd::encode_chunk(v.data(), v.size(), 0, p, want.data(), &want_scale);
      got_scale = dd::encode_e4m3_avx512(v.data(), 0, v.size(), got.data());
      CHECK(got == want);
      CHECK(std::memcmp(&got_scale, &want_scale, 4) == 0);
      ++chunks;
    }
  }
  CHECK(chunks > 200);
  // Decoding: every code, at several scales.
  std::vector<std::uint8_t> codes(256);
  for (int c = 0; c < 256; ++c)
    codes[static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(c);
  for (const float s : {1.0f, 0.5f, 3.0e-3f, 1.7e20f, 0x1p-100f, 7.25f}) {
    std::vector<float> want(256), got(256);
    dd::decode_chunk(codes.data(), &s, 256, 0, dropit::value_codec::fp8_e4m3, want.data());
    dd::decode_e4m3_avx512(codes.data(), s, 0, 256, got.data());
    CHECK(same_bits<float>(got, want));
  }
}
#endif
