//===- JsonPositions.cpp - Source positions of JSON values ----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A recursive-descent scanner over JSON text that records where each value
/// and each key is written. Recursion is bounded by the depth limit, every
/// loop advances through the text, and every read is bounds-checked, so any
/// input (including text that is not JSON) is safe.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Spec/JsonPositions.h"

#include <algorithm>
#include <cstdint>

namespace flashopt::spec {

//===----------------------------------------------------------------------===//
// LineTable
//===----------------------------------------------------------------------===//

LineTable::LineTable(std::string_view text) : size(text.size()) {
  lineStarts.push_back(0);
  for (std::size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n')
      lineStarts.push_back(i + 1);
}

TextPos LineTable::at(std::size_t offset) const {
  offset = std::min(offset, size);
  auto it = std::upper_bound(lineStarts.begin(), lineStarts.end(), offset);
  std::size_t line = static_cast<std::size_t>(it - lineStarts.begin()); // >= 1
  TextPos pos;
  pos.offset = offset;
  pos.line = static_cast<unsigned>(line);
  pos.col = static_cast<unsigned>(offset - lineStarts[line - 1] + 1);
  return pos;
}

//===----------------------------------------------------------------------===//
// JsonScanner
//===----------------------------------------------------------------------===//

std::string JsonPositions::escapeToken(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (char c : token) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

namespace {
void appendUtf8(std::string &out, uint32_t cp) {
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

int hexValue(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}
} // namespace

/// The scanner proper (a friend of JsonPositions).
class JsonScanner {
public:
  JsonScanner(std::string_view text, unsigned maxDepth, JsonPositions &out)
      : text(text), lines(text), maxDepth(maxDepth), out(out) {}

  void run() {
    // nlohmann/json skips a UTF-8 byte order mark; so do we.
    if (text.size() >= 3 && static_cast<unsigned char>(text[0]) == 0xEF &&
        static_cast<unsigned char>(text[1]) == 0xBB &&
        static_cast<unsigned char>(text[2]) == 0xBF)
      pos = 3;
    if (!value("", std::nullopt, 0))
      return;
    skipSpace();
    out.done = pos == text.size();
  }

private:
  std::string_view text;
  LineTable lines;
  unsigned maxDepth;
  JsonPositions &out;
  std::size_t pos = 0;

  bool atEnd() const { return pos >= text.size(); }
  char peek() const { return atEnd() ? '\0' : text[pos]; }

  void skipSpace() {
    while (!atEnd() && (text[pos] == ' ' || text[pos] == '\t' ||
                        text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }

  /// Reads a string starting at the opening quote; decodes it into `decoded`.
  bool readString(std::string &decoded) {
    if (peek() != '"')
      return false;
    ++pos;
    while (!atEnd()) {
      char c = text[pos++];
      if (c == '"')
        return true;
      if (c != '\\') {
        decoded += c;
        continue;
      }
      if (atEnd())
        return false;
      char e = text[pos++];
      switch (e) {
      case '"':
        decoded += '"';
        break;
      case '\\':
        decoded += '\\';
        break;
      case '/':
        decoded += '/';
        break;
      case 'b':
        decoded += '\b';
        break;
      case 'f':
        decoded += '\f';
        break;
      case 'n':
        decoded += '\n';
        break;
      case 'r':
        decoded += '\r';
        break;
      case 't':
        decoded += '\t';
        break;
      case 'u': {
        uint32_t cp = 0;
        if (!readHex4(cp))
          return false;
        if (cp >= 0xD800 && cp <= 0xDBFF && pos + 1 < text.size() &&
            text[pos] == '\\' && text[pos + 1] == 'u') {
          std::size_t save = pos;
          pos += 2;
          uint32_t lo = 0;
          if (readHex4(lo) && lo >= 0xDC00 && lo <= 0xDFFF)
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          else
            pos = save;
        }
        appendUtf8(decoded, cp);
        break;
      }
      default:
        return false;
      }
    }
    return false;
  }

  bool readHex4(uint32_t &cp) {
    if (pos + 4 > text.size())
      return false;
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      int h = hexValue(text[pos + i]);
      if (h < 0)
        return false;
      cp = cp * 16 + static_cast<uint32_t>(h);
    }
    pos += 4;
    return true;
  }

  void record(const std::string &pointer, std::optional<TextPos> key,
              TextPos at) {
    JsonPosEntry &e = out.entries[pointer];
    e.value = at;
    e.hasKey = key.has_value();
    e.key = key ? *key : TextPos{};
  }

  /// Drops the entries below `pointer` (from an earlier duplicate member).
  void eraseChildren(const std::string &pointer) {
    // Every pointer below `pointer` starts with pointer + "/"; '0' is the
    // character after '/', so this is the half-open range of descendants.
    auto lo = out.entries.lower_bound(pointer + "/");
    auto hi = out.entries.lower_bound(pointer + "0");
    out.entries.erase(lo, hi);
  }

  bool value(const std::string &pointer, std::optional<TextPos> key,
             unsigned depth) {
    skipSpace();
    if (atEnd())
      return false;
    TextPos at = lines.at(pos);
    record(pointer, key, at);
    char c = text[pos];
    if (c == '{' || c == '[') {
      if (depth >= maxDepth) {
        out.deep = at;
        out.deepPointer = pointer;
        return false;
      }
      return c == '{' ? object(pointer, depth) : array(pointer, depth);
    }
    if (c == '"') {
      std::string ignored;
      return readString(ignored);
    }
    // A number or a literal (true, false, null).
    std::size_t start = pos;
    while (!atEnd()) {
      char d = text[pos];
      bool ok = (d >= '0' && d <= '9') || (d >= 'a' && d <= 'z') ||
                (d >= 'A' && d <= 'Z') || d == '+' || d == '-' || d == '.';
      if (!ok)
        break;
      ++pos;
    }
    return pos > start;
  }

  bool object(const std::string &pointer, unsigned depth) {
    ++pos; // '{'
    skipSpace();
    if (peek() == '}') {
      ++pos;
      return true;
    }
    std::map<std::string, TextPos> seen;
    while (true) {
      skipSpace();
      if (peek() != '"')
        return false;
      TextPos keyPos = lines.at(pos);
      std::string key;
      if (!readString(key))
        return false;
      skipSpace();
      if (peek() != ':')
        return false;
      ++pos;
      std::string child = pointer + "/" + JsonPositions::escapeToken(key);
      auto [it, inserted] = seen.emplace(key, keyPos);
      if (!inserted) {
        out.dups.push_back(DuplicateKey{child, key, keyPos, it->second});
        eraseChildren(child);
      }
      if (!value(child, keyPos, depth + 1))
        return false;
      skipSpace();
      if (peek() == ',') {
        ++pos;
        continue;
      }
      if (peek() == '}') {
        ++pos;
        return true;
      }
      return false;
    }
  }

  bool array(const std::string &pointer, unsigned depth) {
    ++pos; // '['
    skipSpace();
    if (peek() == ']') {
      ++pos;
      return true;
    }
    for (std::size_t index = 0;; ++index) {
      if (!value(pointer + "/" + std::to_string(index), std::nullopt,
                 depth + 1))
        return false;
      skipSpace();
      if (peek() == ',') {
        ++pos;
        continue;
      }
      if (peek() == ']') {
        ++pos;
        return true;
      }
      return false;
    }
  }
};

JsonPositions JsonPositions::build(std::string_view text, unsigned maxDepth) {
  JsonPositions positions;
  JsonScanner(text, maxDepth, positions).run();
  return positions;
}

const JsonPosEntry *JsonPositions::lookup(const std::string &pointer) const {
  auto it = entries.find(pointer);
  return it == entries.end() ? nullptr : &it->second;
}

} // namespace flashopt::spec
