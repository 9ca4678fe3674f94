/**
 * @file json.hpp
 * @brief The graph loader on nlohmann::json's strict SAX parser (RFC 8259: no comments, no
 * trailing commas, no NaN; this layer adds: no duplicate keys, a depth limit, where each value
 * starts), and the plan writer. Errors name the line and column, then the path of the value
 * (`vertices[3].cost`).
 */
#pragma once

#include <dropit/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
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

/// Where a document's bytes are: line and column (1-based, in bytes) of an offset.
class text_position {
 public:
  explicit text_position(std::string_view text) {
    for (std::size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n') line_starts_.push_back(i + 1);
  }
  /// (line, column) of byte `offset`.
  [[nodiscard]] std::pair<std::size_t, std::size_t> at(std::size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const std::size_t line = static_cast<std::size_t>(it - line_starts_.begin());
    return {line, offset - line_starts_[line - 1] + 1};
  }

 private:
  std::vector<std::size_t> line_starts_{0};
};

/// A `const char*` that publishes how far nlohmann's lexer has read, so that the SAX handler
/// knows where each value ends (the lexer reads one character at a time, and after a number
/// one character past it).
struct counting_iterator {
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  const char* p = nullptr;
  const char** read_to = nullptr;  ///< the position after the last character read

  reference operator*() const noexcept { return *p; }
  counting_iterator& operator++() noexcept {
    *read_to = ++p;
    return *this;
  }
  counting_iterator operator++(int) noexcept {
    counting_iterator old = *this;
    ++*this;
    return old;
  }
  friend bool operator==(const counting_iterator& a, const counting_iterator& b) noexcept {
    return a.p == b.p;
  }
};

/**
 * Builds the `value` tree from nlohmann::json's SAX events. nlohmann checks the grammar (RFC 8259,
 * strict: no comments, no trailing commas, no NaN) and decodes strings; this handler adds where
 * each value starts, the path of the value being read for error messages, duplicate keys and a
 * depth limit, and keeps number literals as written (costs are read exactly from the literal).
 */
class tree_builder {
 public:
  using json = nlohmann::json;
  static constexpr std::size_t max_depth = 512;

  tree_builder(std::string_view text, std::string_view origin, const char** read_to)
      : text_(text), origin_(origin), read_to_(read_to), where_(text) {}

  [[nodiscard]] value take() { return std::move(root_); }

  bool null() {
    add(kind::null, start_of_word());
    return true;
  }
  bool boolean(bool b) {
    value& v = add(kind::boolean, start_of_word());
    v.boolean = b;
    return true;
  }
  bool number_integer(json::number_integer_t) { return number(); }
  bool number_unsigned(json::number_unsigned_t) { return number(); }
  bool number_float(json::number_float_t, const std::string&) { return number(); }
  bool string(std::string& s) {
    value& v = add(kind::string, start_of_string());
    v.text = std::move(s);
    return true;
  }
  bool binary(json::binary_t&) { return false; }  // never produced by the JSON lexer
  bool start_object(std::size_t) { return open(kind::object); }
  bool start_array(std::size_t) { return open(kind::array); }
  bool key(std::string& k) {
    frame& f = stack_.back();
    if (!f.seen.insert(k).second) fail_at_offset(start_of_string(), "duplicate key \"", k, '"');
    f.node->keys.push_back(std::move(k));
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // nlohmann's message is "[json.exception.<id>] what" or "[json.exception.<id>] parse error at
    // line L, column C: what"; the line and column are ours (in bytes), so only `what` is kept.
    std::string_view what = e.what();
    if (const auto id_end = what.find("] ");
        what.starts_with("[json.exception.") && id_end != what.npos)
      what.remove_prefix(id_end + 2);
    if (const auto at = what.find(": ");
        what.starts_with("parse error at line ") && at != what.npos)
      what.remove_prefix(at + 2);
    // A number too large for a double (406) is reported where its literal starts.
    const std::size_t at = e.id == 406 ? number_span().first : position == 0 ? 0 : position - 1;
    fail_value(std::min(at, text_.size()), what);
  }

 private:
  struct frame {
    value* node;
    std::unordered_set<std::string> seen;  // object keys: a linear check would be quadratic
  };

  template <class... Args>
  [[noreturn]] void fail_at_offset(std::size_t offset, Args&&... args) const {
    const auto [line, column] = where_.at(offset);
    fail_at(origin_, line, column, std::forward<Args>(args)...);
  }
  /// As fail_at_offset, naming the path of the value being read first, if it has one.
  template <class... Args>
  [[noreturn]] void fail_value(std::size_t offset, Args&&... args) const {
    const std::string path = path_of_open_value();
    if (path.empty()) fail_at_offset(offset, std::forward<Args>(args)...);
    fail_at_offset(offset, path, ": ", std::forward<Args>(args)...);
  }
  [[nodiscard]] std::size_t read() const noexcept {
    return static_cast<std::size_t>(*read_to_ - text_.data());
  }
  static bool number_char(char c) noexcept {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
  }
  /// Start of the string token that ends (closing quote) just before read(): the nearest earlier
  /// quote not escaped by an odd run of backslashes.
  [[nodiscard]] std::size_t start_of_string() const noexcept {
    std::size_t q = read() - 1;
    while (q > 0) {
      --q;
      if (text_[q] != '"') continue;
      std::size_t slashes = 0;
      while (q > slashes && text_[q - 1 - slashes] == '\\')
        ++slashes;
      if (slashes % 2 == 0) return q;
    }
    return q;
  }
  /// Start of the literal true/false/null that ends at read().
  [[nodiscard]] std::size_t start_of_word() const noexcept {
    std::size_t b = read();
    while (b > 0 && text_[b - 1] >= 'a' && text_[b - 1] <= 'z')
      --b;
    return b;
  }
  /// [begin, end) of the number literal just read: the lexer has read one character past it
  /// unless it ends the input.
  [[nodiscard]] std::pair<std::size_t, std::size_t> number_span() const noexcept {
    std::size_t end = read();
    if (end > 0 && !number_char(text_[end - 1])) --end;
    std::size_t begin = end;
    while (begin > 0 && number_char(text_[begin - 1]))
      --begin;
    return {begin, end};
  }
  bool number() {
    const auto [begin, end] = number_span();
    add(kind::number, begin).text.assign(text_.substr(begin, end - begin));
    return true;
  }
  /// A new value starting at `offset`: the document, or the next item of the open container.
  value& add(kind k, std::size_t offset) {
    value* v = &root_;
    if (!stack_.empty()) v = &stack_.back().node->items.emplace_back();
    v->type = k;
    std::tie(v->line, v->column) = where_.at(offset);
    return *v;
  }
  bool open(kind k) {
    if (stack_.size() >= max_depth)
      fail_at_offset(read() - 1, "values nested deeper than ", max_depth);
    stack_.push_back({&add(k, read() - 1), {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  /// The path of the value being read, `vertices[3].cost`. A container's open child is already
  /// its last item (`add` puts it there when it opens); in the innermost container, the value
  /// being read is its next item, or the value of its last key if that has none yet.
  [[nodiscard]] std::string path_of_open_value() const {
    std::string path;
    for (const frame& f : stack_) {
      const value& v = *f.node;
      const bool innermost = &f == &stack_.back();
      if (v.type == kind::array) {
        path += dropit::detail::concat('[', v.items.size() - (innermost ? 0 : 1), ']');
      } else if (!innermost || v.keys.size() > v.items.size()) {
        if (!path.empty()) path += '.';
        path += v.keys.back();
      }
    }
    return path;
  }

  std::string_view text_;
  std::string_view origin_;
  const char** read_to_;
  text_position where_;
  value root_;
  std::vector<frame> stack_;
};

/// Parses a whole JSON document (one value, surrounded by whitespace) into a `value` tree.
[[nodiscard]] inline value read_document(std::string_view text, std::string_view origin) {
  const char* read_to = text.data();
  tree_builder builder(text, origin, &read_to);
  const counting_iterator first{text.data(), &read_to};
  const counting_iterator last{text.data() + text.size(), &read_to};
  nlohmann::json::sax_parse(first, last, &builder, nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  return builder.take();
}

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

  /// A vertex's list of ids that must name inputs of `v` (or `v` itself where `self_too`).
  std::vector<vertex_index> inputs_of(const graph& g, vertex_index v, const value& list,
                                      const char* key, bool self_too) const {
    const std::string path = dropit::detail::concat("vertices[", v, "].", key);
    expect(list, path, kind::array);
    std::vector<vertex_index> out;
    for (std::size_t i = 0; i < list.items.size(); ++i) {
      const std::string item = dropit::detail::concat(path, '[', i, ']');
      const std::string name = id(list.items[i], item);
      const auto found = g.find(name);
      if (!found) fail(list.items[i], item, "unknown vertex id \"", name, '"');
      if (!(self_too && *found == v) && !g.has_edge(*found, v)) {
        if (self_too)
          fail(list.items[i], item, "vertex \"", name, "\" is neither \"", g.id(v),
               "\" nor one of its inputs");
        fail(list.items[i], item, "vertex \"", name, "\" is not one of \"", g.id(v), "\"'s inputs");
      }
      out.push_back(*found);
    }
    return out;
  }

  graph load(const value& doc) const {
    expect(doc, "document", kind::object);
    graph g;
    const value& vs = expect(member(doc, "document", "vertices"), "vertices", kind::array);
    // read once the edges are in
    std::vector<std::pair<vertex_index, const value*>> unsaved, passes;
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
      const vertex_index v = g.add_vertex(std::move(name), c);
      if (const value* tv = vx.find("time")) g.set_time(v, number(*tv, path + ".time"));
      if (const value* wv = vx.find("workspace"))
        g.set_workspace(v, cost(*wv, path + ".workspace"));
      if (const value* sv = vx.find("storage")) storage(g, v, *sv, path + ".storage");
      if (const value* uv = vx.find("unsaved")) unsaved.emplace_back(v, uv);
      if (const value* pv = vx.find("passes_gradient")) passes.emplace_back(v, pv);
      if (const value* fv = vx.find("frees_gradient_early"))
        g.set_frees_gradient_early(
            v, expect(*fv, path + ".frees_gradient_early", kind::boolean).boolean);
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
    for (const auto& [v, uv] : unsaved)
      g.set_unsaved(v, inputs_of(g, v, *uv, "unsaved", true));
    for (const auto& [v, pv] : passes)
      g.set_passes_gradient(v, inputs_of(g, v, *pv, "passes_gradient", false));
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
  /// A vertex's storage options: `[{"name": STRING, "bytes": NUMBER, "time": NUMBER}, ...]`, the
  /// bytes read as a cost, the time optional (0).
  void storage(graph& g, vertex_index v, const value& arr, const std::string& path) const {
    expect(arr, path, kind::array);
    for (std::size_t i = 0; i < arr.items.size(); ++i) {
      const std::string at = dropit::detail::concat(path, '[', i, ']');
      const value& ov = expect(arr.items[i], at, kind::object);
      const value& nv = expect(member(ov, at, "name"), at + ".name", kind::string);
      if (nv.text.empty()) fail(nv, at + ".name", "expected a non-empty name");
      for (const storage_option& o : g.storage(v))
        if (o.name == nv.text) fail(nv, at + ".name", "duplicate storage option \"", nv.text, '"');
      storage_option o{nv.text, cost(member(ov, at, "bytes"), at + ".bytes"), 0.0};
      if (const value* tv = ov.find("time")) o.time = number(*tv, at + ".time");
      g.add_storage(v, std::move(o));
    }
  }

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
  const detail::json::value doc = detail::json::read_document(text, origin);
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
  out += "  \"compressed\": [";
  for (std::size_t i = 0; i < p.compressed.size(); ++i) {
    const compression& c = p.compressed[i];
    const storage_option& o = g.storage(c.vertex)[c.option];
    out += i ? ",\n    {\"vertex\": " : "\n    {\"vertex\": ";
    write_id(out, g.id(c.vertex));
    out += ", \"option\": ";
    write_string(out, o.name);
    out += ", \"bytes\": " + std::to_string(o.bytes) + ", \"time\": ";
    write_double(out, o.time);
    out += "}";
  }
  out += p.compressed.empty() ? "],\n" : "\n  ],\n";
  out += "  \"cost\": " + std::to_string(p.cost) + ",\n";
  out += "  \"checkpoint_cost\": " + std::to_string(p.checkpoint_cost) + ",\n";
  out += "  \"compressed_cost\": " + std::to_string(p.compressed_cost) + ",\n";
  out += "  \"max_segment_cost\": " + std::to_string(p.max_segment_cost) + ",\n";
  out += "  \"regular_cost\": " + std::to_string(p.regular_cost) + ",\n";
  out += "  \"recompute\": ";
  write_double(out, p.recompute);
  out += ",\n  \"extra_time\": ";
  write_double(out, p.extra_time);
  out += p.exact ? ",\n  \"exact\": true" : ",\n  \"exact\": false";
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
    out += ", \"cost\": " + std::to_string(g.cost(v));
    if (g.has_time(v)) {
      out += ", \"time\": ";
      write_double(out, g.time(v));
    }
    if (g.workspace(v) != 0) out += ", \"workspace\": " + std::to_string(g.workspace(v));
    const auto un = g.unsaved(v);
    for (std::size_t i = 0; i < un.size(); ++i) {
      out += i ? ", " : ", \"unsaved\": [";
      write_id(out, g.id(un[i]));
    }
    if (!un.empty()) out += "]";
    const auto pg = g.passed_gradients(v);
    for (std::size_t i = 0; i < pg.size(); ++i) {
      out += i ? ", " : ", \"passes_gradient\": [";
      write_id(out, g.id(pg[i]));
    }
    if (!pg.empty()) out += "]";
    if (g.frees_gradient_early(v)) out += ", \"frees_gradient_early\": true";
    const auto st = g.storage(v);
    for (std::size_t i = 0; i < st.size(); ++i) {
      out += i ? ", {\"name\": " : ", \"storage\": [{\"name\": ";
      write_string(out, st[i].name);
      out += ", \"bytes\": " + std::to_string(st[i].bytes) + ", \"time\": ";
      write_double(out, st[i].time);
      out += "}";
    }
    if (!st.empty()) out += "]";
    out += "}";
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
