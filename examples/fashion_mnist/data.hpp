// Fashion-MNIST from gzip IDX files (Debian's dataset-fashion-mnist), read with zlib.
#pragma once

#include <torch/torch.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist {

/// Thrown when a data file is missing or unreadable; the message says how to install it.
struct missing_data : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Images [N, 1, 28, 28] normalised to mean 0, std 1 (float), labels [N] (int64).
struct split {
  torch::Tensor images;
  torch::Tensor labels;
};

inline std::vector<std::uint8_t> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw missing_data("cannot open " + path + ": " + std::strerror(errno) +
                       "\n  install the data set with: sudo apt-get install dataset-fashion-mnist"
                       "\n  (or point --data at a folder holding the four *-ubyte.gz files)");
  }
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  int got = 0;
  while ((got = gzread(f, buf, sizeof buf)) > 0)
    out.insert(out.end(), buf, buf + got);
  const bool failed = got < 0;
  gzclose(f);
  if (failed) throw missing_data("cannot decompress " + path + " (corrupt gzip file?)");
  return out;
}

inline std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  return std::uint32_t{b[at]} << 24 | std::uint32_t{b[at + 1]} << 16 |
         std::uint32_t{b[at + 2]} << 8 | std::uint32_t{b[at + 3]};
}

/// Reads `prefix`-images-idx3-ubyte.gz and `prefix`-labels-idx1-ubyte.gz from dir; at most `limit`
/// samples (0 = all).
inline split load(const std::string& dir, const std::string& prefix, std::int64_t limit) {
  const std::string ipath = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string lpath = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  const auto img = read_gz(ipath);
  const auto lab = read_gz(lpath);
  if (img.size() < 16 || be32(img, 0) != 0x803)
    throw missing_data(ipath + ": not an IDX image file");
  if (lab.size() < 8 || be32(lab, 0) != 0x801)
    throw missing_data(lpath + ": not an IDX label file");
  std::int64_t n = be32(img, 4);
  const std::int64_t rows = be32(img, 8), cols = be32(img, 12);
  if (static_cast<std::int64_t>(be32(lab, 4)) != n || rows != 28 || cols != 28 ||
      img.size() != static_cast<std::size_t>(16 + n * 784) ||
      lab.size() != static_cast<std::size_t>(8 + n)) {
    throw missing_data(ipath + ": unexpected sizes");
  }
  if (limit > 0 && limit < n) n = limit;
  torch::Tensor images =
      torch::from_blob(const_cast<std::uint8_t*>(img.data() + 16), {n, 1, 28, 28}, torch::kUInt8)
          .to(torch::kFloat)
          .div_(255.0)
          .sub_(0.2860)
          .div_(0.3530);
  torch::Tensor labels =
      torch::from_blob(const_cast<std::uint8_t*>(lab.data() + 8), {n}, torch::kUInt8)
          .to(torch::kLong);
  return {images, labels};
}

}  // namespace fmnist
