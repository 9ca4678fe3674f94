/**
 * @file json.hpp
 * @brief A small strict JSON reader (RFC 8259: no comments, no trailing commas, no NaN, no
 * duplicate keys) that remembers where each value starts, the graph loader on top of it, and the
 * plan writer. Errors inside a value name its path (`vertices[3].cost`) after line and column.
 */
#pragma once

#include <dropit/error.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dropit::checkpoint::detail::json {

enum class kind : std::uint8_t { null, boolean, number, string, array, object };

/// A parsed JSON value and the line and column (1-based, in bytes) where it starts.
struct value {
  kind type = kind::null;
  bool boolean = false;
  std::string text;               ///< number: the literal as written; string: the decoded UTF-8
  std::vector<value> items;       ///< array: the elements; object: the member values
  std::vector<std::string> keys;  ///< object: the member keys, keys[i] naming items[i]
  std::size_t line = 0, column = 0;

  [[nodiscard]] const value* find(std::string_view key) const noexcept {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
};

[[nodiscard]] inline const char* kind_name(kind k) noexcept {
  switch (k) {
    case kind::null:
      return "null";
    case kind::boolean:
      return "a boolean";
    case kind::number:
      return "a number";
    case kind::string:
      return "a string";
    case kind::array:
      return "an array";
    case kind::object:
      return "an object";
  }
  return "?";
}

/// Throws "dropit: origin:line:column: message".
template <class... Args>
[[noreturn]] void fail_at(std::string_view origin, std::size_t line, std::size_t column,
                          Args&&... args) {
  dropit::detail::throw_error(origin, ':', line, ':', column, ": ", std::forward<Args>(args)...);
}

class reader {
 public:
  reader(std::string_view text, std::string_view origin) : s_(text), origin_(origin) {}

  /// The whole document: one value, surrounded by whitespace only.
  [[nodiscard]] value document() {
    skip_space();
    value v = parse(0);
    skip_space();
    if (i_ < s_.size()) fail("unexpected ", describe(), " after the JSON value");
    return v;
  }

 private:
  static constexpr std::size_t max_depth = 512;

  template <class... Args>
  [[noreturn]] void fail(Args&&... args) const {
    fail_at(origin_, line_, column(), std::forward<Args>(args)...);
  }
  /// As fail, for a malformed value: the message also names the value's path, if it has one.
  template <class... Args>
  [[noreturn]] void fail_value(Args&&... args) const {
    if (path_.empty()) fail(std::forward<Args>(args)...);
    fail(path_, ": ", std::forward<Args>(args)...);
  }
  [[nodiscard]] std::size_t column() const noexcept { return i_ - line_start_ + 1; }
  [[nodiscard]] std::string describe() const {
    if (i_ >= s_.size()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c >= 0x20 && c < 0x7f) return dropit::detail::concat("character '", s_[i_], "'");
    return dropit::detail::concat("byte 0x", "0123456789abcdef"[c >> 4],
                                  "0123456789abcdef"[c & 15]);
  }
  void skip_space() noexcept {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\n') {
        ++i_;
        ++line_;
        line_start_ = i_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else {
        break;
      }
    }
  }
  void expect(char c, const char* what) {
    if (i_ >= s_.size() || s_[i_] != c) fail("expected ", what, ", got ", describe());
    ++i_;
  }

  value parse(std::size_t depth) {
    if (depth > max_depth) fail("values nested deeper than ", max_depth);
    value v;
    v.line = line_;
    v.column = column();
    if (i_ >= s_.size()) fail_value("expected a value, got end of input");
    const char c = s_[i_];
    if (c == '{') {
      v.type = kind::object;
      ++i_;
      skip_space();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      std::unordered_set<std::string> seen;  // a linear check per key is quadratic in the keys
      for (;;) {
        skip_space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string key, got ", describe());
        const std::size_t kline = line_, kcol = column();
        std::string key = string_body();
        if (!seen.insert(key).second) fail_at(origin_, kline, kcol, "duplicate key \"", key, '"');
        skip_space();
        expect(':', "':' after the key");
        skip_space();
        const std::size_t mark = path_.size();
        if (!path_.empty()) path_ += '.';
        path_ += key;
        value item = parse(depth + 1);
        path_.resize(mark);
        v.keys.push_back(std::move(key));
        v.items.push_back(std::move(item));
        skip_space();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect('}', "',' or '}' in the object");
        return v;
      }
    }
    if (c == '[') {
      v.type = kind::array;
      ++i_;
      skip_space();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      for (;;) {
        skip_space();
        const std::size_t mark = path_.size();
        path_ += dropit::detail::concat('[', v.items.size(), ']');
        v.items.push_back(parse(depth + 1));
        path_.resize(mark);
        skip_space();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect(']', "',' or ']' in the array");
        return v;
      }
    }
    if (c == '"') {
      v.type = kind::string;
      v.text = string_body();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = kind::number;
      v.text = number();
      return v;
    }
    for (auto [word, k, b] :
         {std::tuple{"true", kind::boolean, true}, std::tuple{"false", kind::boolean, false},
          std::tuple{"null", kind::null, false}}) {
      const std::string_view w(word);
      if (s_.substr(i_, w.size()) == w) {
        i_ += w.size();
        v.type = k;
        v.boolean = b;
        return v;
      }
    }
    not_a_number_literal();
    fail_value("expected a value, got ", describe());
  }

  /// Rejects what some writers emit for non-finite floats (Python's json: NaN, Infinity).
  void not_a_number_literal() const {
    for (std::string_view w : {"NaN", "Infinity", "-Infinity", "nan", "-nan", "inf", "-inf"}) {
      if (s_.substr(i_, w.size()) == w)
        fail_value("expected a finite number, got ", w, " (not a JSON number)");
    }
  }

  std::string number() {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9')
        ++i_;
      return i_ - from;
    };
    if (s_[i_] == '-') {
      not_a_number_literal();
      ++i_;
    }
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
      if (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9')
        fail_value("leading zeros are not allowed");
    } else if (digits() == 0) {
      fail_value("expected a digit, got ", describe());
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (digits() == 0) fail_value("expected a digit after '.', got ", describe());
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) fail_value("expected a digit in the exponent, got ", describe());
    }
    return std::string(s_.substr(start, i_ - start));
  }

  unsigned hex4() {
    unsigned u = 0;
    for (int k = 0; k < 4; ++k, ++i_) {
      if (i_ >= s_.size()) fail("unterminated \\u escape");
      const char c = s_[i_];
      u <<= 4;
      if (c >= '0' && c <= '9')
        u |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        u |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        u |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("expected a hex digit in the \\u escape, got ", describe());
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  /// A string starting at the opening quote; returns the decoded text.
  std::string string_body() {
    ++i_;  // '"'
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_];
      if (c == '"') {
        ++i_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string (escape it)");
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      const std::size_t escape_column = column();
      ++i_;
      if (i_ >= s_.size()) fail("unterminated string");
      const char e = s_[i_];
      auto fail_escape = [&](const char* what) { fail_at(origin_, line_, escape_column, what); };
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          ++i_;
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_escape("unpaired low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(i_, 2) != "\\u")
              fail_escape("high surrogate not followed by a \\u escape");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF)
              fail_escape("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          continue;
        }
        default:
          fail_at(origin_, line_, escape_column, "invalid escape '\\", e, "' in a string");
      }
      ++i_;
    }
  }

  std::string_view s_;
  std::string_view origin_;
  std::size_t i_ = 0, line_ = 1, line_start_ = 0;
  std::string path_;  // of the value being read: `vertices[3].cost`; empty at the top
};

/// For a valid JSON number literal that a double cannot hold (from_chars' result_out_of_range):
/// whether its magnitude is below 1 (an underflow such as 1e-400) rather than above DBL_MAX.
[[nodiscard]] inline bool underflows(std::string_view t) noexcept {
  if (t.starts_with('-')) t.remove_prefix(1);
  const std::size_t whole = std::min(t.find_first_not_of("0123456789"), t.size());
  const std::size_t e = std::min(t.find_first_of("eE"), t.size());
  // The decimal exponent of the first significant digit, as written before the exponent part
  // (JSON allows no leading zeros, so a zero integer part is "0").
  long long leading = static_cast<long long>(whole) - 1;
  if (t.substr(0, whole) == "0" && whole < e) {  // "0.000ddd": count the zeros after the point
    const std::size_t first = std::min(t.find_first_not_of('0', whole + 1), e);
    leading = -static_cast<long long>(first - whole);
  }
  long long exponent = 0;  // saturated: a literal this far out of range is decided by its sign
  std::size_t i = e + 1;
  const bool negative = i < t.size() && t[i] == '-';
  if (i < t.size() && (t[i] == '-' || t[i] == '+')) ++i;
  for (; i < t.size(); ++i)
    exponent = std::min<long long>(exponent * 10 + (t[i] - '0'), 1LL << 40);
  return leading + (negative ? -exponent : exponent) < 0;
}

/// Reads the value at `path` in a graph document and reports problems with both.
class graph_loader {
 public:
  explicit graph_loader(std::string_view origin) : origin_(origin) {}

  template <class... Args>
  [[noreturn]] void fail(const value& v, const std::string& path, Args&&... args) const {
    fail_at(origin_, v.line, v.column, path, ": ", std::forward<Args>(args)...);
  }

  const value& member(const value& obj, const std::string& path, std::string_view key) const {
    const value* v = obj.find(key);
    if (v == nullptr) fail(obj, path, "missing key \"", key, '"');
    return *v;
  }

  const value& expect(const value& v, const std::string& path, kind k) const {
    if (v.type != k) fail(v, path, "expected ", kind_name(k), ", got ", kind_name(v.type));
    return v;
  }

  /// An id: a string, or an integer written without fraction or exponent.
  std::string id(const value& v, const std::string& path) const {
    if (v.type == kind::string) return v.text;
    if (v.type == kind::number && v.text.find_first_of(".eE") == std::string::npos) {
      std::int64_t x = 0;
      const auto r = std::from_chars(v.text.data(), v.text.data() + v.text.size(), x);
      if (r.ec == std::errc{}) return std::to_string(x);
    }
    fail(v, path, "expected an integer or a string id, got ",
         v.type == kind::number ? v.text : std::string(kind_name(v.type)));
  }

  /// A memory cost in bytes: any finite non-negative number, a fraction rounded up to the next
  /// whole byte (a tool's estimate may be fractional; rounding down would under-count). Integers
  /// are read exactly; a literal with a fraction or an exponent is read as a double.
  cost_t cost(const value& v, const std::string& path) const {
    if (v.type != kind::number)
      fail(v, path, "expected a non-negative number of bytes, got ", kind_name(v.type));
    const char* b = v.text.data();
    const char* e = b + v.text.size();
    if (v.text.find_first_of(".eE") == std::string::npos) {
      std::int64_t x = 0;
      const auto r = std::from_chars(b, e, x);
      if (r.ec == std::errc{} && x >= 0) return x;
    } else {
      double x = 0;
      const auto r = std::from_chars(b, e, x);
      if (r.ec == std::errc{} && x >= 0 && std::ceil(x) < 0x1p63)
        return static_cast<cost_t>(std::ceil(x));
      // Positive and too small for a double: above 0, so one byte.
      if (r.ec == std::errc::result_out_of_range && !v.text.starts_with('-') && underflows(v.text))
        return 1;
    }
    fail(v, path, "expected a finite non-negative number of bytes (at most 2^63 - 1), got ",
         v.text);
  }

  /// A finite non-negative number.
  double number(const value& v, const std::string& path) const {
    if (v.type == kind::number) {
      double x = 0;
      const auto r = std::from_chars(v.text.data(), v.text.data() + v.text.size(), x);
      if (r.ec == std::errc{} && std::isfinite(x) && x >= 0) return x;
    }
    fail(v, path, "expected a finite non-negative number, got ",
         v.type == kind::number ? v.text : std::string(kind_name(v.type)));
  }

  graph load(const value& doc) const {
    expect(doc, "document", kind::object);
    graph g;
    const value& vs = expect(member(doc, "document", "vertices"), "vertices", kind::array);
    for (std::size_t i = 0; i < vs.items.size(); ++i) {
      const std::string path = dropit::detail::concat("vertices[", i, ']');
      const value& vx = expect(vs.items[i], path, kind::object);
      const value& idv = member(vx, path, "id");
      std::string name = id(idv, path + ".id");
      const value& cv = member(vx, path, "cost");
      const cost_t c = cost(cv, path + ".cost");
      if (g.find(name)) fail(idv, path + ".id", "duplicate vertex id \"", name, '"');
      if (c > std::numeric_limits<cost_t>::max() - g.total_cost())
        fail(cv, path + ".cost", "the total cost overflows 64 bits");
      g.add_vertex(std::move(name), c);
    }
    const value& es = expect(member(doc, "document", "edges"), "edges", kind::array);
    for (std::size_t i = 0; i < es.items.size(); ++i) {
      const std::string path = dropit::detail::concat("edges[", i, ']');
      const value& ex = expect(es.items[i], path, kind::object);
      vertex_index ends[2] = {0, 0};
      for (int k = 0; k < 2; ++k) {
        const char* key = k == 0 ? "u" : "v";
        const value& idv = member(ex, path, key);
        const std::string name = id(idv, path + '.' + key);
        const auto found = g.find(name);
        if (!found) fail(idv, path + '.' + key, "unknown vertex id \"", name, '"');
        ends[k] = *found;
      }
      if (const value* mem = ex.find("cost")) {
        if (mem->type != kind::number || number(*mem, path + ".cost") != 0.0)
          fail(*mem, path + ".cost", "edges carry no memory here (got ",
               mem->type == kind::number ? mem->text : "?",
               "); give the tensor its own vertex, or use \"compute\" for a compute cost");
      }
      const value* comp = ex.find("compute");
      g.add_edge(ends[0], ends[1], comp ? number(*comp, path + ".compute") : 0.0);
    }
    for (const char* key : {"source", "target"}) {
      const value& idv = member(doc, "document", key);
      const std::string name = id(idv, key);
      const auto found = g.find(name);
      if (!found) fail(idv, key, "unknown vertex id \"", name, '"');
      if (std::string_view(key) == "source")
        g.set_source(*found);
      else
        g.set_target(*found);
    }
    try {
      g.validate();
    } catch (const dropit::error& e) {
      std::string_view msg = e.what();
      if (msg.starts_with("dropit: ")) msg.remove_prefix(8);
      dropit::detail::throw_error(origin_, ": ", msg);
    }
    return g;
  }

 private:
  std::string_view origin_;
};

/// Appends `s` as a JSON string.
inline void write_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += "0123456789abcdef"[(c >> 4) & 15];
          out += "0123456789abcdef"[c & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

/// Appends an id: as a number when it is a canonical decimal integer, else as a string.
inline void write_id(std::string& out, std::string_view id) {
  std::int64_t x = 0;
  const auto r = std::from_chars(id.data(), id.data() + id.size(), x);
  if (!id.empty() && r.ec == std::errc{} && r.ptr == id.data() + id.size() &&
      std::to_string(x) == id)
    out += id;
  else
    write_string(out, id);
}

inline void write_double(std::string& out, double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  out.append(buf, r.ptr);
}

}  // namespace dropit::checkpoint::detail::json

namespace dropit::checkpoint {

inline graph parse_graph_json(std::string_view text, std::string_view origin) {
  detail::json::reader r(text, origin);
  const detail::json::value doc = r.document();
  return detail::json::graph_loader(origin).load(doc);
}

inline graph load_graph_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  DROPIT_EXPECTS(in.good(), "cannot open graph file '", path.string(), "'");
  std::ostringstream buf;
  buf << in.rdbuf();
  DROPIT_EXPECTS(!in.bad(), "cannot read graph file '", path.string(), "'");
  return parse_graph_json(buf.str(), path.string());
}

inline std::string to_json(const graph& g, const plan& p) {
  using namespace detail::json;
  std::string out = "{\n  \"checkpoints\": [";
  for (std::size_t i = 0; i < p.checkpoints.size(); ++i) {
    if (i) out += ", ";
    write_id(out, g.id(p.checkpoints[i]));
  }
  out += "],\n  \"segments\": [";
  for (std::size_t s = 0; s < p.segments.size(); ++s) {
    const segment& sg = p.segments[s];
    out += s ? ",\n    {\"entry\": " : "\n    {\"entry\": ";
    write_id(out, g.id(sg.entry));
    out += ", \"exit\": ";
    write_id(out, g.id(sg.exit));
    out += ", \"cost\": " + std::to_string(sg.cost) + ", \"vertices\": [";
    for (std::size_t i = 0; i < sg.vertices.size(); ++i) {
      if (i) out += ", ";
      write_id(out, g.id(sg.vertices[i]));
    }
    out += "]}";
  }
  out += p.segments.empty() ? "],\n" : "\n  ],\n";
  out += "  \"cost\": " + std::to_string(p.cost) + ",\n";
  out += "  \"checkpoint_cost\": " + std::to_string(p.checkpoint_cost) + ",\n";
  out += "  \"max_segment_cost\": " + std::to_string(p.max_segment_cost) + ",\n";
  out += "  \"regular_cost\": " + std::to_string(p.regular_cost) + ",\n";
  out += "  \"recompute\": ";
  write_double(out, p.recompute);
  out += ",\n  \"solve_seconds\": ";
  write_double(out, p.solve_seconds);
  out += "\n}\n";
  return out;
}

inline std::string to_json(const graph& g) {
  using namespace detail::json;
  std::string out = "{\n  \"source\": ";
  write_id(out, g.id(g.source()));
  out += ",\n  \"target\": ";
  write_id(out, g.id(g.target()));
  out += ",\n  \"vertices\": [";
  for (vertex_index v = 0; v < g.vertex_count(); ++v) {
    out += v ? ",\n    {\"id\": " : "\n    {\"id\": ";
    write_id(out, g.id(v));
    out += ", \"cost\": " + std::to_string(g.cost(v)) + "}";
  }
  out += g.vertex_count() ? "\n  ],\n  \"edges\": [" : "],\n  \"edges\": [";
  for (std::size_t i = 0; i < g.edges().size(); ++i) {
    const edge& e = g.edges()[i];
    out += i ? ",\n    {\"u\": " : "\n    {\"u\": ";
    write_id(out, g.id(e.from));
    out += ", \"v\": ";
    write_id(out, g.id(e.to));
    out += ", \"compute\": ";
    write_double(out, e.compute);
    out += "}";
  }
  out += g.edge_count() ? "\n  ]\n}\n" : "]\n}\n";
  return out;
}

}  // namespace dropit::checkpoint
