//===- JsonPositions.h - Source positions of JSON values --------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// nlohmann/json keeps no source positions, so the spec front end scans the
/// text a second time with this small scanner. It maps the JSON pointer
/// (RFC 6901) of every value to the line:col of the value and, for object
/// members, of the member's key. It also finds what nlohmann/json accepts
/// silently: duplicate keys in one object (nlohmann keeps the last one; so
/// does this index) and nesting deeper than a limit.
///
/// The scanner is meant for text that nlohmann/json has already accepted,
/// but it never crashes or loops on any input: on text that is not JSON it
/// stops and leaves a partial index. It is plain C++17 with no dependency.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_SPEC_JSONPOSITIONS_H
#define FLASHOPT_SPEC_JSONPOSITIONS_H

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::spec {

/// A position in a text: byte offset plus 1-based line and column. Columns
/// count bytes (a tab or a UTF-8 sequence byte is one column), lines are
/// separated by '\n'.
struct TextPos {
  /// Byte offset from the start of the text (0-based).
  std::size_t offset = 0;
  /// 1-based line number.
  unsigned line = 1;
  /// 1-based column (in bytes).
  unsigned col = 1;
};

/// Converts byte offsets of one text to line:col.
class LineTable {
public:
  /// Indexes the line starts of `text` (the text is not kept).
  explicit LineTable(std::string_view text);
  /// The line:col of byte `offset`; offsets past the end are clamped to the
  /// end of the text (the position just after its last byte).
  TextPos at(std::size_t offset) const;

private:
  std::vector<std::size_t> lineStarts;
  std::size_t size = 0;
};

/// Where one JSON value is written.
struct JsonPosEntry {
  /// The first character of the value ('{', '[', '"', digit, 't', ...).
  TextPos value;
  /// The opening quote of the member's key (object members only).
  TextPos key;
  /// Whether `key` is meaningful (false for the root and array elements).
  bool hasKey = false;
};

/// A key written twice (or more) in one object.
struct DuplicateKey {
  /// JSON pointer of the member (e.g. "/param/dtype").
  std::string pointer;
  /// The key as decoded (UTF-8, escapes resolved).
  std::string key;
  /// The key of the repeated occurrence.
  TextPos at;
  /// The key of the first occurrence.
  TextPos first;
};

/// The position index of one JSON text.
class JsonPositions {
public:
  /// Default maximum nesting depth (objects and arrays) the scanner follows.
  static constexpr unsigned kDefaultMaxDepth = 64;

  /// Scans `text`. Values nested deeper than `maxDepth` levels stop the
  /// scan; `tooDeep()` then says where.
  static JsonPositions build(std::string_view text,
                             unsigned maxDepth = kDefaultMaxDepth);

  /// The entry of the value at JSON pointer `pointer` ("" is the root), or
  /// null when the scanner did not see it. For a duplicated key the entry
  /// is that of the last occurrence, as in nlohmann/json's DOM.
  const JsonPosEntry *lookup(const std::string &pointer) const;

  /// Every repeated key, in text order.
  const std::vector<DuplicateKey> &duplicates() const { return dups; }

  /// The opening bracket of the first value nested deeper than the limit.
  const std::optional<TextPos> &tooDeep() const { return deep; }
  /// JSON pointer of the value reported by tooDeep().
  const std::string &tooDeepPointer() const { return deepPointer; }

  /// Whether the scanner reached the end of a complete JSON value.
  bool complete() const { return done; }

  /// Number of values indexed.
  std::size_t size() const { return entries.size(); }

  /// Escapes one reference token of a JSON pointer ("~" → "~0", "/" → "~1").
  static std::string escapeToken(std::string_view token);

private:
  friend class JsonScanner;
  std::map<std::string, JsonPosEntry> entries;
  std::vector<DuplicateKey> dups;
  std::optional<TextPos> deep;
  std::string deepPointer;
  bool done = false;
};

} // namespace flashopt::spec

#endif // FLASHOPT_SPEC_JSONPOSITIONS_H
