//===- PtxParser.cpp - PTX module parsing -----------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The module parser of the PTX interpreter: directives, declarations,
/// instructions (decoded by PtxOpcodes.cpp), labels and reconvergence
/// points, into the kernels of PtxInternal.h; Module and Kernel of
/// PtxEmulator.h.
///
//===----------------------------------------------------------------------===//

#include "PtxParser.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace flashopt::ptxemu {

using namespace detail;

Kernel::Kernel(std::unique_ptr<KernelImpl> impl) : impl_(std::move(impl)) {}
Kernel::~Kernel() = default;
const std::string &Kernel::name() const { return impl_->name; }
size_t Kernel::param_bytes() const { return impl_->paramBytes; }
const std::vector<std::pair<size_t, size_t>> &Kernel::params() const {
  return impl_->params;
}
size_t Kernel::instruction_count() const { return impl_->code.size(); }
Module::~Module() = default;

const Kernel *Module::kernel(const std::string &name) const {
  for (const auto &k : kernels_)
    if (k->name() == name)
      return k.get();
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Module parsing
//===----------------------------------------------------------------------===//

void Parser::parseGlobalArray(int at) {
  std::string w = word();
  size_t align = 1;
  if (w == ".align") {
    align = size_t(std::stoul(word()));
    w = word();
  }
  if (w != ".b8")
    fail(at, ".global data of type " + w + " is not implemented (only .b8 arrays)");
  std::string name = word();
  if (name.empty() || !accept('['))
    fail(at, ".global data must be an array");
  size_t size = size_t(std::stoul(until(']')));
  if (!accept('='))
    fail(at, "uninitialized .global data is not implemented");
  expect('{');
  std::vector<uint8_t> bytes;
  bytes.reserve(size + align);
  for (std::string v : splitOperands(until('}'))) {
    bool ok;
    uint64_t b = parseImm(trim(v), at, &ok);
    if (!ok || b > 255)
      fail(at, "bad byte " + trim(v) + " in .global " + name);
    bytes.push_back(uint8_t(b));
  }
  expect(';');
  if (bytes.size() != size)
    fail(at, ".global " + name + ": " + std::to_string(bytes.size()) +
                 " initializers for " + std::to_string(size) + " bytes");
  // Over-allocate so that the array can start at its alignment.
  std::vector<uint8_t> store(size + align);
  uintptr_t p = reinterpret_cast<uintptr_t>(store.data());
  size_t skip = (align - p % align) % align;
  std::memcpy(store.data() + skip, bytes.data(), size);
  data->store.push_back(std::move(store));
  uint64_t addr =
      uint64_t(reinterpret_cast<uintptr_t>(data->store.back().data() + skip));
  data->ranges.push_back({addr, uint64_t(size)});
  globals[name] = addr;
}

Parser::Parser(const std::string &text) {
  src.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n')
        ++i;
      if (i < text.size())
        src += '\n';
    } else if (text[i] == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      i += 2;
      while (i + 1 < text.size() && !(text[i] == '*' && text[i + 1] == '/')) {
        if (text[i] == '\n')
          src += '\n';
        ++i;
      }
      ++i;
    } else {
      src += text[i];
    }
  }
}

std::unique_ptr<Module>
Parser::parseModule(Module *m, std::string *target,
                    std::vector<std::unique_ptr<KernelImpl>> *out) {
  while (!eof()) {
    int at = line;
    std::string w = word();
    if (w == ".version" || w == ".address_size") {
      std::string v = word();
      if (w == ".address_size" && v != "64")
        fail(at, ".address_size " + v + " is not implemented");
    } else if (w == ".target") {
      *target = until('\n');
      ++line;
    } else if (w == ".global") {
      parseGlobalArray(at);
    } else if (w == ".visible" || w == ".entry") {
      std::string next = w == ".visible" ? word() : ".entry";
      if (next == ".global") {
        // Initialized module data (the kernel ABI description): kept as
        // text, never read by a kernel here.
        until(';');
      } else if (next != ".entry") {
        fail(at, "only .entry functions and .global data are implemented");
      } else {
        out->push_back(parseEntry());
      }
    } else if (w.empty()) {
      fail(at, std::string("unexpected character '") + src[pos] + "'");
    } else {
      fail(at, "module directive " + w + " is not implemented");
    }
  }
  (void)m;
  return nullptr;
}

std::unique_ptr<KernelImpl> Parser::parseEntry() {
  auto k = std::make_unique<KernelImpl>();
  k->constData = data;
  k->name = word();
  expect('(');
  if (!accept(')')) {
    do {
      int at = line;
      if (word() != ".param")
        fail(at, "expected .param");
      std::string ty = word();
      size_t align = 0;
      if (ty == ".align") {
        align = size_t(std::stoul(word()));
        ty = word();
      }
      auto tn = typeNames().find(ty.empty() ? ty : ty.substr(1));
      if (tn == typeNames().end() || tn->second == T::Pred)
        fail(at, "parameter type " + ty + " is not implemented");
      size_t sz = size_t(bitsOf(tn->second) / 8);
      std::string name = word();
      size_t count = 1;
      if (accept('[')) {
        count = size_t(std::stoul(until(']')));
      }
      if (!align)
        align = sz;
      size_t off = (k->paramBytes + align - 1) / align * align;
      k->params.push_back({off, sz * count});
      k->paramOffset[name] = off;
      k->paramBytes = off + sz * count;
    } while (accept(','));
    expect(')');
  }
  // Performance directives up to the body.
  while (true) {
    skipSpace();
    if (accept('{'))
      break;
    int at = line;
    std::string d = word();
    if (d == ".maxntid" || d == ".reqntid" || d == ".minnctapersm" ||
        d == ".maxnreg" || d == ".maxnctapersm") {
      std::vector<unsigned> v;
      do {
        v.push_back(unsigned(std::stoul(word())));
      } while (accept(','));
      if (d == ".maxntid" || d == ".reqntid") {
        v.resize(3, 1);
        for (int i = 0; i < 3; ++i)
          k->ntidLimit[i] = v[size_t(i)];
        k->ntidExact = d == ".reqntid";
      }
    } else {
      fail(at, "entry directive " + (d.empty() ? std::string(1, src[pos]) : d) +
                   " is not implemented");
    }
  }
  parseBody(*k);
  return k;
}

void Parser::bindReg(KernelImpl &k, const std::string &name, int bits) {
  if (!scopes.empty()) {
    auto old = regs.find(name);
    scopes.back().push_back({name, old == regs.end() ? -1 : old->second});
  }
  regs[name] = k.numRegs++;
  k.regMask.push_back(maskOf(bits));
}

void Parser::declareRegs(KernelImpl &k, const std::string &stmt, int at) {
  // ".reg .b32 %r<205>" or ".reg .f32 %f1, %f2"
  std::istringstream is(stmt);
  std::string dot, ty;
  is >> dot >> ty;
  auto tn = typeNames().find(ty.size() > 1 ? ty.substr(1) : ty);
  if (tn == typeNames().end())
    fail(at, "register type " + ty + " is not implemented");
  int bits = bitsOf(tn->second);
  std::string rest;
  std::getline(is, rest);
  for (std::string item : split(rest, ',')) {
    item.erase(std::remove_if(item.begin(), item.end(),
                              [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
               item.end());
    size_t lt = item.find('<');
    if (lt != std::string::npos) {
      std::string prefix = item.substr(0, lt);
      int n = std::stoi(item.substr(lt + 1));
      for (int i = 0; i < n; ++i)
        bindReg(k, prefix + std::to_string(i), bits);
    } else if (!item.empty()) {
      bindReg(k, item, bits);
    }
  }
}

int Parser::regIndex(const std::string &name, int at) {
  auto it = regs.find(name);
  if (it == regs.end())
    fail(at, "unknown register " + name);
  return it->second;
}

void Parser::parseInstruction(KernelImpl &k, std::string stmt, int at) {
  Inst I;
  I.line = at;
  stmt = trim(stmt);
  if (!stmt.empty() && stmt[0] == '@') {
    size_t sp = stmt.find_first_of(" \t");
    if (sp == std::string::npos)
      fail(at, "bad guard");
    std::string g = stmt.substr(1, sp - 1);
    if (!g.empty() && g[0] == '!') {
      I.guardNeg = true;
      g = g.substr(1);
    }
    I.guard = regIndex(g, at);
    stmt = trim(stmt.substr(sp));
  }
  size_t sp = stmt.find_first_of(" \t");
  std::string opc = sp == std::string::npos ? stmt : stmt.substr(0, sp);
  std::string rest = sp == std::string::npos ? "" : stmt.substr(sp);
  I.opcode = opc;
  try {
    decodeOpcode(opc, I);
  } catch (const ParseError &) {
    throw;
  } catch (const std::exception &e) {
    fail(at, opc + ": " + e.what());
  }
  opcodes.insert(opc);
  std::vector<std::string> ops = splitOperands(rest);
  if (ops.size() > 5)
    fail(at, opc + ": too many operands");
  for (const std::string &s : ops)
    I.o[I.nops++] = parseOperand(k, s, at);
  checkOperands(I);
  k.code.push_back(I);
}

void Parser::parseBody(KernelImpl &k) {
  regs.clear();
  labels.clear();
  scopes.clear();
  while (true) {
    skipSpace();
    if (pos >= src.size())
      fail(line, "missing '}' at the end of " + k.name);
    int at = line;
    if (accept('}')) {
      if (scopes.empty())
        break;
      // Leaving a nested scope: its register names go out of scope.
      for (auto it = scopes.back().rbegin(); it != scopes.back().rend(); ++it) {
        if (it->second < 0)
          regs.erase(it->first);
        else
          regs[it->first] = it->second;
      }
      scopes.pop_back();
      continue;
    }
    if (accept('{')) {
      scopes.emplace_back();
      continue;
    }
    // A label?
    size_t save = pos;
    int saveLine = line;
    std::string w = word();
    if (!w.empty() && w[0] != '.' && w[0] != '%' && w[0] != '@' &&
        accept(':')) {
      if (labels.count(w))
        fail(at, "label " + w + " defined twice");
      labels[w] = int(k.code.size());
      continue;
    }
    pos = save;
    line = saveLine;
    std::string stmt = until(';');
    std::string head = trim(stmt);
    if (head.rfind(".reg", 0) == 0) {
      declareRegs(k, head, at);
    } else if (!head.empty() && head[0] == '.') {
      fail(at, "directive " + head.substr(0, head.find_first_of(" \t")) +
                   " in a function body is not implemented (.local, "
                   ".shared, ... have no model)");
    } else {
      parseInstruction(k, head, at);
    }
  }
  for (Inst &I : k.code)
    if (I.op == Op::Bra) {
      auto it = labels.find(I.o[0].label);
      if (it == labels.end())
        fail(I.line, "unknown label " + I.o[0].label);
      I.o[0].target = it->second;
    }
  if (k.code.empty() || (k.code.back().op != Op::Ret &&
                         k.code.back().op != Op::Bra))
    fail(line, k.name + " does not end in ret or bra");
  computeReconvergence(k);
}


std::unique_ptr<Module> Module::parse(const std::string &text,
                                      std::string *error) {
  std::unique_ptr<Module> m(new Module());
  try {
    Parser p(text);
    std::vector<std::unique_ptr<KernelImpl>> ks;
    p.parseModule(m.get(), &m->target_, &ks);
    for (auto &k : ks)
      m->kernels_.push_back(std::unique_ptr<Kernel>(new Kernel(std::move(k))));
    m->opcodes_.assign(p.opcodes.begin(), p.opcodes.end());
    while (!m->target_.empty() && std::isspace(static_cast<unsigned char>(m->target_.back())))
      m->target_.pop_back();
  } catch (const std::exception &e) {
    if (error)
      *error = std::string("PTX ") + e.what();
    return nullptr;
  }
  if (m->kernels_.empty()) {
    if (error)
      *error = "PTX: no .entry in the module";
    return nullptr;
  }
  return m;
}

} // namespace flashopt::ptxemu
