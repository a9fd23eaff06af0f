//===- InputLimits.cpp - Bounds on text handed to the MLIR parser ---------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/Spec/InputLimits.h"

namespace flashopt::spec {

std::optional<NestingViolation> findExcessiveNesting(std::string_view text,
                                                     int max_depth) {
  int depth = 0;
  size_t line = 1, lineStart = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    char c = text[i];
    switch (c) {
    case '\n':
      ++line;
      lineStart = i + 1;
      break;
    case '"': // a string literal: skip to its closing quote (or the line end)
      for (++i; i < n && text[i] != '"' && text[i] != '\n'; ++i)
        if (text[i] == '\\' && i + 1 < n && text[i + 1] != '\n')
          ++i;
      if (i < n && text[i] == '\n')
        --i; // let the newline be counted
      break;
    case '/':
      if (i + 1 < n && text[i + 1] == '/') {
        while (i + 1 < n && text[i + 1] != '\n')
          ++i;
      }
      break;
    case '-':
      if (i + 1 < n && text[i + 1] == '>')
        ++i; // "->" is not a closing bracket
      break;
    case '(':
    case '[':
    case '{':
    case '<':
      if (++depth > max_depth) {
        NestingViolation v;
        v.line = line;
        v.column = i - lineStart + 1;
        v.offset = i;
        v.message = "nesting deeper than " + std::to_string(max_depth) +
                    " levels of brackets ('(', '[', '{', '<'); flashopt "
                    "refuses such input (the MLIR parser would overflow "
                    "its stack)";
        return v;
      }
      break;
    case ')':
    case ']':
    case '}':
    case '>':
      if (depth > 0)
        --depth;
      break;
    default:
      break;
    }
  }
  return std::nullopt;
}

} // namespace flashopt::spec
