//===- SpecText.cpp - How the spec parser words its messages --------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Reading a spec or rule file, quoting and describing JSON values in
/// messages, and the "did you mean" suggestion for a misspelt key.
///
//===----------------------------------------------------------------------===//

#include "SpecParserImpl.h"

#include "flashopt/abi/Files.h"

#include <cctype>

namespace flashopt::spec::detail {

namespace fs = std::filesystem;

/// Reads a whole regular file (a FIFO, device or endless file is refused
/// before anything is read, abi/Files.h); on failure returns nullopt and sets
/// `error`.
std::optional<std::string> readFile(const fs::path &path, std::size_t maxBytes,
                                    std::string &error) {
  std::string data;
  abi::FileError e = abi::read_regular_file(path.string(), maxBytes, data, error);
  if (e == abi::FileError::None)
    return data;
  if (e == abi::FileError::TooLarge)
    error = fmt::format("larger than {} MiB", maxBytes >> 20);
  return std::nullopt;
}

/// Quotes `s` as a JSON string, shortened to about 60 bytes.
std::string quote(std::string_view s) {
  constexpr std::size_t kMax = 60;
  bool cut = s.size() > kMax;
  if (cut) {
    std::size_t n = kMax - 3;
    // Do not cut a UTF-8 sequence in half.
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80)
      --n;
    s = s.substr(0, n);
  }
  std::string q =
      json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
  if (cut)
    q.insert(q.size() - 1, "...");
  return q;
}

/// "\"a\", \"b\", \"c\"".
std::string quoteList(const std::vector<std::string> &items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i)
      out += ", ";
    out += quote(items[i]);
  }
  return out;
}

/// Describes a found value for "expected ..., found <describe>".
std::string describe(const json &v) {
  switch (v.type()) {
  case json::value_t::string:
    return quote(v.get_ref<const std::string &>());
  case json::value_t::number_integer:
  case json::value_t::number_unsigned:
  case json::value_t::number_float:
    return "number " + v.dump();
  case json::value_t::boolean:
    return v.get<bool>() ? "boolean true" : "boolean false";
  case json::value_t::null:
    return "null";
  case json::value_t::object:
    return v.empty() ? "an empty object" : "an object";
  case json::value_t::array:
    return v.empty() ? "an empty array" : "an array";
  default:
    return "a value of another kind";
  }
}

/// Optimal-string-alignment distance (typos: one edit or one transposition).
std::size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(
      a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      char ca =
          static_cast<char>(std::tolower(static_cast<unsigned char>(a[i - 1])));
      char cb =
          static_cast<char>(std::tolower(static_cast<unsigned char>(b[j - 1])));
      std::size_t cost = ca == cb ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

/// The closest allowed name to a misspelt `key`, if it is close enough.
std::optional<std::string> suggest(std::string_view key,
                                   const std::vector<std::string> &allowed) {
  if (key.size() > 64)
    return std::nullopt;
  std::optional<std::string> best;
  std::size_t bestDist = 3;
  for (const std::string &a : allowed) {
    std::size_t dist = editDistance(key, a);
    if (dist < bestDist && dist <= std::max<std::size_t>(1, key.size() / 2)) {
      best = a;
      bestDist = dist;
    }
  }
  return best;
}

bool isIdentifier(std::string_view s) {
  if (s.empty())
    return false;
  auto alpha = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  if (!alpha(s[0]))
    return false;
  for (char c : s)
    if (!alpha(c) && !(c >= '0' && c <= '9'))
      return false;
  return true;
}

/// Strips nlohmann's "[json.exception.parse_error.101] parse error at line 1,
/// column 2: " prefix from an exception message.
std::string stripNlohmannPrefix(std::string msg) {
  if (!msg.empty() && msg[0] == '[') {
    std::size_t close = msg.find("] ");
    if (close != std::string::npos)
      msg.erase(0, close + 2);
  }
  if (msg.rfind("parse error", 0) == 0) {
    std::size_t colon = msg.find(": ");
    if (colon != std::string::npos)
      msg.erase(0, colon + 2);
  }
  return msg;
}

} // namespace flashopt::spec::detail
