//===- PtxOperands.cpp - PTX operand parsing --------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The PTX interpreter's operands: registers, immediates (integers, the
/// 0f/0d float spellings), addresses and vectors, parsed into
/// PtxInternal.h's Operand for the instruction decoder (PtxParser.cpp).
///
//===----------------------------------------------------------------------===//

#include "PtxParser.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace flashopt::ptxemu {

using namespace detail;


std::string Parser::trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

uint64_t Parser::parseImm(const std::string &s, int at, bool *ok) {
  *ok = true;
  std::string t = s;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'f' || t[1] == 'F') &&
      t.size() == 10)
    return std::stoull(t.substr(2), nullptr, 16);
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'd' || t[1] == 'D') &&
      t.size() == 18)
    return std::stoull(t.substr(2), nullptr, 16);
  bool neg = false;
  size_t i = 0;
  if (!t.empty() && t[0] == '-') {
    neg = true;
    i = 1;
  }
  if (i >= t.size() || !std::isdigit(static_cast<unsigned char>(t[i]))) {
    *ok = false;
    return 0;
  }
  if (!t.empty() && (t.back() == 'U' || t.back() == 'u'))
    t.pop_back();
  uint64_t v = 0;
  try {
    size_t used = 0;
    if (t.size() > i + 1 && t[i] == '0' && (t[i + 1] == 'x' || t[i + 1] == 'X'))
      v = std::stoull(t.substr(i + 2), &used, 16), used += 2;
    else
      v = std::stoull(t.substr(i), &used, 10);
    if (used != t.size() - i)
      fail(at, "bad immediate " + s);
  } catch (const std::logic_error &) {
    fail(at, "bad immediate " + s);
  }
  return neg ? uint64_t(-int64_t(v)) : v;
}

Operand Parser::parseOperand(KernelImpl &k, std::string s, int at) {
  s = trim(s);
  Operand o;
  if (s.empty())
    fail(at, "empty operand");
  if (s == "_") {
    o.kind = Operand::Sink;
    return o;
  }
  if (s[0] == '{') {
    if (s.back() != '}')
      fail(at, "bad vector operand " + s);
    o.kind = Operand::Vec;
    for (std::string e : split(s.substr(1, s.size() - 2), ',')) {
      e = trim(e);
      if (o.nvec == 4)
        fail(at, "vector operand longer than 4");
      if (e == "_") {
        o.vec[o.nvec++] = -1;
        continue;
      }
      bool isImm = false;
      uint64_t v = regs.count(e) ? 0 : parseImm(e, at, &isImm);
      if (isImm) {
        o.vimm[o.nvec] = v;
        o.vec[o.nvec++] = -2;
      } else {
        o.vec[o.nvec++] = regIndex(e, at);
      }
    }
    return o;
  }
  if (s[0] == '[') {
    if (s.back() != ']')
      fail(at, "bad address operand " + s);
    std::string in = trim(s.substr(1, s.size() - 2));
    o.kind = Operand::Mem;
    std::string basePart = in, offPart;
    size_t plus = in.find('+');
    if (plus != std::string::npos) {
      basePart = trim(in.substr(0, plus));
      offPart = trim(in.substr(plus + 1));
    }
    if (!offPart.empty()) {
      bool ok;
      o.imm = parseImm(offPart, at, &ok);
      if (!ok)
        fail(at, "bad address offset " + offPart);
    }
    if (!basePart.empty() && basePart[0] == '%') {
      o.reg = regIndex(basePart, at);
    } else {
      auto p = k.paramOffset.find(basePart);
      if (p == k.paramOffset.end())
        fail(at, "address " + basePart + " is not a register or a parameter "
                                         "(global symbols are not implemented)");
      o.reg = -1;
      o.imm += p->second;
    }
    return o;
  }
  if (s[0] == '%') {
    static const std::map<std::string, Special> specials = {
        {"%tid.x", Special::TidX},       {"%tid.y", Special::TidY},
        {"%tid.z", Special::TidZ},       {"%ntid.x", Special::NtidX},
        {"%ntid.y", Special::NtidY},     {"%ntid.z", Special::NtidZ},
        {"%ctaid.x", Special::CtaidX},   {"%ctaid.y", Special::CtaidY},
        {"%ctaid.z", Special::CtaidZ},   {"%nctaid.x", Special::NctaidX},
        {"%nctaid.y", Special::NctaidY}, {"%nctaid.z", Special::NctaidZ},
        {"%laneid", Special::LaneId},    {"%warpid", Special::WarpId}};
    auto sp = specials.find(s);
    if (sp != specials.end()) {
      o.kind = Operand::Spec;
      o.special = sp->second;
      return o;
    }
    if (!regs.count(s))
      fail(at, "unknown register or special register " + s +
                   " (not implemented)");
    o.kind = Operand::Reg;
    o.reg = regs[s];
    return o;
  }
  if (regs.count(s)) { // a register of a nested scope ("tmp")
    o.kind = Operand::Reg;
    o.reg = regs[s];
    return o;
  }
  bool ok;
  uint64_t v = parseImm(s, at, &ok);
  if (ok) {
    o.kind = Operand::Imm;
    o.imm = v;
    return o;
  }
  if (auto g = globals.find(s); g != globals.end()) {
    o.kind = Operand::Imm; // the array's address
    o.imm = g->second;
    return o;
  }
  if (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '$' ||
      s[0] == '_') {
    o.kind = Operand::Label;
    o.label = s;
    return o;
  }
  fail(at, "operand " + s + " is not understood");
}

std::vector<std::string> Parser::splitOperands(const std::string &s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '{' || c == '[')
      ++depth;
    if (c == '}' || c == ']')
      --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!trim(cur).empty())
    out.push_back(cur);
  return out;
}

} // namespace flashopt::ptxemu
