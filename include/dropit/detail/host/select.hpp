/**
 * @file select.hpp
 * @brief The host backend of the shared selection (detail/selection.hpp): each step of
 * `run_selection` runs on the worker pool, with the SIMD classify kernels for the count pass, and
 * the shared `select_state` decides between the steps as it does on the device.
 *
 * What the host's steps add to the shared description:
 * - sample: keys at deterministic, stratified positions (parallel; about 11 sqrt(n) of them,
 *   `host_sample_size`), the range from `guess_ranks`;
 * - count: per block of 1024 the keys above hi and in [lo, hi]; keys in the range are collected
 *   as candidates (key, offset in block) into the worker's part of a candidate buffer (with the
 *   index-list encoding, the keys above hi too) and counted into the worker's bucket histogram;
 *   the bitmask of keys above hi goes straight into the payload's bitmask; with the bitmask
 *   encoding and few keys at or above lo, the block's values of those keys are staged while the
 *   block is in cache, so that the compact step never reads x again;
 * - radix passes: per-worker histograms of one digit;
 * - resolve: the chosen bucket's candidate keys, selected by `select_state::resolve_bucket`;
 * - before the compact step (`finish`): (t, ties kept) becomes a tie cut index (`threshold`), and
 *   the kept count before every block its exclusive scan (the payload's block offsets).
 * The result depends only on x and the policy, never on the thread count or the sample.
 */
#pragma once

#include <dropit/detail/host/classify.hpp>
#include <dropit/detail/host/compress.hpp>
#include <dropit/detail/host/parallel.hpp>
#include <dropit/detail/selection.hpp>
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

/// Staging pays when x does not stay in the cache between the count and the compact pass: from
/// half the last-level cache on (measured on a 320 MiB L3: equal at 128 MiB of fp32, faster from
/// 256 MiB; docs/performance.md).
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
  staging_mode staging = staging_mode::automatic;  ///< automatic: from `stage_min_bytes` on
  std::size_t stage_capacity = 0;                  ///< staged values in all; 0: automatic
  std::size_t stage_min_bytes = 0;  ///< automatic staging from this size of x; 0: the cache's
};

/// What a selection did (for tests and benchmarks).
struct host_select_report {
  int path = path_none;       ///< select_path: how the threshold was found
  unsigned worked = 0;        ///< select_step bits: the steps that did work
  unsigned x_passes = 0;      ///< steps that read all of x
  std::size_t samples = 0;    ///< keys sampled
  std::size_t collected = 0;  ///< candidates (and, index list, keys above hi) collected
  bool overflow = false;      ///< a worker's candidate part was too small
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

/**
 * The host backend of `run_selection` for one pack (without its compact step, which the host
 * executor adds: host_executor.inl). The steps run in order on the calling thread, each forking
 * onto the worker pool; `finish` turns the state into what the compact step reads.
 */
template <class P, class T>
class host_selector {
 public:
  using key = key_type_t<P, T>;
  using key_type = key;

  /// `words`: the payload's bitmask (null for the index list), which receives the mask of keys
  /// above hi on the candidates path; `collect_above` (index list): the count pass collects those
  /// keys as entries too. `mr` supplies the count pass's stage (host_stage).
  host_selector(const P& policy, const T* x, std::size_t n, std::size_t k, unsigned threads,
                const host_select_tuning& tuning, std::pmr::memory_resource* mr,
                std::uint32_t* words, bool collect_above)
      : policy_(policy),
        x_(x),
        n_(n),
        k_(k),
        threads_(std::max(1u, threads)),
        blocks_((n + block_elements - 1) / block_elements),
        tuning_(tuning),
        mr_(mr),
        words_(words),
        collect_above_(collect_above),
        ctl_(n, k, ~std::size_t{0}) {
    ctl_.forced = tuning.force_fallback;
    sel_.above = host_buffer<std::uint32_t>(blocks_);
    sel_.within = host_buffer<std::uint32_t>(blocks_);
    sel_.block_start = host_buffer<std::size_t>(blocks_ + 1);
  }

  /// Step 1: the sampled keys, and the guessed range from two of their order statistics.
  void sample() {
    samples_ = std::min(n_, tuning_.sample != 0 ? tuning_.sample : host_sample_size(n_));
    rep_.samples = samples_;
    const guessed_ranks g = guess_ranks(n_, k_, samples_, tuning_.margin);
    margin_ = g.margin;
    sample_keys(samples_);
    key* const b = sample_.get();
    const auto ss = static_cast<long long>(samples_);
    key lo{0}, hi = static_cast<key>(~key{0});
    if (g.lo_rank < ss) {
      std::nth_element(b, b + g.lo_rank, b + ss, std::greater<key>());
      lo = b[g.lo_rank];
    }
    if (g.hi_rank >= 0) {
      const long long end = std::min(g.lo_rank, ss);
      if (g.hi_rank < end) std::nth_element(b, b + g.hi_rank, b + end, std::greater<key>());
      hi = b[g.hi_rank];
    }
    sample_.reset();
    ctl_.set_range(lo, hi, radix_bits);
  }

  /// Step 2: the count pass over x against the guessed range; decides the next step.
  void count() {
    lo_ = ctl_.lo;
    hi_ = ctl_.hi;
    const bool collect = ctl_.collecting();
    if (collect) {
      allocate_candidates(sel_.cand);
      if (words_ != nullptr) allocate_stage(sel_.stage);
    }
    const counts c = count_pass(collect ? words_ : nullptr, collect, collect_above_);
    rep_.collected = c.collected;
    rep_.overflow = c.overflow;
    within_total_ = c.within;
    bucket_pick pick;
    if (collect) {
      std::uint32_t* hist = sel_.cand.hist.get();
      for (unsigned p = 1; p < threads_; ++p) {
        for (std::size_t d = 0; d < candidate_buckets; ++d)
          hist[d] += hist[p * hist_stride + d];
      }
      pick =
          pick_bucket(hist, static_cast<unsigned>(candidate_buckets), ctl_.rank_below_hi(c.above));
    }
    ctl_.decide(c.above, c.within, !c.overflow, pick);
    bucket_count_ = pick.count;
    if (ctl_.mode == mode_fallback) sel_.stage = host_stage<T>{};
  }

  /// Step 3 (fallback only): one radix pass over x, histograms per worker.
  void radix_pass(int) {
    if (ctl_.mode != mode_fallback) return;
    // Per worker: the bins and one more that takes the keys not matching the digits so far.
    constexpr std::size_t max_bins = std::size_t{1} << radix_bits;
    constexpr std::size_t stride = max_bins + 1;
    auto hist = std::make_unique<std::size_t[]>(threads_ * stride);
    const word_classifier<P, T> cls(policy_, x_, n_, key{0}, key{0});
    const std::size_t total_words = (n_ + word_elements - 1) / word_elements;
    const radix_state<key> s = ctl_.state;
    parallel_for(threads_, total_words, [&](std::size_t w0, std::size_t w1, unsigned t) {
      std::size_t* h = hist.get() + t * stride;
      key keys[word_elements];
      for (std::size_t w = w0; w < w1; ++w) {
        const unsigned count = cls.keys(w, keys);
        for (unsigned j = 0; j < count; ++j)
          ++h[s.matches(keys[j]) ? s.digit(keys[j]) : max_bins];
      }
    });
    for (unsigned t = 1; t < threads_; ++t) {
      for (unsigned d = 0; d < s.bins(); ++d)
        hist[d] += hist[t * stride + d];
    }
    ctl_.advance_radix(hist.get());
  }

  /// Step 4 (resolve only): the chosen bucket's candidate keys; the threshold among them.
  void resolve() {
    if (ctl_.mode != mode_resolve) return;
    const host_candidates<key>& cand = sel_.cand;
    const std::size_t in_bucket = bucket_count_;
    auto scratch = host_buffer<key>(in_bucket);
    std::size_t m = 0;
    const int shift = cand.shift;
    const key lo = lo_, hi = hi_;
    const std::size_t d = ctl_.bucket;
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
    ctl_.resolve_bucket(scratch.get(), m);
    ties_total_ = 0;
    for (std::size_t i = 0; i < m; ++i)
      ties_total_ += scratch[i] == ctl_.t ? 1 : 0;
  }

  /**
   * After the steps: the tie cut and each block's offset, for the compact step. The fallback
   * counts the keys equal to t per block (one more pass over x); the other paths have their
   * per-block counts from the count pass.
   */
  [[nodiscard]] const host_selection<key, T>& finish() {
    switch (ctl_.path) {
      case path_candidates:
        finish_candidates();
        break;
      case path_single_key:
        resolve_ties(ctl_.t, ctl_.ties_kept, within_total_);
        break;
      default: {  // path_fallback
        lo_ = hi_ = ctl_.t;
        const counts c = count_pass(nullptr, false, false);
        ++ctl_.x_passes;
        resolve_ties(ctl_.t, ctl_.ties_kept, c.within);
        break;
      }
    }
    const bool staged = sel_.from_candidates && sel_.stage.values.get() != nullptr;
    rep_.staged_blocks = staged ? sel_.stage.blocks : 0;
    // The compact step reads x again unless every kept value is staged, or (index list, from
    // the candidates) the collected entries say where the kept values are.
    const bool reads_x = words_ != nullptr ? rep_.staged_blocks != blocks_ : !sel_.from_candidates;
    if (reads_x) ++ctl_.x_passes;
    ctl_.worked |= step_compact;
    rep_.path = ctl_.path;
    rep_.worked = ctl_.worked;
    rep_.x_passes = ctl_.x_passes;
    return sel_;
  }

  /// What the selection did (complete after `finish`).
  [[nodiscard]] const host_select_report& report() const noexcept { return rep_; }

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

  /**
   * The stage of the count pass, when it pays (`max_staged_fraction`) and its memory is there: a
   * stage that cannot be had only costs the second read of x, so it is not an error.
   */
  void allocate_stage(host_stage<T>& stage) {
    stage = host_stage<T>{};
    if (tuning_.staging == staging_mode::never) return;
    const double expected = static_cast<double>(k_) + expected_candidates();
    if (tuning_.staging == staging_mode::automatic) {
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

  /// Candidates expected in the guessed range.
  [[nodiscard]] double expected_candidates() const noexcept {
    return detail::expected_candidates(n_, samples_, guessed_ranks{0, 0, margin_});
  }

  void allocate_candidates(host_candidates<key>& cand) {
    std::size_t cap = tuning_.capacity;
    if (cap == 0) {
      cap = static_cast<std::size_t>(2 * expected_candidates()) + 4096 + (collect_above_ ? k_ : 0);
    }
    cand.part_cap = std::min(cap, n_);
    cand.keys = host_buffer<key>(cand.stride() * threads_);
    cand.offs = host_buffer<std::uint16_t>(cand.stride() * threads_);
    cand.at = host_buffer<std::size_t>(blocks_);
    cand.count = host_buffer<std::uint32_t>(blocks_);
    cand.hist = std::make_unique<std::uint32_t[]>(hist_stride * threads_);
    cand.shift = ctl_.shift;
  }

  /**
   * The count pass over x against [lo_, hi_]: per block the keys above hi (`sel_.above`) and in
   * the range (`sel_.within`); with `collect`, the entries into the candidate parts, and the mask
   * of keys above hi into `words` (when not null).
   */
  counts count_pass(std::uint32_t* words, bool collect, bool collect_above) {
    host_selection<key, T>& sel = sel_;
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
        if (collecting && cls.collects() && collect_above && used + block_elements <= cap) {
          // Every key >= lo is collected (the stage's case, about a tenth of x at gamma 0.9):
          // the vector kernel copies the entries as it classifies. The band between the guessed
          // bounds alone is sparse enough that reading its keys back by their mask bits (below)
          // costs less than the kernel's compress and stores on every word (MinK 0.9 packs of
          // 1e5 to 1.6e6 fp32 elements 6-20% faster, host_bench train/, 2026-11-26).
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

  /// The candidates path: the tie cut (among the candidates, in index order) and the kept count
  /// per block: keys above hi plus the kept candidates, whose bits join the bitmask.
  void finish_candidates() {
    host_selection<key, T>& sel = sel_;
    const host_candidates<key>& cand = sel.cand;
    const key t = ctl_.t;
    const std::size_t ties_kept = ctl_.ties_kept;
    sel.th.t = t;
    sel.th.cut = n_;
    if (ties_kept < ties_total_) {
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
    const threshold<key> th = sel.th;
    std::size_t* start = sel.block_start.get();
    const std::uint32_t* above = sel.above.get();
    std::uint32_t* const words = words_;
    const bool collect_above = collect_above_;
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
  void resolve_ties(key t, std::size_t ties_kept, std::size_t ties) {
    host_selection<key, T>& sel = sel_;
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

  /// Turns the per-block kept counts in block_start into their exclusive scan.
  void scan_block_start(host_selection<key, T>& sel) const noexcept {
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
  std::uint32_t* words_;
  bool collect_above_;
  select_state<key> ctl_;
  host_selection<key, T> sel_;
  host_select_report rep_;
  key hi_{};  ///< the range of the current count pass
  key lo_{};
  std::size_t samples_ = 0;
  std::size_t margin_ = 0;         ///< half-width of the guessed range in sample ranks
  std::size_t within_total_ = 0;   ///< keys in [lo, hi] (lo == hi: keys equal to t)
  std::size_t bucket_count_ = 0;   ///< candidates in the bucket of the k-th key
  std::size_t ties_total_ = 0;     ///< candidates equal to t (candidates path)
  std::unique_ptr<key[]> sample_;  ///< the sampled keys (partly ordered)
};

}  // namespace dropit::detail
