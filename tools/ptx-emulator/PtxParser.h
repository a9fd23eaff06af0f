//===- PtxParser.h - the PTX module parser's state --------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The module parser of the PTX interpreter (internal): its lexer, the
/// registers and labels of the kernel being read, and the parsing steps;
/// directives, declarations and instructions are read in PtxParser.cpp,
/// operands (registers, immediates, addresses, vectors) in PtxOperands.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_PTXEMU_PTXPARSER_H
#define FLASHOPT_PTXEMU_PTXPARSER_H

#include "PtxInternal.h"

#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace flashopt::ptxemu::detail {

struct Parser {
  std::string src; ///< comments removed, newlines kept
  size_t pos = 0;
  int line = 1;
  std::set<std::string> opcodes;
  /// Initialized module-scope .global arrays: the data, and each symbol's
  /// address (the host address of its bytes).
  std::shared_ptr<ConstData> data = std::make_shared<ConstData>();
  std::map<std::string, uint64_t> globals;

  /// `.global .align N .b8 name[SIZE] = {b, b, ...};` (after `.global`):
  /// constant tables (flashopt.table_lookup). Other data is refused.
  void parseGlobalArray(int at);

  explicit Parser(const std::string &text);

  void skipSpace() {
    while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos]))) {
      if (src[pos] == '\n')
        ++line;
      ++pos;
    }
  }
  bool eof() {
    skipSpace();
    return pos >= src.size();
  }
  static bool identChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
           c == '$' || c == '.' || c == '%';
  }
  std::string word() {
    skipSpace();
    size_t b = pos;
    while (pos < src.size() && identChar(src[pos]))
      ++pos;
    return src.substr(b, pos - b);
  }
  bool accept(char c) {
    skipSpace();
    if (pos < src.size() && src[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c))
      fail(line, std::string("expected '") + c + "'");
  }
  /// Text up to (not including) `c`, which is consumed.
  std::string until(char c) {
    std::string out;
    while (pos < src.size() && src[pos] != c) {
      if (src[pos] == '\n')
        ++line;
      out += src[pos++];
    }
    if (pos >= src.size())
      fail(line, std::string("missing '") + c + "'");
    ++pos;
    return out;
  }

  std::unique_ptr<Module> parseModule(Module *m, std::string *target,
                                      std::vector<std::unique_ptr<KernelImpl>> *out);

  std::unique_ptr<KernelImpl> parseEntry();

  std::unordered_map<std::string, int> regs;
  std::unordered_map<std::string, int> labels;
  /// Nested `{ }` scopes: the names each declared, with what they shadowed.
  std::vector<std::vector<std::pair<std::string, int>>> scopes;

  void bindReg(KernelImpl &k, const std::string &name, int bits);

  void declareRegs(KernelImpl &k, const std::string &stmt, int at);

  int regIndex(const std::string &name, int at);

  static std::string trim(const std::string &s);

  uint64_t parseImm(const std::string &s, int at, bool *ok);

  Operand parseOperand(KernelImpl &k, std::string s, int at);

  /// Splits operands at top-level commas (not inside {} or []).
  static std::vector<std::string> splitOperands(const std::string &s);

  void parseInstruction(KernelImpl &k, std::string stmt, int at);

  void parseBody(KernelImpl &k);
};

} // namespace flashopt::ptxemu::detail

#endif // FLASHOPT_PTXEMU_PTXPARSER_H
