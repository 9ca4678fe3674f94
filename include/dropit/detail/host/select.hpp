/**
 * @file select.hpp
 * @brief The host's exact selection of the k largest keys (0 < k < n), ties lowest index first,
 * in about one pass over x, and the kept count before every block (the compact step's offsets).
 *
 * 1. guess: the keys of S sampled positions (deterministic: they depend on n only), and two of
 *    their order statistics, hi and lo, that bracket the k-th largest key with a margin of
 *    `margin` standard deviations of the sample rank (exact when S = n: lo == hi == the k-th key);
 * 2. count (the one full pass over x): per block of 1024, the keys above hi and the keys in
 *    [lo, hi]; keys in the range are collected as candidates (key, offset in block) into the
 *    worker's part of a candidate buffer (with the index-list encoding, the keys above hi too);
 *    the bitmask of keys above hi goes straight into the payload's bitmask; with the bitmask
 *    encoding and few keys at or above lo, the block's values of those keys are staged (copied
 *    out while the block is in cache), so that the compact step never reads x again;
 * 3. decide: if the range holds the k-th key, select it among the candidates (`candidates`); if
 *    the range is one key, the per-block counts give the tie cut (`ties`); otherwise, or when a
 *    worker's candidate part overflows, radix-select the exact key over x and count again
 *    (`fallback`);
 * 4. the kept count per block, and its exclusive scan.
 * The result depends only on x and the policy, never on the thread count or the sample.
 */
#pragma once

#include <dropit/detail/host/classify.hpp>
#include <dropit/detail/host/compress.hpp>
#include <dropit/detail/host/parallel.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <memory_resource>
#include <new>
#include <utility>

namespace dropit::detail {

/// Whether the count pass stages the values of keys at or above lo (bitmask encoding only).
enum class host_staging : std::uint8_t {
  automatic,  ///< when x is larger than `stage_min_bytes` and at most `max_staged_fraction` of it
              ///< is expected at or above lo
  never,      ///< the compact step reads x again
  always      ///< whenever the count pass collects candidates
};

/// Staging pays while the staged values are a small part of x: at gamma = 0.5, writing and
/// reading half of x moves as many bytes as reading x again (a count of bytes, not a measurement).
inline constexpr double max_staged_fraction = 0.3;

/// Staging pays when x does not stay in the cache between the count and the compact pass: from
/// half the last-level cache on (measured on a 320 MiB L3: equal at 128 MiB of fp32, faster from
/// 256 MiB; README, Performance).
[[nodiscard]] inline std::size_t host_stage_min_bytes() noexcept {
  return host_llc_bytes() / 2;
}

/// Knobs of the host selection; the defaults are what the executor uses. Tests turn them to
/// reach every way the selection resolves.
struct host_select_tuning {
  std::size_t sample = 0;       ///< sampled keys; 0: automatic (all of x up to 4096)
  double margin = 3.0;          ///< half-width of the guessed range, in standard deviations
  std::size_t capacity = 0;     ///< candidate slots per worker; 0: automatic
  bool force_fallback = false;  ///< ignore the guess: exact radix select over x
  host_staging staging = host_staging::automatic;
  std::size_t stage_capacity = 0;   ///< staged values in all; 0: automatic
  std::size_t stage_min_bytes = 0;  ///< automatic staging from this size of x; 0: the cache's
};

/// How a selection resolved the threshold.
enum class host_select_path : std::uint8_t {
  candidates,  ///< the guessed range held the k-th key: selected among the candidates
  ties,        ///< the guessed range was one key (lo == hi): tie cut from per-block counts
  fallback     ///< the guess missed, overflowed or was ignored: exact radix select over x
};

/// What a selection did (for tests and benchmarks).
struct host_select_report {
  host_select_path path = host_select_path::candidates;
  std::size_t samples = 0;    ///< keys sampled
  std::size_t collected = 0;  ///< candidates (and, index list, keys above hi) collected
  bool overflow = false;      ///< a worker's candidate part was too small
  int attempts = 0;           ///< count passes with a guessed range: 1, or 2 after a miss
  /// Blocks whose kept values the compact step took from the staged values (the others, and
  /// every block off the candidates path, are read from x again).
  std::size_t staged_blocks = 0;
};

/// Sampled keys for n elements: all of them up to 4096, then about 11 sqrt(n) (a power of two,
/// 2^10 to 2^18), which balances the sample's cost (a random read and a selection step per key)
/// against the candidates' (about 1.8 n / sqrt(S) of them at gamma = 0.9 and a 3-sd margin).
/// Tuned on 1e5 to 2^28 elements (bench/README.md).
[[nodiscard]] inline std::size_t host_sample_size(std::size_t n) noexcept {
  if (n <= 4096) return n;
  const double e = std::round(std::log2(static_cast<double>(n)) / 2.0 + 3.5);
  const int bits = std::clamp(static_cast<int>(e), 10, 18);
  return std::min(n, std::size_t{1} << bits);
}

/// Candidates of the count pass: per worker a part of `part_cap` slots (plus room for the vector
/// kernels' whole-vector stores past the end), per block its first slot and its count. Keys and
/// offsets (in the block) are separate arrays.
template <class Key>
struct host_candidates {
  static constexpr std::size_t slack = 64;  ///< slots after each part that vectors may write
  std::unique_ptr<Key[]> keys;
  std::unique_ptr<std::uint16_t[]> offs;
  std::size_t part_cap = 0;
  [[nodiscard]] std::size_t stride() const noexcept { return part_cap + slack; }
  std::unique_ptr<std::size_t[]> at;       ///< per block: its first slot
  std::unique_ptr<std::uint32_t[]> count;  ///< per block: its entries
  /// Per worker, then merged into the first: candidates (keys in [lo, hi]) per bucket
  /// `(key - lo) >> shift`, so that the selection looks at one bucket's keys only.
  std::unique_ptr<std::uint32_t[]> hist;
  int shift = 0;
};

/// Buckets of the candidate histogram.
inline constexpr std::size_t candidate_buckets = std::size_t{1} << radix_bits;
/// Per worker: the buckets and one more that counts the entries outside [lo, hi].
inline constexpr std::size_t hist_stride = candidate_buckets + 1;

/// Storage for `count` values of T from a memory resource (null when empty), freed on destruction.
template <class T>
class resource_array {
 public:
  resource_array() noexcept = default;
  /// @throw whatever the resource throws (std::bad_alloc when it is out of memory)
  resource_array(std::pmr::memory_resource* mr, std::size_t count)
      : mr_(mr),
        data_(static_cast<T*>(mr->allocate(count * sizeof(T), 64))),
        bytes_(count * sizeof(T)) {}
  resource_array(resource_array&& o) noexcept
      : mr_(o.mr_), data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  resource_array& operator=(resource_array&& o) noexcept {
    if (this != &o) {
      release();
      mr_ = o.mr_;
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  ~resource_array() { release(); }
  [[nodiscard]] T* get() const noexcept { return data_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) mr_->deallocate(data_, bytes_, 64);
    data_ = nullptr;
  }
  std::pmr::memory_resource* mr_ = nullptr;
  T* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Values staged by the count pass: per block, the values of its keys >= lo in index order, from
/// `at[b]` (`not_staged` when no slab had room). The values come from the executor's memory
/// resource, as the payload does: a caching resource serves both without fresh pages.
template <class T>
struct host_stage {
  static constexpr std::size_t not_staged = ~std::size_t{0};
  resource_array<T> values;  ///< empty: nothing is staged
  std::size_t capacity = 0;
  std::size_t slab = 0;  ///< a worker claims this many slots at a time
  std::unique_ptr<std::size_t[]> at;
  std::size_t blocks = 0;  ///< blocks staged
};

/// The result: the threshold, how to apply it, and each block's offset into the values.
template <class Key, class T>
struct host_selection {
  threshold<Key> th;
  host_select_path path = host_select_path::candidates;
  /// candidates path: the kept set is the bitmask words of keys above hi plus the kept
  /// candidates (bitmask encoding), or the kept collected entries (index list); else every
  /// element is classified against `th` again.
  bool from_candidates = false;
  Key hi{};
  std::unique_ptr<std::uint32_t[]> above;      ///< per block: keys above hi
  std::unique_ptr<std::uint32_t[]> within;     ///< per block: keys in [lo, hi]
  std::unique_ptr<std::size_t[]> block_start;  ///< kept before block b; [blocks] == k
  host_candidates<Key> cand;
  host_stage<T> stage;  ///< used on the candidates path only

  /// Whether the compact step takes block b's values from the stage.
  [[nodiscard]] bool staged(std::size_t b) const noexcept {
    return from_candidates && stage.values.get() != nullptr &&
           stage.at[b] != host_stage<T>::not_staged;
  }
};

/// Uninitialised storage (no value-initialisation pass over large temporaries).
template <class U>
[[nodiscard]] std::unique_ptr<U[]> host_buffer(std::size_t count) {
  return std::unique_ptr<U[]>(new U[count == 0 ? 1 : count]);
}

/// The kept count and the tie rule of one pack, with the count pass's per-block outputs.
template <class P, class T>
class host_selector {
 public:
  using key = key_type_t<P, T>;

  /// `mr` supplies the count pass's stage (host_stage).
  host_selector(const P& policy, const T* x, std::size_t n, std::size_t k, unsigned threads,
                const host_select_tuning& tuning, std::pmr::memory_resource* mr)
      : policy_(policy),
        x_(x),
        n_(n),
        k_(k),
        threads_(std::max(1u, threads)),
        blocks_((n + block_elements - 1) / block_elements),
        tuning_(tuning),
        mr_(mr) {}

  /**
   * Runs the selection. `words` (the payload's bitmask, or null for the index list) receives the
   * mask of keys above hi on the candidates path; `collect_above` (index list) collects those
   * keys as entries too.
   */
  host_selection<key, T> run(std::uint32_t* words, bool collect_above, host_select_report* report) {
    host_selection<key, T> sel;
    sel.above = host_buffer<std::uint32_t>(blocks_);
    sel.within = host_buffer<std::uint32_t>(blocks_);
    sel.block_start = host_buffer<std::size_t>(blocks_ + 1);
    host_select_report rep;

    if (!tuning_.force_fallback) {
      const std::size_t samples =
          std::min(n_, tuning_.sample != 0 ? tuning_.sample : host_sample_size(n_));
      rep.samples = samples;
      sample_keys(samples);
      // A guess that misses is retried once with a range three times as wide (one more count
      // pass) before the exact select over x (several passes).
      bool done = false;
      for (int attempt = 0; attempt < 2 && !done; ++attempt) {
        rep.attempts = attempt + 1;
        pick_range(samples, tuning_.margin * (attempt == 0 ? 1.0 : 3.0));
        const bool collect = lo_ != hi_;
        if (collect) {
          allocate_candidates(sel.cand, samples, collect_above);
          if (words != nullptr) allocate_stage(sel.stage, samples);
        }
        const counts c = count(sel, collect ? words : nullptr, collect, collect_above);
        rep.collected = c.collected;
        rep.overflow = c.overflow;
        if (c.above < k_ && k_ <= c.above + c.within) {
          if (!collect) {
            rep.path = host_select_path::ties;
            resolve_ties(sel, lo_, k_ - c.above, c.within);
            done = true;
          } else if (!c.overflow) {
            rep.path = host_select_path::candidates;
            resolve_candidates(sel, words, collect_above, k_ - c.above);
            rep.staged_blocks = sel.stage.values.get() != nullptr ? sel.stage.blocks : 0;
            done = true;
          } else {
            break;  // the range holds too many keys (heavy ties): a wider one holds more
          }
        }
        if (samples == n_) break;  // the exact range: a wider one is the same
      }
      sample_.reset();
      if (!done) {
        sel.stage = host_stage<T>{};
        fallback(sel, rep);
      }
    } else {
      fallback(sel, rep);
    }
    sel.path = rep.path;
    if (report != nullptr) *report = rep;
    return sel;
  }

 private:
  struct counts {
    std::size_t above = 0;
    std::size_t within = 0;
    std::size_t collected = 0;
    bool overflow = false;
  };

  /// Keys of a sample at deterministic, stratified positions: sample j lies in
  /// [j n / S, (j + 1) n / S), at an offset from a Weyl sequence (so that a period in x does not
  /// line up with the strata), computed without divisions.
  void sample_keys(std::size_t samples) {
    sample_ = host_buffer<key>(samples);
    key* const s = sample_.get();
    const std::size_t n = n_;
    const bool all = samples == n;
    const std::size_t q = n / samples, r = n % samples;
    // Random reads, a few nanoseconds each: worth the workers from a few thousand on.
    parallel_for(
        samples >= 4096 ? threads_ : 1u, samples, [&](std::size_t j0, std::size_t j1, unsigned) {
          if (all) {
            for (std::size_t j = j0; j < j1; ++j)
              s[j] = policy_.key(x_[j], j);
            return;
          }
          // Stratum j starts at j q + floor(j r / S).
          std::size_t begin = j0 * q + j0 * r / samples;
          std::size_t acc = j0 * r % samples;
          auto weyl = static_cast<std::uint32_t>(j0 * 0x9e3779b9u);
          for (std::size_t j = j0; j < j1; ++j) {
            acc += r;
            const std::size_t width = q + (acc >= samples ? 1 : 0);
            if (acc >= samples) acc -= samples;
            const std::size_t i =
                begin + static_cast<std::size_t>((static_cast<std::uint64_t>(weyl) * width) >> 32);
            s[j] = policy_.key(x_[i], i);
            begin += width;
            weyl += 0x9e3779b9u;
          }
        });
  }

  /// Reads hi and lo off the sample: the order statistics `margin` standard deviations of the
  /// sample rank either side of the k-th key's expected rank (both the k-th key for S = n).
  void pick_range(std::size_t samples, double margin_sd) {
    long long hi_rank = 0, lo_rank = 0;
    if (samples == n_) {
      hi_rank = lo_rank = static_cast<long long>(k_) - 1;
    } else {
      const double sd = static_cast<double>(samples);
      const double q = static_cast<double>(k_) / static_cast<double>(n_);
      const auto margin =
          static_cast<long long>(std::ceil(margin_sd * std::sqrt(sd * q * (1 - q)))) + 1;
      const auto rank = static_cast<long long>(std::ceil(q * sd)) - 1;
      hi_rank = rank - margin;
      lo_rank = rank + margin;
      margin_ = static_cast<std::size_t>(margin);
    }
    key* const b = sample_.get();
    const auto ss = static_cast<long long>(samples);
    if (lo_rank < ss) {
      std::nth_element(b, b + lo_rank, b + ss, std::greater<key>());
      lo_ = b[lo_rank];
    } else {
      lo_ = key{0};
    }
    if (hi_rank >= 0) {
      const long long end = std::min(lo_rank, ss);
      if (hi_rank < end) std::nth_element(b, b + hi_rank, b + end, std::greater<key>());
      hi_ = b[hi_rank];
    } else {
      hi_ = static_cast<key>(~key{0});
    }
  }

  /**
   * The stage of the count pass, when it pays (`max_staged_fraction`) and its memory is there: a
   * stage that cannot be had only costs the second read of x, so it is not an error.
   */
  void allocate_stage(host_stage<T>& stage, std::size_t samples) {
    stage = host_stage<T>{};
    if (tuning_.staging == host_staging::never) return;
    const double expected = static_cast<double>(k_) + static_cast<double>(n_) *
                                                          static_cast<double>(2 * margin_ + 1) /
                                                          static_cast<double>(samples);
    if (tuning_.staging == host_staging::automatic) {
      const std::size_t min_bytes =
          tuning_.stage_min_bytes != 0 ? tuning_.stage_min_bytes : host_stage_min_bytes();
      if (n_ * sizeof(T) < min_bytes || expected > max_staged_fraction * static_cast<double>(n_))
        return;
    }
    // Slabs of several blocks' worth: a worker claims one with an atomic add, so the stage follows
    // where the large keys are, not where the blocks are.
    stage.slab = std::clamp<std::size_t>(static_cast<std::size_t>(expected) / (16 * threads_),
                                         4 * block_elements, 64 * block_elements);
    stage.capacity = tuning_.stage_capacity != 0
                         ? std::max(tuning_.stage_capacity, stage.slab)
                         : static_cast<std::size_t>(1.1 * expected) + 2 * threads_ * stage.slab;
    try {
      stage.values = resource_array<T>(mr_, stage.capacity);
      stage.at = host_buffer<std::size_t>(blocks_);
    } catch (const std::bad_alloc&) {
      stage = host_stage<T>{};
    }
  }

  void allocate_candidates(host_candidates<key>& cand, std::size_t samples, bool collect_above) {
    std::size_t cap = tuning_.capacity;
    if (cap == 0) {
      const double expected = static_cast<double>(n_) * static_cast<double>(2 * margin_ + 1) /
                              static_cast<double>(samples);
      cap = static_cast<std::size_t>(2 * expected) + 4096 + (collect_above ? k_ : 0);
    }
    cand.part_cap = std::min(cap, n_);
    cand.keys = host_buffer<key>(cand.stride() * threads_);
    cand.offs = host_buffer<std::uint16_t>(cand.stride() * threads_);
    cand.at = host_buffer<std::size_t>(blocks_);
    cand.count = host_buffer<std::uint32_t>(blocks_);
    cand.hist = std::make_unique<std::uint32_t[]>(hist_stride * threads_);
    const auto range_bits = static_cast<int>(
        std::bit_width(static_cast<std::uint64_t>(hi_) - static_cast<std::uint64_t>(lo_)));
    cand.shift = range_bits > radix_bits ? range_bits - radix_bits : 0;
  }

  /**
   * The count pass over x against [lo_, hi_]: per block the keys above hi (`sel.above`) and in
   * the range (`sel.within`); with `collect`, the entries into the candidate parts, and the mask of
   * keys above hi into `words` (when not null).
   */
  counts count(host_selection<key, T>& sel, std::uint32_t* words, bool collect,
               bool collect_above) {
    // Per worker: its counts, how much of its candidate part it has used, and its stage slab. A
    // worker may run several chunks of blocks; its entries stay in index order within each chunk.
    struct alignas(64) part {
      counts c;
      std::size_t used = 0;
      bool full = false;
      std::size_t slab_at = 0;
      std::size_t slab_end = 0;
      bool stage_full = false;  ///< no slab was left: the worker's later blocks are not staged
    };
    auto parts = std::make_unique<part[]>(threads_);
    const word_classifier<P, T> cls(policy_, x_, n_, hi_, lo_);
    host_candidates<key>& cand = sel.cand;
    std::uint32_t* above = sel.above.get();
    std::uint32_t* within = sel.within.get();
    host_stage<T>& stage = sel.stage;
    const bool staging = collect && stage.values.get() != nullptr;
    std::atomic<std::size_t> claimed{0};
    std::atomic<std::size_t> staged_blocks{0};
    const host_isa isa = active_host_isa();
    const std::size_t total_words = (n_ + word_elements - 1) / word_elements;
    constexpr std::size_t words_per_block = block_elements / word_elements;
    const key lo = lo_, hi = hi_;
    parallel_for(threads_, blocks_, [&](std::size_t b0, std::size_t b1, unsigned t) {
      part& me = parts[t];
      counts c = me.c;
      std::size_t staged_here = 0;
      bool collecting = collect && !me.full;
      key* ck = collect ? cand.keys.get() + t * cand.stride() : nullptr;
      std::uint16_t* co = collect ? cand.offs.get() + t * cand.stride() : nullptr;
      std::uint32_t* h = collect ? cand.hist.get() + t * hist_stride : nullptr;
      const int shift = cand.shift;
      std::size_t used = me.used;
      const std::size_t cap = cand.part_cap;
      for (std::size_t b = b0; b < b1; ++b) {
        const std::size_t first = used;
        const std::size_t w0 = b * words_per_block;
        const std::size_t w1 = std::min(total_words, w0 + words_per_block);
        std::uint32_t gt_local[words_per_block], ge[words_per_block];
        std::uint32_t* gt = words != nullptr ? words + w0 : gt_local;
        block_counts bc;
        if (collecting && cls.collects() && used + block_elements <= cap) {
          // The vector kernel copies the entries as it classifies.
          typename word_classifier<P, T>::entry_sink sink{ck, co, used, b * block_elements,
                                                          collect_above};
          bc = cls.classify(w0, w1, gt, ge, &sink);
          used = sink.used;
        } else {
          bc = cls.classify(w0, w1, gt, ge);
          for (std::size_t w = w0; collecting && w < w1; ++w) {
            std::uint32_t take = collect_above ? ge[w - w0] : ge[w - w0] & ~gt[w - w0];
            if (take == 0) continue;
            if (used + static_cast<std::size_t>(popcount32(take)) > cap) {
              collecting = false;
              c.overflow = true;
              break;
            }
            const std::size_t base = w * word_elements;
            const auto off = static_cast<std::uint16_t>(base - b * block_elements);
            for (; take != 0; take &= take - 1) {
              const auto j = static_cast<unsigned>(std::countr_zero(take));
              ck[used] = cls.key(base + j);
              co[used] = static_cast<std::uint16_t>(off + j);
              ++used;
            }
          }
        }
        // The histogram of the block's candidates (entries above hi go to the extra bucket).
        for (std::size_t e = first; e < used; ++e) {
          const key kv = ck[e];
          const bool in = !collect_above || kv <= hi;
          ++h[in ? static_cast<std::size_t>(kv - lo) >> shift : candidate_buckets];
        }
        above[b] = static_cast<std::uint32_t>(bc.above);
        within[b] = static_cast<std::uint32_t>(bc.within);
        if (staging) {
          // The values of keys >= lo, from the block still in cache, into the worker's slab.
          const std::size_t s = bc.above + bc.within;
          if (me.slab_end - me.slab_at < s && !me.stage_full) {
            const std::size_t from = claimed.fetch_add(stage.slab, std::memory_order_relaxed);
            me.slab_at = me.slab_end = 0;
            if (from < stage.capacity && stage.capacity - from >= stage.slab) {
              me.slab_at = from;
              me.slab_end = from + stage.slab;
            } else {
              me.stage_full = true;
            }
          }
          if (me.slab_end - me.slab_at >= s) {
            T* const v = stage.values.get();
            (void)compact_words(x_, n_, ge, w0, w1, v + me.slab_at, v + me.slab_end, isa);
            stage.at[b] = me.slab_at;
            me.slab_at += s;
            ++staged_here;
          } else {
            stage.at[b] = host_stage<T>::not_staged;
          }
        }
        if (collect) {
          cand.at[b] = t * cand.stride() + first;
          cand.count[b] = static_cast<std::uint32_t>(used - first);
        }
        c.above += bc.above;
        c.within += bc.within;
      }
      c.collected = used;
      me.c = c;
      me.used = used;
      me.full = collect && !collecting;
      if (staged_here != 0) staged_blocks.fetch_add(staged_here, std::memory_order_relaxed);
    });
    stage.blocks = staged_blocks.load(std::memory_order_relaxed);
    counts total;
    for (unsigned t = 0; t < threads_; ++t) {
      total.above += parts[t].c.above;
      total.within += parts[t].c.within;
      total.collected += parts[t].c.collected;
      total.overflow = total.overflow || parts[t].c.overflow;
    }
    return total;
  }

  /// The candidates path: the r-th largest candidate key, the tie cut, the per-block counts.
  void resolve_candidates(host_selection<key, T>& sel, std::uint32_t* words, bool collect_above,
                          std::size_t r) {
    const host_candidates<key>& cand = sel.cand;
    // The bucket that holds the r-th largest candidate key.
    std::uint32_t* hist = cand.hist.get();
    for (unsigned p = 1; p < threads_; ++p) {
      for (std::size_t d = 0; d < candidate_buckets; ++d)
        hist[d] += hist[p * hist_stride + d];
    }
    std::size_t d = candidate_buckets - 1, higher = 0;
    while (d > 0 && higher + hist[d] < r)
      higher += hist[d--];
    const std::size_t in_bucket = hist[d];
    const std::size_t rank = r - higher;  // in the bucket, 1-based, from the top
    // Its keys, then the exact order statistic among them.
    auto scratch = host_buffer<key>(in_bucket);
    {
      std::size_t m = 0;
      const int shift = cand.shift;
      const key lo = lo_, hi = hi_;
      std::size_t b = 0;
      while (b < blocks_) {
        // Runs of blocks whose entries are contiguous (one worker's part).
        std::size_t e = b + 1;
        while (e < blocks_ && cand.at[e] == cand.at[e - 1] + cand.count[e - 1])
          ++e;
        const std::size_t first = cand.at[b];
        const std::size_t last = cand.at[e - 1] + cand.count[e - 1];
        for (std::size_t s = first; s < last && m < in_bucket; ++s) {
          const key kv = cand.keys[s];
          if (kv >= lo && kv <= hi && (static_cast<std::size_t>(kv - lo) >> shift) == d)
            scratch[m++] = kv;
        }
        b = e;
      }
    }
    key* const a = scratch.get();
    std::nth_element(a, a + (rank - 1), a + in_bucket, std::greater<key>());
    const key t = a[rank - 1];
    std::size_t greater_count = higher;
    for (std::size_t i = 0; i + 1 < rank; ++i)
      greater_count += a[i] > t ? 1 : 0;
    const std::size_t ties_kept = r - greater_count;
    std::size_t ties = ties_kept;
    for (std::size_t i = rank; i < in_bucket; ++i)
      ties += a[i] == t ? 1 : 0;
    scratch.reset();

    sel.th.t = t;
    sel.th.cut = n_;
    if (ties_kept < ties) {
      // The cut: one past the ties_kept-th candidate equal to t, in index order.
      std::size_t seen = 0;
      for (std::size_t b = 0; b < blocks_ && sel.th.cut == n_; ++b) {
        const std::size_t first = cand.at[b];
        for (std::size_t s = first; s < first + cand.count[b]; ++s) {
          if (cand.keys[s] == t && ++seen == ties_kept) {
            sel.th.cut = b * block_elements + cand.offs[s] + 1;
            break;
          }
        }
      }
    }
    sel.from_candidates = true;
    sel.hi = hi_;

    // Kept per block: keys above hi (bitmask; the index list holds them as entries) plus the
    // kept entries, whose bits join the bitmask.
    const threshold<key> th = sel.th;
    std::size_t* start = sel.block_start.get();
    const std::uint32_t* above = sel.above.get();
    parallel_for(threads_, blocks_, [&](std::size_t b0, std::size_t b1, unsigned) {
      for (std::size_t b = b0; b < b1; ++b) {
        std::size_t kept = collect_above ? 0 : above[b];
        const std::size_t first = cand.at[b];
        const std::size_t base = b * block_elements;
        for (std::size_t s = first; s < first + cand.count[b]; ++s) {
          const std::size_t i = base + cand.offs[s];
          if (th.keeps(cand.keys[s], i)) {
            ++kept;
            if (words != nullptr)
              words[i / word_elements] |= std::uint32_t{1} << (i % word_elements);
          }
        }
        start[b] = kept;
      }
    });
    scan_block_start(sel);
  }

  /// lo == hi == t holds the k-th key: `ties_kept` of the `ties` keys equal to t are kept.
  void resolve_ties(host_selection<key, T>& sel, key t, std::size_t ties_kept, std::size_t ties) {
    sel.th.t = t;
    sel.th.cut = n_;
    sel.from_candidates = false;
    std::size_t* start = sel.block_start.get();
    const std::uint32_t* above = sel.above.get();
    const std::uint32_t* within = sel.within.get();
    if (ties_kept == ties) {
      for (std::size_t b = 0; b < blocks_; ++b)
        start[b] = above[b] + within[b];
    } else {
      std::size_t seen = 0, b = 0;
      while (seen + within[b] < ties_kept) {
        start[b] = above[b] + within[b];
        seen += within[b++];
      }
      // Block b holds the last kept tie.
      const std::size_t cut_block = b;
      const std::size_t in_block = ties_kept - seen;
      std::size_t i = cut_block * block_elements;
      for (std::size_t found = 0; found < in_block; ++i)
        found += policy_.key(x_[i], i) == t ? 1 : 0;
      sel.th.cut = i;
      start[cut_block] = above[cut_block] + in_block;
      for (b = cut_block + 1; b < blocks_; ++b)
        start[b] = above[b];
    }
    scan_block_start(sel);
  }

  /// Exact radix select over x, then a second count pass with lo == hi == the k-th key.
  void fallback(host_selection<key, T>& sel, host_select_report& rep) {
    rep.path = host_select_path::fallback;
    // Per worker: the bins and one more that takes the keys not matching the digits so far.
    constexpr std::size_t max_bins = std::size_t{1} << radix_bits;
    constexpr std::size_t stride = max_bins + 1;
    radix_state<key> state(k_);
    auto hist = host_buffer<std::size_t>(threads_ * stride);
    const word_classifier<P, T> cls(policy_, x_, n_, key{0}, key{0});
    const std::size_t total_words = (n_ + word_elements - 1) / word_elements;
    while (!state.done()) {
      const unsigned bins = state.bins();
      std::fill(hist.get(), hist.get() + threads_ * stride, std::size_t{0});
      parallel_for(threads_, total_words, [&](std::size_t w0, std::size_t w1, unsigned t) {
        std::size_t* h = hist.get() + t * stride;
        const radix_state<key> s = state;
        key keys[word_elements];
        for (std::size_t w = w0; w < w1; ++w) {
          const unsigned count = cls.keys(w, keys);
          for (unsigned j = 0; j < count; ++j)
            ++h[s.matches(keys[j]) ? s.digit(keys[j]) : max_bins];
        }
      });
      for (unsigned t = 1; t < threads_; ++t) {
        for (unsigned d = 0; d < bins; ++d)
          hist[d] += hist[t * stride + d];
      }
      state.advance(hist.get());
    }
    hist.reset();
    lo_ = hi_ = state.prefix;
    const counts c = count(sel, nullptr, false, false);
    resolve_ties(sel, state.prefix, state.rank, c.within);
  }

  /// Turns the per-block kept counts in block_start into their exclusive scan.
  void scan_block_start(host_selection<key, T>& sel) const {
    std::size_t total = 0;
    for (std::size_t b = 0; b < blocks_; ++b) {
      const std::size_t kept = sel.block_start[b];
      sel.block_start[b] = total;
      total += kept;
    }
    sel.block_start[blocks_] = total;
  }

  P policy_;
  const T* x_;
  std::size_t n_;
  std::size_t k_;
  unsigned threads_;
  std::size_t blocks_;
  host_select_tuning tuning_;
  std::pmr::memory_resource* mr_;
  key hi_{};
  key lo_{};
  std::size_t margin_ = 0;
  std::unique_ptr<key[]> sample_;  ///< the sampled keys (partly ordered)
};

}  // namespace dropit::detail
