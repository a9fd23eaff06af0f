//===- PtxEmulator.cpp - A functional PTX interpreter ----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Parser, decoder and SIMT executor of PtxEmulator.h. The semantics of
/// every instruction follow the PTX ISA (chapter "Instructions"); where the
/// ISA says a result is "canonical NaN" the NVIDIA encodings are used
/// (0x7FFFFFFF for f32, 0x7FFF for f16 and bf16). Compiled with
/// -ffp-contract=off -frounding-math: host float arithmetic is IEEE and
/// honours fesetround for the directed rounding modes.
///
//===----------------------------------------------------------------------===//

#include "ptx-emulator/PtxEmulator.h"

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

namespace {

//===----------------------------------------------------------------------===//
// Types, modifiers, decoded instructions
//===----------------------------------------------------------------------===//

enum class T : uint8_t {
  None, B8, B16, B32, B64, U8, U16, U32, U64, S8, S16, S32, S64,
  F16, F32, F64, BF16, F16X2, BF16X2, F32X2, Pred
};

int bitsOf(T t) {
  switch (t) {
  case T::B8: case T::U8: case T::S8: return 8;
  case T::B16: case T::U16: case T::S16: case T::F16: case T::BF16: return 16;
  case T::B32: case T::U32: case T::S32: case T::F32: case T::F16X2:
  case T::BF16X2: return 32;
  case T::B64: case T::U64: case T::S64: case T::F64: case T::F32X2: return 64;
  case T::Pred: return 1;
  default: return 0;
  }
}
bool isSigned(T t) { return t == T::S8 || t == T::S16 || t == T::S32 || t == T::S64; }
bool isInt(T t) {
  switch (t) {
  case T::B8: case T::B16: case T::B32: case T::B64: case T::U8: case T::U16:
  case T::U32: case T::U64: case T::S8: case T::S16: case T::S32: case T::S64:
    return true;
  default: return false;
  }
}
bool isBits(T t) { return t == T::B8 || t == T::B16 || t == T::B32 || t == T::B64; }
bool isScalarFloat(T t) { return t == T::F16 || t == T::F32 || t == T::F64 || t == T::BF16; }

const std::map<std::string, T> &typeNames() {
  static const std::map<std::string, T> m = {
      {"b8", T::B8},     {"b16", T::B16},     {"b32", T::B32},
      {"b64", T::B64},   {"u8", T::U8},       {"u16", T::U16},
      {"u32", T::U32},   {"u64", T::U64},     {"s8", T::S8},
      {"s16", T::S16},   {"s32", T::S32},     {"s64", T::S64},
      {"f16", T::F16},   {"f32", T::F32},     {"f64", T::F64},
      {"bf16", T::BF16}, {"f16x2", T::F16X2}, {"bf16x2", T::BF16X2},
      {"f32x2", T::F32X2}, {"pred", T::Pred}};
  return m;
}

uint64_t maskOf(int bits) { return bits >= 64 ? ~0ull : ((1ull << bits) - 1); }

enum class Rnd : uint8_t { None, RN, RZ, RM, RP, RNI, RZI, RMI, RPI };
enum class Cmp : uint8_t {
  None, EQ, NE, LT, LE, GT, GE, LO, LS, HI, HS, EQU, NEU, LTU, LEU, GTU, GEU,
  NUM, NAN_
};
enum class Space : uint8_t { None, Global, Param };
enum class ShflMode : uint8_t { None, Up, Down, Bfly, Idx };

enum class Op : uint8_t {
  Mov, Ld, St, Add, Sub, MulLo, MulHi, MulWide, MadLo, MadWide, MinI, MaxI,
  NegI, AbsI, And, Or, Xor, Not, Shl, Shr, Bfe, Bfi, Prmt, Selp, SetpI, SetpF,
  AddF, SubF, MulF, DivF, SqrtF, RcpF, FmaF, AbsF, NegF, MinF, MaxF, CopysignF, Cvt,
  Shfl, Bra, Ret
};

enum class Special : uint8_t {
  TidX, TidY, TidZ, NtidX, NtidY, NtidZ, CtaidX, CtaidY, CtaidZ, NctaidX,
  NctaidY, NctaidZ, LaneId, WarpId
};

struct Operand {
  enum Kind : uint8_t { None, Reg, Imm, Vec, Mem, Label, Spec, Sink } kind = None;
  int32_t reg = -1;    ///< Reg; Mem: base register (-1: param symbol)
  uint64_t imm = 0;    ///< Imm; Mem: offset (+ the symbol's offset)
  uint8_t nvec = 0;    ///< Vec
  /// Vec elements: a register, -1 = sink "_", -2 = the immediate vimm[i]
  /// (a source only: `st.v2.b32 [a], {0, 0}`).
  int32_t vec[4] = {-1, -1, -1, -1};
  uint64_t vimm[4] = {0, 0, 0, 0};
  Special special = Special::TidX;
  int32_t target = -1; ///< Label: instruction index
  std::string label;   ///< Label name until resolved
};

struct Inst {
  Op op = Op::Mov;
  T t = T::None, t2 = T::None;
  Rnd rnd = Rnd::None;
  Cmp cmp = Cmp::None;
  Space space = Space::None;
  ShflMode mode = ShflMode::None;
  bool ftz = false, sat = false, nanMode = false, uni = false;
  uint8_t vec = 1;
  int32_t guard = -1;
  bool guardNeg = false;
  uint8_t nops = 0;
  Operand o[5];
  int line = 0;
  std::string opcode;
  int32_t reconverge = -1; ///< branches: the immediate post-dominator's pc
};

struct ParseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(int line, const std::string &what) {
  throw ParseError("line " + std::to_string(line) + ": " + what);
}

} // namespace

struct KernelImpl {
  std::string name;
  std::vector<std::pair<size_t, size_t>> params;
  std::map<std::string, size_t> paramOffset;
  size_t paramBytes = 0;
  std::vector<Inst> code;
  std::vector<uint64_t> regMask; ///< per register: value mask of its width
  int numRegs = 0;
  unsigned ntidLimit[3] = {0, 0, 0}; ///< .maxntid / .reqntid (0: none)
  bool ntidExact = false;            ///< .reqntid
  /// The module's initialized .global arrays (shared by its kernels; their
  /// host addresses are the symbols' values): readable, never writable.
  std::shared_ptr<const struct ConstData> constData;
};

struct ConstData {
  std::deque<std::vector<uint8_t>> store;
  std::vector<std::pair<uint64_t, uint64_t>> ranges; ///< [address, bytes)
};

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

namespace {

//===----------------------------------------------------------------------===//
// Opcode decoding
//===----------------------------------------------------------------------===//

std::vector<std::string> split(const std::string &s, char c) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == c) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

/// Decodes the opcode `text` into `I` (everything but operands). Throws a
/// message (without line) for anything not implemented.
void decodeOpcode(const std::string &text, Inst &I) {
  std::vector<std::string> parts = split(text, '.');
  const std::string base = parts[0];
  std::vector<T> types;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string &p = parts[i];
    auto ty = typeNames().find(p);
    if (ty != typeNames().end()) {
      types.push_back(ty->second);
      continue;
    }
    static const std::map<std::string, Rnd> rnds = {
        {"rn", Rnd::RN},   {"rz", Rnd::RZ},   {"rm", Rnd::RM},
        {"rp", Rnd::RP},   {"rni", Rnd::RNI}, {"rzi", Rnd::RZI},
        {"rmi", Rnd::RMI}, {"rpi", Rnd::RPI}};
    static const std::map<std::string, Cmp> cmps = {
        {"eq", Cmp::EQ},   {"ne", Cmp::NE},   {"lt", Cmp::LT},
        {"le", Cmp::LE},   {"gt", Cmp::GT},   {"ge", Cmp::GE},
        {"lo", Cmp::LO},   {"ls", Cmp::LS},   {"hi", Cmp::HI},
        {"hs", Cmp::HS},   {"equ", Cmp::EQU}, {"neu", Cmp::NEU},
        {"ltu", Cmp::LTU}, {"leu", Cmp::LEU}, {"gtu", Cmp::GTU},
        {"geu", Cmp::GEU}, {"num", Cmp::NUM}, {"nan", Cmp::NAN_}};
    if (rnds.count(p) && I.rnd == Rnd::None && base != "setp") {
      I.rnd = rnds.at(p);
    } else if (base == "setp" && cmps.count(p) && I.cmp == Cmp::None) {
      I.cmp = cmps.at(p);
    } else if (p == "ftz") {
      I.ftz = true;
    } else if (p == "sat") {
      I.sat = true;
    } else if (p == "NaN") {
      I.nanMode = true;
    } else if (p == "uni" && base == "bra") {
      I.uni = true;
    } else if (p == "global" && (base == "ld" || base == "st")) {
      I.space = Space::Global;
    } else if (p == "nc" && base == "ld" && I.space == Space::Global) {
      // Non-coherent (read-only cache) load: the same value here.
    } else if (p == "param" && base == "ld") {
      I.space = Space::Param;
    } else if ((p == "v2" || p == "v4") && (base == "ld" || base == "st")) {
      I.vec = uint8_t(p[1] - '0');
    } else if (base == "shfl" && p == "sync" && i == 1) {
      // required
    } else if (base == "shfl" && (p == "up" || p == "down" || p == "bfly" ||
                                  p == "idx")) {
      I.mode = p == "up"     ? ShflMode::Up
               : p == "down" ? ShflMode::Down
               : p == "bfly" ? ShflMode::Bfly
                             : ShflMode::Idx;
    } else if ((base == "mul" || base == "mad") &&
               (p == "lo" || p == "hi" || p == "wide")) {
      I.op = p == "lo" ? (base == "mul" ? Op::MulLo : Op::MadLo)
             : p == "hi" ? Op::MulHi
                         : (base == "mul" ? Op::MulWide : Op::MadWide);
      if (base == "mad" && p == "hi")
        throw std::runtime_error("mad.hi is not implemented");
      I.uni = true; // marks "integer form chosen"
    } else {
      throw std::runtime_error("modifier ." + p + " of " + base +
                               " is not implemented");
    }
  }
  auto need = [&](size_t n) {
    if (types.size() != n)
      throw std::runtime_error(base + " takes " + std::to_string(n) +
                               " type(s) here");
  };
  auto noRound = [&] {
    if (I.rnd != Rnd::None)
      throw std::runtime_error("rounding modifier not allowed on " + base);
  };
  auto noFlags = [&] {
    if (I.ftz || I.sat || I.nanMode)
      throw std::runtime_error(".ftz/.sat/.NaN not implemented on " + base);
  };
  auto intOnly = [&] {
    if (!isInt(I.t))
      throw std::runtime_error(base + " with this type is not implemented");
  };
  const bool intForm = I.uni && base != "bra";
  if (base != "bra")
    I.uni = false;

  if (base == "mov") {
    need(1);
    I.op = Op::Mov;
    I.t = types[0];
    noRound();
    noFlags();
  } else if (base == "ld" || base == "st") {
    need(1);
    I.op = base == "ld" ? Op::Ld : Op::St;
    I.t = types[0];
    noRound();
    noFlags();
    if (I.space == Space::None)
      throw std::runtime_error(base + " without a state space (generic "
                                      "addressing) is not implemented");
    if (I.space == Space::Param && I.vec != 1)
      throw std::runtime_error("vector ld.param is not implemented");
    if (I.t == T::Pred || I.t == T::F32X2 || I.t == T::F16X2 ||
        I.t == T::BF16X2)
      throw std::runtime_error(base + " of this type is not implemented");
  } else if (base == "add" || base == "sub" || base == "mul" ||
             base == "mad" || base == "fma" || base == "div") {
    need(1);
    I.t = types[0];
    bool fl = I.t == T::F32 || I.t == T::F32X2 || I.t == T::F64;
    if (I.t == T::BF16 || I.t == T::BF16X2) {
      // add/sub/mul/fma{.rn}.bf16{x2}: one rounding to bf16 (what NVPTX
      // makes of fptrunc(fadd(fpext a, fpext b)) on sm_80+).
      if (base == "mad" || base == "div" || intForm)
        throw std::runtime_error(base + " with this type is not implemented");
      if (I.rnd != Rnd::RN && I.rnd != Rnd::None)
        throw std::runtime_error(base + ".bf16 takes only .rn");
      if (I.ftz || I.sat || I.nanMode)
        throw std::runtime_error(".ftz/.sat/.NaN on " + base + ".bf16 is "
                                 "not implemented");
      I.rnd = Rnd::RN;
      I.op = base == "add"   ? Op::AddF
             : base == "sub" ? Op::SubF
             : base == "mul" ? Op::MulF
                             : Op::FmaF;
    } else if (fl) {
      if (intForm)
        throw std::runtime_error(base + ".lo/hi/wide on a float type");
      if (base == "mad")
        throw std::runtime_error("mad.f32 is not implemented (use fma)");
      if (I.rnd != Rnd::RN && I.rnd != Rnd::RZ && I.rnd != Rnd::RM &&
          I.rnd != Rnd::RP)
        throw std::runtime_error(
            base + " without an IEEE rounding modifier (.rn/.rz/.rm/.rp) is "
                   "not implemented (approximate or contractible forms are "
                   "not modelled)");
      if (I.sat)
        throw std::runtime_error(".sat on float " + base +
                                 " is not implemented");
      if (I.nanMode)
        throw std::runtime_error(".NaN on " + base);
      if (I.t == T::F32X2 && I.ftz)
        throw std::runtime_error(".ftz on f32x2 is not implemented");
      if (I.t == T::F64 && I.ftz)
        throw std::runtime_error(".ftz on f64");
      if (base == "div" && I.t == T::F32X2)
        throw std::runtime_error("div.f32x2");
      I.op = base == "add"   ? Op::AddF
             : base == "sub" ? Op::SubF
             : base == "mul" ? Op::MulF
             : base == "fma" ? Op::FmaF
                             : Op::DivF;
    } else {
      intOnly();
      noRound();
      if (I.ftz || I.nanMode)
        throw std::runtime_error(".ftz/.NaN on an integer " + base);
      if (base == "fma" || base == "div")
        throw std::runtime_error("integer " + base + " is not implemented");
      if (I.sat && !(I.t == T::S32 && (base == "add" || base == "sub")))
        throw std::runtime_error(".sat on " + base + " is not implemented");
      if (base == "add")
        I.op = Op::Add;
      else if (base == "sub")
        I.op = Op::Sub;
      else if (!intForm)
        throw std::runtime_error("integer " + base + " needs .lo/.hi/.wide");
      if ((I.op == Op::MulWide || I.op == Op::MadWide) && bitsOf(I.t) == 64)
        throw std::runtime_error(base + ".wide of a 64-bit type");
      if (isBits(I.t) && base != "add" && base != "sub")
        throw std::runtime_error(base + " takes .u/.s types");
    }
  } else if (base == "rcp") {
    // rcp.rn/rz/rm/rp: the IEEE reciprocal, 1 / a in the given rounding.
    need(1);
    I.t = types[0];
    if (I.t != T::F32 && I.t != T::F64)
      throw std::runtime_error("rcp of this type is not implemented");
    if (I.rnd != Rnd::RN && I.rnd != Rnd::RZ && I.rnd != Rnd::RM &&
        I.rnd != Rnd::RP)
      throw std::runtime_error("rcp without an IEEE rounding modifier "
                               "(rcp.approx) is not modelled");
    if (I.sat || I.nanMode)
      throw std::runtime_error(".sat/.NaN on rcp");
    I.op = Op::RcpF;
  } else if (base == "sqrt") {
    need(1);
    I.t = types[0];
    if (I.t != T::F32 && I.t != T::F64)
      throw std::runtime_error("sqrt of this type is not implemented");
    if (I.rnd != Rnd::RN && I.rnd != Rnd::RZ && I.rnd != Rnd::RM &&
        I.rnd != Rnd::RP)
      throw std::runtime_error("sqrt without an IEEE rounding modifier "
                               "(sqrt.approx) is not modelled");
    if (I.sat || I.nanMode)
      throw std::runtime_error(".sat/.NaN on sqrt");
    I.op = Op::SqrtF;
  } else if (base == "abs" || base == "neg") {
    need(1);
    I.t = types[0];
    noRound();
    if (I.sat || I.nanMode)
      throw std::runtime_error(".sat/.NaN on " + base);
    if (isInt(I.t)) {
      if (!isSigned(I.t) || I.ftz)
        throw std::runtime_error(base + " takes .s types");
      I.op = base == "abs" ? Op::AbsI : Op::NegI;
    } else if (I.t == T::F32 || I.t == T::F16 || I.t == T::BF16 ||
               I.t == T::F16X2 || I.t == T::BF16X2 || I.t == T::F64) {
      if (I.ftz && I.t != T::F32)
        throw std::runtime_error(".ftz " + base + " only on f32 is "
                                                  "implemented");
      I.op = base == "abs" ? Op::AbsF : Op::NegF;
    } else {
      throw std::runtime_error(base + " of this type is not implemented");
    }
  } else if (base == "min" || base == "max") {
    need(1);
    I.t = types[0];
    noRound();
    if (isInt(I.t)) {
      if (I.ftz || I.nanMode || I.sat || isBits(I.t))
        throw std::runtime_error(base + " of this form is not implemented");
      I.op = base == "min" ? Op::MinI : Op::MaxI;
    } else if (I.t == T::F32) {
      if (I.sat)
        throw std::runtime_error(".sat on " + base);
      I.op = base == "min" ? Op::MinF : Op::MaxF;
    } else {
      throw std::runtime_error(base + " of this type is not implemented");
    }
  } else if (base == "copysign") {
    need(1);
    I.t = types[0];
    noRound();
    noFlags();
    if (I.t != T::F32 && I.t != T::F64)
      throw std::runtime_error("copysign of this type");
    I.op = Op::CopysignF;
  } else if (base == "and" || base == "or" || base == "xor" ||
             base == "not") {
    need(1);
    I.t = types[0];
    noRound();
    noFlags();
    if (!isBits(I.t) && I.t != T::Pred)
      throw std::runtime_error(base + " takes .b or .pred types");
    I.op = base == "and"  ? Op::And
           : base == "or" ? Op::Or
           : base == "xor" ? Op::Xor
                           : Op::Not;
  } else if (base == "shl" || base == "shr") {
    need(1);
    I.t = types[0];
    noRound();
    noFlags();
    intOnly();
    if (base == "shl" && !isBits(I.t))
      throw std::runtime_error("shl takes .b types");
    I.op = base == "shl" ? Op::Shl : Op::Shr;
  } else if (base == "bfe" || base == "bfi" || base == "prmt") {
    need(1);
    I.t = types[0];
    noRound();
    noFlags();
    if (base == "bfe" && !(I.t == T::U32 || I.t == T::S32 || I.t == T::U64 ||
                           I.t == T::S64))
      throw std::runtime_error("bfe takes .u32/.s32/.u64/.s64");
    if (base == "bfi" && !(I.t == T::B32 || I.t == T::B64))
      throw std::runtime_error("bfi takes .b32/.b64");
    if (base == "prmt" && I.t != T::B32)
      throw std::runtime_error("prmt takes .b32 (no modes implemented)");
    I.op = base == "bfe" ? Op::Bfe : base == "bfi" ? Op::Bfi : Op::Prmt;
  } else if (base == "selp") {
    need(1);
    I.t = types[0];
    noRound();
    noFlags();
    if (I.t == T::Pred)
      throw std::runtime_error("selp.pred");
    I.op = Op::Selp;
  } else if (base == "setp") {
    need(1);
    I.t = types[0];
    if (I.cmp == Cmp::None)
      throw std::runtime_error("setp without a comparison");
    if (I.sat || I.nanMode || I.rnd != Rnd::None)
      throw std::runtime_error("modifier not allowed on setp");
    if (isInt(I.t)) {
      if (I.ftz)
        throw std::runtime_error(".ftz on integer setp");
      bool unsignedOnly = I.cmp == Cmp::LO || I.cmp == Cmp::LS ||
                          I.cmp == Cmp::HI || I.cmp == Cmp::HS;
      bool eqne = I.cmp == Cmp::EQ || I.cmp == Cmp::NE;
      bool ordered = I.cmp >= Cmp::EQ && I.cmp <= Cmp::GE;
      if (isBits(I.t) && !eqne)
        throw std::runtime_error("setp on .b types takes eq/ne only");
      if (!ordered && !unsignedOnly)
        throw std::runtime_error("unordered comparison on integers");
      if (unsignedOnly && isSigned(I.t))
        throw std::runtime_error("lo/ls/hi/hs on signed integers");
      I.op = Op::SetpI;
    } else if (I.t == T::F32 || I.t == T::F64 || I.t == T::F16 ||
               I.t == T::BF16) {
      bool intCmp = I.cmp >= Cmp::LO && I.cmp <= Cmp::HS;
      if (intCmp)
        throw std::runtime_error("lo/ls/hi/hs on floats");
      if (I.ftz && I.t != T::F32)
        throw std::runtime_error(".ftz setp only on f32 is implemented");
      I.op = Op::SetpF;
    } else {
      throw std::runtime_error("setp of this type is not implemented");
    }
  } else if (base == "cvt") {
    need(2);
    I.op = Op::Cvt;
    I.t = types[0];
    I.t2 = types[1];
    if (I.nanMode)
      throw std::runtime_error(".NaN on cvt");
    const T d = I.t, s = I.t2;
    const bool dI = isInt(d), sI = isInt(s);
    const bool dF = isScalarFloat(d), sF = isScalarFloat(s);
    const bool intRnd = I.rnd == Rnd::RNI || I.rnd == Rnd::RZI ||
                        I.rnd == Rnd::RMI || I.rnd == Rnd::RPI;
    const bool fpRnd = I.rnd == Rnd::RN || I.rnd == Rnd::RZ ||
                       I.rnd == Rnd::RM || I.rnd == Rnd::RP;
    if (dI && sI) {
      if (I.rnd != Rnd::None || I.ftz)
        throw std::runtime_error("rounding/.ftz on an integer cvt");
    } else if (dI && sF) {
      if (!intRnd)
        throw std::runtime_error("float-to-integer cvt needs .rni/.rzi/.rmi/"
                                 ".rpi");
      if (I.ftz && s != T::F32)
        throw std::runtime_error(".ftz on this cvt");
    } else if (dF && sI) {
      if (!fpRnd)
        throw std::runtime_error("integer-to-float cvt needs .rn/.rz/.rm/.rp");
      if (I.ftz)
        throw std::runtime_error(".ftz on an integer-to-float cvt");
      if ((d == T::F16 || d == T::BF16) && I.rnd != Rnd::RN &&
          I.rnd != Rnd::RZ)
        throw std::runtime_error("integer to f16/bf16 with .rm/.rp is not "
                                 "implemented");
    } else if (dF && sF) {
      if (d == s) {
        if (!intRnd || d != T::F32)
          throw std::runtime_error("cvt.f32.f32 takes .rni/.rzi/.rmi/.rpi "
                                   "(only f32 implemented)");
      } else if (bitsOf(d) > bitsOf(s) ||
                 (d == T::F32 && (s == T::F16 || s == T::BF16))) {
        if (I.rnd != Rnd::None)
          throw std::runtime_error("rounding modifier on a widening cvt");
        if (I.ftz && s != T::F32)
          throw std::runtime_error(".ftz on this widening cvt");
      } else {
        if (!fpRnd)
          throw std::runtime_error("narrowing float cvt needs .rn/.rz/.rm/.rp");
        if (s != T::F32 && s != T::F64)
          throw std::runtime_error("this float cvt is not implemented");
        if (s == T::F64 && d != T::F32)
          throw std::runtime_error("f64 to 16-bit cvt is not implemented");
        if (d != T::F32 && I.rnd != Rnd::RN && I.rnd != Rnd::RZ)
          throw std::runtime_error("cvt to f16/bf16 with .rm/.rp is not "
                                   "implemented");
      }
    } else if ((d == T::F16X2 || d == T::BF16X2) && s == T::F32) {
      if (I.rnd != Rnd::RN && I.rnd != Rnd::RZ)
        throw std::runtime_error("packed cvt takes .rn/.rz here");
      if (I.ftz)
        throw std::runtime_error(".ftz on a packed cvt");
    } else {
      throw std::runtime_error("this cvt is not implemented");
    }
    if (I.sat && !(dI && (sI || sF)) && !(dF && d == T::F32))
      throw std::runtime_error(".sat on this cvt is not implemented");
  } else if (base == "shfl") {
    need(1);
    I.t = types[0];
    if (parts.size() < 2 || parts[1] != "sync")
      throw std::runtime_error("shfl without .sync is not implemented");
    if (I.mode == ShflMode::None)
      throw std::runtime_error("shfl.sync needs a mode");
    if (I.t != T::B32)
      throw std::runtime_error("shfl.sync takes .b32");
    noRound();
    noFlags();
    I.op = Op::Shfl;
  } else if (base == "bra") {
    need(0);
    noRound();
    noFlags();
    I.op = Op::Bra;
  } else if (base == "ret") {
    need(0);
    noRound();
    noFlags();
    I.op = Op::Ret;
  } else {
    throw std::runtime_error("instruction " + base + " is not implemented");
  }
}

//===----------------------------------------------------------------------===//
// Module parsing
//===----------------------------------------------------------------------===//

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
  void parseGlobalArray(int at) {
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

  explicit Parser(const std::string &text) {
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

  std::unique_ptr<KernelImpl> parseEntry() {
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

  std::unordered_map<std::string, int> regs;
  std::unordered_map<std::string, int> labels;
  /// Nested `{ }` scopes: the names each declared, with what they shadowed.
  std::vector<std::vector<std::pair<std::string, int>>> scopes;

  void bindReg(KernelImpl &k, const std::string &name, int bits) {
    if (!scopes.empty()) {
      auto old = regs.find(name);
      scopes.back().push_back({name, old == regs.end() ? -1 : old->second});
    }
    regs[name] = k.numRegs++;
    k.regMask.push_back(maskOf(bits));
  }

  void declareRegs(KernelImpl &k, const std::string &stmt, int at) {
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

  int regIndex(const std::string &name, int at) {
    auto it = regs.find(name);
    if (it == regs.end())
      fail(at, "unknown register " + name);
    return it->second;
  }

  static std::string trim(const std::string &s) {
    size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }

  uint64_t parseImm(const std::string &s, int at, bool *ok) {
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

  Operand parseOperand(KernelImpl &k, std::string s, int at) {
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

  /// Splits operands at top-level commas (not inside {} or []).
  static std::vector<std::string> splitOperands(const std::string &s) {
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

  void parseInstruction(KernelImpl &k, std::string stmt, int at) {
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
    checkOperands(k, I);
    k.code.push_back(I);
  }

  /// Operand counts and kinds per instruction.
  void checkOperands(KernelImpl &k, Inst &I) {
    auto bad = [&](const std::string &why) {
      fail(I.line, I.opcode + ": " + why);
    };
    auto isRegOrImm = [](const Operand &o) {
      return o.kind == Operand::Reg || o.kind == Operand::Imm;
    };
    auto count = [&](int n) {
      if (I.nops != n)
        bad("expected " + std::to_string(n) + " operands");
    };
    auto dstReg = [&](int i) {
      if (I.o[i].kind != Operand::Reg)
        bad("operand " + std::to_string(i + 1) + " must be a register");
    };
    auto srcs = [&](int from, int to) {
      for (int i = from; i < to; ++i)
        if (!isRegOrImm(I.o[i]))
          bad("operand " + std::to_string(i + 1) +
              " must be a register or an immediate");
    };
    switch (I.op) {
    case Op::Mov:
      count(2);
      if (I.o[0].kind == Operand::Vec) {
        if (I.o[1].kind != Operand::Reg)
          bad("unpacking needs a register source");
        for (int i = 0; i < I.o[0].nvec; ++i)
          if (I.o[0].vec[i] == -2)
            bad("an immediate in a vector destination");
      } else {
        dstReg(0);
        if (I.o[1].kind == Operand::Vec) {
          for (int i = 0; i < I.o[1].nvec; ++i)
            if (I.o[1].vec[i] == -1)
              bad("sink in a packing source");
        } else if (!isRegOrImm(I.o[1]) && I.o[1].kind != Operand::Spec) {
          bad("source must be a register, immediate, vector or special "
              "register");
        }
      }
      if (I.o[0].kind == Operand::Vec || I.o[1].kind == Operand::Vec) {
        const Operand &v = I.o[0].kind == Operand::Vec ? I.o[0] : I.o[1];
        if (v.nvec != 2 && v.nvec != 4)
          bad("vector of 2 or 4 elements expected");
        if (bitsOf(I.t) / v.nvec < 8)
          bad("vector elements too narrow");
      }
      break;
    case Op::Ld:
      count(2);
      if (I.o[1].kind != Operand::Mem)
        bad("second operand must be an address");
      if (I.space == Space::Param && I.o[1].reg >= 0)
        bad("ld.param through a register address is not implemented");
      if (I.space == Space::Global && I.o[1].reg < 0)
        bad("ld.global from a parameter symbol");
      if (I.vec == 1)
        dstReg(0);
      else if (I.o[0].kind != Operand::Vec || I.o[0].nvec != I.vec)
        bad("vector destination of the load's width expected");
      else
        for (int i = 0; i < I.vec; ++i)
          if (I.o[0].vec[i] == -2)
            bad("an immediate in a vector destination");
      break;
    case Op::St:
      count(2);
      if (I.o[0].kind != Operand::Mem || I.o[0].reg < 0)
        bad("first operand must be a register address");
      if (I.vec == 1)
        srcs(1, 2);
      else if (I.o[1].kind != Operand::Vec || I.o[1].nvec != I.vec)
        bad("vector source of the store's width expected");
      else
        for (int i = 0; i < I.vec; ++i)
          if (I.o[1].vec[i] == -1)
            bad("sink in a store source");
      break;
    case Op::Selp:
      count(4);
      dstReg(0);
      srcs(1, 4);
      break;
    case Op::SetpI:
    case Op::SetpF:
      count(3);
      dstReg(0);
      srcs(1, 3);
      break;
    case Op::MadLo:
    case Op::MadWide:
    case Op::FmaF:
    case Op::Bfe:
    case Op::Prmt:
      count(4);
      dstReg(0);
      srcs(1, 4);
      break;
    case Op::Bfi:
      count(5);
      dstReg(0);
      srcs(1, 5);
      break;
    case Op::NegI:
    case Op::AbsI:
    case Op::Not:
    case Op::SqrtF:
    case Op::RcpF:
    case Op::AbsF:
    case Op::NegF:
      count(2);
      dstReg(0);
      srcs(1, 2);
      break;
    case Op::Cvt:
      if (I.t == T::F16X2 || I.t == T::BF16X2) {
        count(3);
        srcs(1, 3);
      } else {
        count(2);
        srcs(1, 2);
      }
      dstReg(0);
      break;
    case Op::Shfl:
      count(5);
      dstReg(0);
      srcs(1, 5);
      break;
    case Op::Bra:
      count(1);
      if (I.o[0].kind != Operand::Label)
        bad("branch target must be a label");
      break;
    case Op::Ret:
      count(0);
      break;
    default:
      count(3);
      dstReg(0);
      srcs(1, 3);
      break;
    }
    (void)k;
  }

  void parseBody(KernelImpl &k) {
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

  /// Immediate post-dominators of every branch, over basic blocks with a
  /// virtual exit (pc = code size) reached by ret.
  static void computeReconvergence(KernelImpl &k) {
    const int n = int(k.code.size());
    std::vector<int> leader(n + 1, 0);
    leader[0] = 1;
    for (int i = 0; i < n; ++i) {
      const Inst &I = k.code[i];
      if (I.op == Op::Bra) {
        leader[I.o[0].target] = 1;
        if (i + 1 <= n)
          leader[i + 1] = 1;
      } else if (I.op == Op::Ret && i + 1 <= n) {
        leader[i + 1] = 1;
      }
    }
    std::vector<int> blockStart, blockOf(n + 1, -1);
    for (int i = 0; i < n; ++i) {
      if (leader[i])
        blockStart.push_back(i);
      blockOf[i] = int(blockStart.size()) - 1;
    }
    const int nb = int(blockStart.size());
    const int exitB = nb;
    blockOf[n] = exitB;
    std::vector<std::vector<int>> succ(nb);
    for (int b = 0; b < nb; ++b) {
      int last = (b + 1 < nb ? blockStart[b + 1] : n) - 1;
      const Inst &I = k.code[last];
      if (I.op == Op::Bra) {
        succ[b].push_back(blockOf[I.o[0].target]);
        if (I.guard >= 0)
          succ[b].push_back(blockOf[last + 1]);
      } else if (I.op == Op::Ret) {
        succ[b].push_back(exitB);
        if (I.guard >= 0)
          succ[b].push_back(blockOf[last + 1]);
      } else {
        succ[b].push_back(blockOf[last + 1]);
      }
    }
    // pdom sets as bit vectors.
    const int words = (nb + 1 + 63) / 64;
    std::vector<std::vector<uint64_t>> pdom(nb + 1,
                                            std::vector<uint64_t>(words, ~0ull));
    std::fill(pdom[exitB].begin(), pdom[exitB].end(), 0);
    pdom[exitB][exitB / 64] |= 1ull << (exitB % 64);
    bool changed = true;
    while (changed) {
      changed = false;
      for (int b = nb - 1; b >= 0; --b) {
        std::vector<uint64_t> s(words, ~0ull);
        for (int x : succ[b])
          for (int w = 0; w < words; ++w)
            s[w] &= pdom[x][w];
        s[b / 64] |= 1ull << (b % 64);
        if (s != pdom[b]) {
          pdom[b] = s;
          changed = true;
        }
      }
    }
    auto size = [&](int b) {
      int c = 0;
      for (uint64_t w : pdom[b])
        c += __builtin_popcountll(w);
      return c;
    };
    for (int i = 0; i < n; ++i) {
      Inst &I = k.code[i];
      if (I.op != Op::Bra && I.op != Op::Ret)
        continue;
      int b = blockOf[i];
      int want = size(b) - 1, ip = -1;
      for (int d = 0; d <= nb; ++d)
        if (d != b && (pdom[b][d / 64] >> (d % 64) & 1) && size(d) == want)
          ip = d;
      I.reconverge = ip < 0 || ip == exitB ? n : blockStart[ip];
    }
  }
};

//===----------------------------------------------------------------------===//
// Floating-point helpers
//===----------------------------------------------------------------------===//

constexpr uint32_t kCanonF32 = 0x7FFFFFFFu;
constexpr uint16_t kCanonF16 = 0x7FFFu, kCanonBF16 = 0x7FFFu;
constexpr uint64_t kCanonF64 = 0x7FFFFFFFFFFFFFFFull;

inline float asF(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t asU(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline double asD(uint64_t u) {
  double f;
  std::memcpy(&f, &u, 8);
  return f;
}
inline uint64_t asU64(double f) {
  uint64_t u;
  std::memcpy(&u, &f, 8);
  return u;
}
inline bool nan32(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }
inline uint32_t ftz32(uint32_t u) {
  return (u & 0x7F800000u) == 0 ? (u & 0x80000000u) : u;
}
inline uint32_t res32(float r) { return std::isnan(r) ? kCanonF32 : asU(r); }
inline uint64_t res64(double r) { return std::isnan(r) ? kCanonF64 : asU64(r); }

int feMode(Rnd r) {
  switch (r) {
  case Rnd::RZ: return FE_TOWARDZERO;
  case Rnd::RM: return FE_DOWNWARD;
  case Rnd::RP: return FE_UPWARD;
  default: return FE_TONEAREST;
  }
}

/// Sets the host rounding mode for a scope (only when not nearest).
struct RoundScope {
  int saved = -1;
  explicit RoundScope(Rnd r) {
    if (r == Rnd::RZ || r == Rnd::RM || r == Rnd::RP) {
      saved = std::fegetround();
      std::fesetround(feMode(r));
    }
  }
  ~RoundScope() {
    if (saved >= 0)
      std::fesetround(saved);
  }
};

/// f32 -> f16 / bf16 bits, .rn (ties to even) or .rz. NaN -> canonical.
uint16_t narrow16(uint32_t x, bool bf16, Rnd r) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  if (nan32(x))
    return bf16 ? kCanonBF16 : kCanonF16;
  if (bf16) {
    uint32_t mag = x & 0x7FFFFFFFu;
    if (mag == 0x7F800000u)
      return uint16_t(sign | 0x7F80u);
    uint32_t hi = x >> 16, lo = x & 0xFFFFu;
    if (r == Rnd::RZ)
      return uint16_t(hi);
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1)))
      ++hi; // may carry into the exponent and to infinity: correct
    return uint16_t(hi);
  }
  // f16: 1-5-10.
  uint32_t mag = x & 0x7FFFFFFFu;
  if (mag >= 0x7F800000u)
    return uint16_t(sign | 0x7C00u);
  int exp = int(mag >> 23) - 127;
  uint64_t mant = (mag & 0x7FFFFFu) | (mag >= 0x00800000u ? 0x800000u : 0);
  if (mag < 0x00800000u)
    exp = -126; // f32 subnormal
  // value = mant * 2^(exp - 23); target units: 2^-24 (f16 subnormal ulp)
  // for exp < -14, else 2^(exp - 10).
  int unitExp = exp < -14 ? -24 : exp - 10;
  int shift = unitExp - (exp - 23); // right shift of mant
  uint64_t q, rem, half;
  if (shift <= 0) {
    q = mant << (-shift);
    rem = 0;
    half = 1;
  } else if (shift >= 63) {
    // Far below half the smallest subnormal (< 2^-62 of it): rounds to zero.
    q = 0;
    rem = mant;
    half = ~0ull;
  } else {
    q = mant >> shift;
    rem = mant & ((1ull << shift) - 1);
    half = 1ull << (shift - 1);
  }
  if (r == Rnd::RN && (rem > half || (rem == half && (q & 1))))
    ++q;
  // Assemble: for subnormal range unitExp=-24 -> bits = q (carry into the
  // normal range works); else q has an implicit bit at 2^10.
  uint32_t bits;
  if (unitExp == -24) {
    bits = uint32_t(q); // q <= 0x400 -> 0x400 is the smallest normal
  } else {
    int e = exp;
    if (q >= 0x800) { // mantissa overflow from rounding
      q >>= 1;
      ++e;
    }
    if (e > 15)
      return uint16_t(sign | (r == Rnd::RZ ? 0x7BFFu : 0x7C00u));
    bits = uint32_t((e + 15) << 10) | uint32_t(q & 0x3FFu);
  }
  return uint16_t(sign | bits);
}

uint32_t widenF16(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FFu;
  if (e == 0x1F)
    return sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0); // quiet NaN
  if (e == 0) {
    if (m == 0)
      return sign;
    float v = float(m) * 0x1p-24f;
    return sign | asU(v);
  }
  return sign | ((e + 112) << 23) | (m << 13);
}
inline uint32_t widenBF16(uint16_t b) { return uint32_t(b) << 16; }

float toF32(uint64_t v, T t) {
  switch (t) {
  case T::F16: return asF(widenF16(uint16_t(v)));
  case T::BF16: return asF(widenBF16(uint16_t(v)));
  default: return asF(uint32_t(v));
  }
}

//===----------------------------------------------------------------------===//
// Execution
//===----------------------------------------------------------------------===//

struct Fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t sext(uint64_t v, int bits) {
  if (bits >= 64)
    return int64_t(v);
  uint64_t m = 1ull << (bits - 1);
  v &= maskOf(bits);
  return int64_t((v ^ m) - m);
}

struct Executor {
  const KernelImpl &k;
  const LaunchDims &dims;
  const std::vector<uint8_t> &params;
  const MemoryCheck &check;
  LaunchStats stats;
  std::vector<uint64_t> R; ///< R[reg * 32 + lane]
  unsigned block[3] = {0, 0, 0};
  unsigned warpInBlock = 0;
  uint32_t tid[32][3];

  Executor(const KernelImpl &k, const LaunchDims &d,
           const std::vector<uint8_t> &p, const MemoryCheck &c)
      : k(k), dims(d), params(p), check(c) {
    R.assign(size_t(k.numRegs) * 32, 0);
  }

  [[noreturn]] void fault(const Inst &I, int lane, const std::string &what) {
    std::ostringstream os;
    os << k.name << " line " << I.line << " (" << I.opcode << "), block ("
       << block[0] << "," << block[1] << "," << block[2] << ") thread ("
       << tid[lane][0] << "," << tid[lane][1] << "," << tid[lane][2]
       << "): " << what;
    throw Fault(os.str());
  }

  inline uint64_t rd(const Operand &o, int l) const {
    return o.kind == Operand::Reg ? R[size_t(o.reg) * 32 + l] : o.imm;
  }
  /// Element i of the vector source `o` in lane l.
  inline uint64_t vecElem(const Operand &o, int i, int l) const {
    return o.vec[i] == -2 ? o.vimm[i] : R[size_t(o.vec[i]) * 32 + l];
  }
  inline void wr(int reg, int l, uint64_t v) {
    R[size_t(reg) * 32 + l] = v & k.regMask[size_t(reg)];
  }
  uint32_t special(Special s, int l) const {
    switch (s) {
    case Special::TidX: return tid[l][0];
    case Special::TidY: return tid[l][1];
    case Special::TidZ: return tid[l][2];
    case Special::NtidX: return dims.block[0];
    case Special::NtidY: return dims.block[1];
    case Special::NtidZ: return dims.block[2];
    case Special::CtaidX: return block[0];
    case Special::CtaidY: return block[1];
    case Special::CtaidZ: return block[2];
    case Special::NctaidX: return dims.grid[0];
    case Special::NctaidY: return dims.grid[1];
    case Special::NctaidZ: return dims.grid[2];
    case Special::LaneId: return uint32_t(l);
    case Special::WarpId: return warpInBlock;
    }
    return 0;
  }

  template <class F> static inline void lanes(uint32_t m, F &&f) {
    while (m) {
      int l = __builtin_ctz(m);
      m &= m - 1;
      f(l);
    }
  }

  uint64_t loadGlobal(const Inst &I, int l, uint64_t addr, int bytes) {
    uint64_t v = 0;
    std::memcpy(&v, reinterpret_cast<const void *>(uintptr_t(addr)),
                size_t(bytes));
    (void)I;
    (void)l;
    return v;
  }

  void checkAccess(const Inst &I, int l, uint64_t addr, uint64_t bytes,
                   bool write) {
    if (addr % bytes != 0) {
      std::ostringstream os;
      os << "misaligned " << (write ? "store" : "load") << " of " << bytes
         << " bytes at 0x" << std::hex << addr;
      fault(I, l, os.str());
    }
    if (!write && k.constData)
      for (auto [lo, size] : k.constData->ranges)
        if (addr >= lo && addr + bytes <= lo + size)
          return;
    if (check && !check(addr, bytes, write)) {
      std::ostringstream os;
      os << (write ? "store" : "load") << " of " << bytes << " bytes at 0x"
         << std::hex << addr << " outside device memory";
      fault(I, l, os.str());
    }
  }

  uint64_t cvt(const Inst &I, uint64_t a, uint64_t b) {
    const T d = I.t, s = I.t2;
    const int db = bitsOf(d), sb = bitsOf(s);
    if (d == T::F16X2 || d == T::BF16X2) {
      bool bf = d == T::BF16X2;
      uint16_t hi = narrow16(uint32_t(a), bf, I.rnd),
               lo = narrow16(uint32_t(b), bf, I.rnd);
      return uint64_t(hi) << 16 | lo;
    }
    if (isInt(d) && isInt(s)) {
      int64_t sv = isSigned(s) ? sext(a, sb) : int64_t(a & maskOf(sb));
      bool sU64 = !isSigned(s) && sb == 64;
      if (I.sat) {
        if (isSigned(d)) {
          int64_t lo = -(int64_t(1) << (db - 1)), hi = (int64_t(1) << (db - 1)) - 1;
          if (db == 64) {
            if (sU64 && (a >> 63))
              sv = INT64_MAX;
          } else if (sU64 && (a >> 63)) {
            sv = hi;
          } else {
            sv = std::min(std::max(sv, lo), hi);
          }
        } else {
          uint64_t hi = maskOf(db);
          if (!sU64 && sv < 0)
            sv = 0;
          else if (db < 64 && (sU64 ? a > hi : uint64_t(sv) > hi))
            sv = int64_t(hi);
        }
      }
      uint64_t r = uint64_t(sv) & maskOf(db);
      return isSigned(d) ? uint64_t(sext(r, db)) : r;
    }
    if (isInt(d)) { // from float
      double v;
      if (s == T::F64)
        v = asD(a);
      else {
        uint32_t x = s == T::F32 ? uint32_t(a) : asU(toF32(a, s));
        if (I.ftz)
          x = ftz32(x);
        v = double(asF(x));
      }
      if (std::isnan(v))
        return 0;
      switch (I.rnd) {
      case Rnd::RNI: v = std::nearbyint(v); break; // ties to even
      case Rnd::RZI: v = std::trunc(v); break;
      case Rnd::RMI: v = std::floor(v); break;
      default: v = std::ceil(v); break;
      }
      uint64_t r;
      if (isSigned(d)) {
        // Saturate to [-2^(db-1), 2^(db-1) - 1].
        const double lo = -std::ldexp(1.0, db - 1), hi = std::ldexp(1.0, db - 1);
        const int64_t minV = db == 64 ? INT64_MIN : -(int64_t(1) << (db - 1));
        const int64_t maxV = db == 64 ? INT64_MAX : (int64_t(1) << (db - 1)) - 1;
        int64_t iv = v <= lo ? minV : v >= hi ? maxV : int64_t(v);
        r = uint64_t(sext(uint64_t(iv), db));
      } else {
        double hi = std::ldexp(1.0, db);
        r = v <= 0 ? 0 : v >= hi ? maskOf(db) : uint64_t(v);
      }
      return r & (isSigned(d) ? ~0ull : maskOf(db));
    }
    if (isInt(s)) { // to float
      RoundScope rs(I.rnd);
      bool sg = isSigned(s);
      int64_t iv = sg ? sext(a, sb) : 0;
      uint64_t uv = a & maskOf(sb);
      if (d == T::F32) {
        volatile float f = sg ? float(iv) : float(uv);
        return asU(f);
      }
      if (d == T::F64) {
        volatile double f = sg ? double(iv) : double(uv);
        return asU64(f);
      }
      // 16-bit: through f32 exactly (only <= 24-bit magnitudes are exact).
      double dv = sg ? double(iv) : double(uv);
      if (std::fabs(dv) > 16777216.0)
        throw Fault("cvt of a wide integer to f16/bf16 is not implemented");
      return narrow16(asU(float(dv)), d == T::BF16, I.rnd);
    }
    // float -> float
    if (d == s) { // f32 round to integral
      uint32_t x = uint32_t(a);
      if (I.ftz)
        x = ftz32(x);
      float v = asF(x), r;
      switch (I.rnd) {
      case Rnd::RNI: r = std::nearbyintf(v); break;
      case Rnd::RZI: r = std::truncf(v); break;
      case Rnd::RMI: r = std::floor(v); break;
      default: r = std::ceil(v); break;
      }
      uint32_t o = res32(r);
      if (I.sat)
        o = res32(std::isnan(asF(o)) ? 0.0f : std::min(std::max(asF(o), 0.0f), 1.0f));
      return I.ftz ? ftz32(o) : o;
    }
    if (d == T::F32 && (s == T::F16 || s == T::BF16)) {
      uint32_t o = s == T::F16 ? widenF16(uint16_t(a)) : widenBF16(uint16_t(a));
      if (I.ftz)
        o = ftz32(o);
      if (I.sat)
        o = nan32(o) ? 0 : asU(std::min(std::max(asF(o), 0.0f), 1.0f));
      return o;
    }
    if (d == T::F64 && s == T::F32) {
      uint32_t x = I.ftz ? ftz32(uint32_t(a)) : uint32_t(a);
      return nan32(x) ? kCanonF64 : asU64(double(asF(x)));
    }
    if (d == T::F32 && s == T::F64) {
      RoundScope rs(I.rnd);
      volatile float f = float(asD(a));
      uint32_t o = res32(f);
      if (I.ftz)
        o = ftz32(o);
      if (I.sat)
        o = nan32(o) ? 0 : asU(std::min(std::max(asF(o), 0.0f), 1.0f));
      return o;
    }
    // f32 -> f16/bf16
    uint32_t x = I.ftz ? ftz32(uint32_t(a)) : uint32_t(a);
    return narrow16(x, d == T::BF16, I.rnd);
  }

  static inline bool cmpF(Cmp c, double a, double b) {
    bool un = std::isnan(a) || std::isnan(b);
    switch (c) {
    case Cmp::EQ: return !un && a == b;
    case Cmp::NE: return !un && a != b;
    case Cmp::LT: return !un && a < b;
    case Cmp::LE: return !un && a <= b;
    case Cmp::GT: return !un && a > b;
    case Cmp::GE: return !un && a >= b;
    case Cmp::EQU: return un || a == b;
    case Cmp::NEU: return un || a != b;
    case Cmp::LTU: return un || a < b;
    case Cmp::LEU: return un || a <= b;
    case Cmp::GTU: return un || a > b;
    case Cmp::GEU: return un || a >= b;
    case Cmp::NUM: return !un;
    case Cmp::NAN_: return un;
    default: return false;
    }
  }

  /// min/max of f32 per the PTX ISA: without .NaN a NaN operand yields the
  /// other operand (both NaN: canonical NaN); with .NaN any NaN yields the
  /// canonical NaN; -0.0 < +0.0.
  static inline uint32_t minmax(uint32_t a, uint32_t b, bool isMax, bool nanM,
                                bool ftz) {
    if (ftz) {
      a = ftz32(a);
      b = ftz32(b);
    }
    bool na = nan32(a), nb = nan32(b);
    if (na || nb) {
      if (nanM || (na && nb))
        return kCanonF32;
      return na ? b : a;
    }
    float fa = asF(a), fb = asF(b);
    if (fa == fb) { // equal, or +0/-0
      if ((a ^ b) & 0x80000000u)
        return isMax ? (a & 0x80000000u ? b : a) : (a & 0x80000000u ? a : b);
      return a;
    }
    return (isMax ? fa > fb : fa < fb) ? a : b;
  }

  static inline uint32_t arith32(Op op, Rnd r, bool ftz, uint32_t a,
                                 uint32_t b, uint32_t c) {
    if (ftz) {
      a = ftz32(a);
      b = ftz32(b);
      c = ftz32(c);
    }
    float x = asF(a), y = asF(b), res;
    if (r == Rnd::RN) {
      switch (op) {
      case Op::AddF: res = x + y; break;
      case Op::SubF: res = x - y; break;
      case Op::MulF: res = x * y; break;
      case Op::DivF: res = x / y; break;
      case Op::FmaF: res = std::fma(x, y, asF(c)); break;
      default: res = std::sqrt(x); break;
      }
    } else {
      RoundScope rs(r);
      volatile float vx = x, vy = y, vc = asF(c);
      volatile float v;
      switch (op) {
      case Op::AddF: v = vx + vy; break;
      case Op::SubF: v = vx - vy; break;
      case Op::MulF: v = vx * vy; break;
      case Op::DivF: v = vx / vy; break;
      case Op::FmaF: v = std::fma(float(vx), float(vy), float(vc)); break;
      default: v = std::sqrt(float(vx)); break;
      }
      res = v;
    }
    uint32_t o = res32(res);
    return ftz ? ftz32(o) : o;
  }

  /// bf16 a op b (op c), rounded once to nearest even: the exact result
  /// rounded to odd in double (the product of two bf16 values is exact
  /// there), then to odd in f32, then to nearest bf16 (rounding to odd
  /// with two or more extra bits makes the last rounding correct). NaN ->
  /// canonical; subnormals kept.
  static inline uint16_t arithBF16(Op op, uint16_t a, uint16_t b,
                                   uint16_t c) {
    const double x = double(asF(widenBF16(a))), y = double(asF(widenBF16(b))),
                 z = double(asF(widenBF16(c)));
    const int saved = std::fegetround();
    std::fesetround(FE_TOWARDZERO);
    std::feclearexcept(FE_INEXACT);
    volatile double vx = x, vy = y, vz = z, v;
    switch (op) {
    case Op::AddF: v = vx + vy; break;
    case Op::SubF: v = vx - vy; break;
    case Op::MulF: v = vx * vy; break;
    default: v = std::fma(double(vx), double(vy), double(vz)); break;
    }
    double d = v;
    if (std::fetestexcept(FE_INEXACT) && !std::isnan(d) && !std::isinf(d))
      d = asD(asU64(d) | 1);
    std::feclearexcept(FE_INEXACT);
    volatile float vf = float(d);
    uint32_t f = asU(vf);
    if (std::fetestexcept(FE_INEXACT) && !nan32(f) &&
        (f & 0x7FFFFFFFu) != 0x7F800000u)
      f |= 1;
    std::fesetround(saved);
    return narrow16(f, /*bf16=*/true, Rnd::RN);
  }

  static inline uint64_t arith64(Op op, Rnd r, uint64_t a, uint64_t b,
                                 uint64_t c) {
    RoundScope rs(r);
    volatile double x = asD(a), y = asD(b), z = asD(c);
    volatile double v;
    switch (op) {
    case Op::AddF: v = x + y; break;
    case Op::SubF: v = x - y; break;
    case Op::MulF: v = x * y; break;
    case Op::DivF: v = x / y; break;
    case Op::FmaF: v = std::fma(double(x), double(y), double(z)); break;
    default: v = std::sqrt(double(x)); break;
    }
    return res64(v);
  }

  struct Entry {
    uint32_t mask;
    int32_t pc, rpc;
  };

  void runWarp(uint32_t live) {
    const int n = int(k.code.size());
    std::vector<Entry> stack;
    stack.push_back({live, 0, -1});
    uint32_t exited = 0;
    while (!stack.empty()) {
      Entry &e = stack.back();
      if (e.pc == e.rpc || e.mask == 0) {
        stack.pop_back();
        continue;
      }
      if (e.pc >= n) {
        if (e.pc > n)
          throw Fault(k.name + ": ran past the end");
        exited |= e.mask;
        stack.pop_back();
        for (Entry &x : stack)
          x.mask &= ~exited;
        continue;
      }
      const Inst &I = k.code[size_t(e.pc)];
      ++stats.warp_instructions;
      uint32_t m = e.mask;
      if (I.guard >= 0) {
        uint32_t g = 0;
        const uint64_t *p = &R[size_t(I.guard) * 32];
        lanes(m, [&](int l) {
          if ((p[l] != 0) != I.guardNeg)
            g |= 1u << l;
        });
        m = g;
      }
      stats.lane_instructions += uint64_t(__builtin_popcount(m));
      if (I.op == Op::Bra || I.op == Op::Ret) {
        const int target = I.op == Op::Bra ? I.o[0].target : n;
        const uint32_t taken = m, stay = e.mask & ~m;
        if (I.uni && taken != 0 && stay != 0)
          fault(I, __builtin_ctz(taken), "bra.uni is not uniform across the "
                                         "warp's active lanes");
        if (stay == 0) {
          e.pc = target;
        } else if (taken == 0) {
          e.pc += 1;
        } else {
          ++stats.divergent_branches;
          const int R0 = I.reconverge;
          Entry a{taken, target, R0}, b{stay, e.pc + 1, R0};
          if (e.rpc == R0) {
            stack.pop_back();
          } else {
            e.pc = R0;
          }
          if (b.pc != R0)
            stack.push_back(b);
          if (a.pc != R0)
            stack.push_back(a);
        }
        continue;
      }
      execute(I, m, e.mask & ~exited, live & ~exited);
      stack.back().pc += 1;
    }
  }

  void execute(const Inst &I, uint32_t m, uint32_t active, uint32_t live) {
    const int w = bitsOf(I.t);
    const uint64_t tm = maskOf(w);
    const Operand &D = I.o[0], &A = I.o[1], &B = I.o[2], &C = I.o[3];
    const int dreg = D.reg;
    switch (I.op) {
    case Op::Mov:
      if (D.kind == Operand::Vec) {
        const int ew = w / D.nvec;
        lanes(m, [&](int l) {
          uint64_t v = rd(A, l);
          for (int i = 0; i < D.nvec; ++i)
            if (D.vec[i] >= 0)
              wr(D.vec[i], l, (v >> (i * ew)) & maskOf(ew));
        });
      } else if (A.kind == Operand::Vec) {
        const int ew = w / A.nvec;
        lanes(m, [&](int l) {
          uint64_t v = 0;
          for (int i = 0; i < A.nvec; ++i)
            v |= (vecElem(A, i, l) & maskOf(ew)) << (i * ew);
          wr(dreg, l, v);
        });
      } else if (A.kind == Operand::Spec) {
        lanes(m, [&](int l) { wr(dreg, l, special(A.special, l)); });
      } else {
        lanes(m, [&](int l) { wr(dreg, l, rd(A, l) & tm); });
      }
      return;
    case Op::Ld: {
      const int bytes = w / 8;
      const uint64_t total = uint64_t(bytes) * I.vec;
      lanes(m, [&](int l) {
        uint64_t vals[4];
        if (I.space == Space::Param) {
          uint64_t off = A.imm;
          if (off + total > params.size())
            fault(I, l, "ld.param past the parameter buffer");
          vals[0] = 0;
          std::memcpy(&vals[0], params.data() + off, size_t(bytes));
        } else {
          uint64_t addr = R[size_t(A.reg) * 32 + l] + A.imm;
          checkAccess(I, l, addr, total, false);
          for (int i = 0; i < I.vec; ++i)
            vals[i] = loadGlobal(I, l, addr + uint64_t(i * bytes), bytes);
        }
        for (int i = 0; i < I.vec; ++i) {
          uint64_t v = isSigned(I.t) ? uint64_t(sext(vals[i], w)) : vals[i];
          int r = I.vec == 1 ? dreg : D.vec[i];
          if (r >= 0)
            wr(r, l, v);
        }
      });
      return;
    }
    case Op::St: {
      const int bytes = w / 8;
      const uint64_t total = uint64_t(bytes) * I.vec;
      lanes(m, [&](int l) {
        uint64_t addr = R[size_t(D.reg) * 32 + l] + D.imm;
        checkAccess(I, l, addr, total, true);
        for (int i = 0; i < I.vec; ++i) {
          uint64_t v = I.vec == 1 ? rd(A, l) : vecElem(A, i, l);
          std::memcpy(reinterpret_cast<void *>(uintptr_t(addr + uint64_t(i * bytes))),
                      &v, size_t(bytes));
        }
      });
      return;
    }
    case Op::Add:
    case Op::Sub:
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l), b = rd(B, l), r;
        if (I.sat) { // s32
          int64_t x = sext(a, 32), y = sext(b, 32);
          int64_t s = I.op == Op::Add ? x + y : x - y;
          s = std::min<int64_t>(std::max<int64_t>(s, INT32_MIN), INT32_MAX);
          r = uint64_t(s);
        } else {
          r = I.op == Op::Add ? a + b : a - b;
        }
        wr(dreg, l, r & tm);
      });
      return;
    case Op::MulLo:
    case Op::MadLo:
      lanes(m, [&](int l) {
        uint64_t r = rd(A, l) * rd(B, l);
        if (I.op == Op::MadLo)
          r += rd(C, l);
        wr(dreg, l, r & tm);
      });
      return;
    case Op::MulHi:
      lanes(m, [&](int l) {
        uint64_t r;
        if (w == 64) {
          if (isSigned(I.t))
            r = uint64_t((__int128(int64_t(rd(A, l))) * __int128(int64_t(rd(B, l)))) >> 64);
          else
            r = uint64_t((static_cast<unsigned __int128>(rd(A, l)) * rd(B, l)) >> 64);
        } else if (isSigned(I.t)) {
          r = uint64_t((sext(rd(A, l), w) * sext(rd(B, l), w)) >> w);
        } else {
          r = ((rd(A, l) & tm) * (rd(B, l) & tm)) >> w;
        }
        wr(dreg, l, r & tm);
      });
      return;
    case Op::MulWide:
    case Op::MadWide:
      lanes(m, [&](int l) {
        uint64_t r;
        if (isSigned(I.t))
          r = uint64_t(sext(rd(A, l), w) * sext(rd(B, l), w));
        else
          r = (rd(A, l) & tm) * (rd(B, l) & tm);
        if (I.op == Op::MadWide)
          r += rd(C, l);
        wr(dreg, l, r & maskOf(2 * w));
      });
      return;
    case Op::MinI:
    case Op::MaxI:
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l) & tm, b = rd(B, l) & tm;
        bool lt = isSigned(I.t) ? sext(a, w) < sext(b, w) : a < b;
        wr(dreg, l, (I.op == Op::MinI) == lt ? a : b);
      });
      return;
    case Op::NegI:
      lanes(m, [&](int l) { wr(dreg, l, (0 - rd(A, l)) & tm); });
      return;
    case Op::AbsI:
      lanes(m, [&](int l) {
        int64_t v = sext(rd(A, l), w);
        wr(dreg, l, uint64_t(v < 0 ? -v : v) & tm);
      });
      return;
    case Op::And:
      lanes(m, [&](int l) { wr(dreg, l, rd(A, l) & rd(B, l) & tm); });
      return;
    case Op::Or:
      lanes(m, [&](int l) { wr(dreg, l, (rd(A, l) | rd(B, l)) & tm); });
      return;
    case Op::Xor:
      lanes(m, [&](int l) { wr(dreg, l, (rd(A, l) ^ rd(B, l)) & tm); });
      return;
    case Op::Not:
      lanes(m, [&](int l) { wr(dreg, l, ~rd(A, l) & tm); });
      return;
    case Op::Shl:
      lanes(m, [&](int l) {
        uint64_t s = rd(B, l) & 0xFFFFFFFFu;
        wr(dreg, l, s >= uint64_t(w) ? 0 : (rd(A, l) << s) & tm);
      });
      return;
    case Op::Shr:
      lanes(m, [&](int l) {
        uint64_t s = rd(B, l) & 0xFFFFFFFFu, a = rd(A, l) & tm;
        uint64_t r;
        if (isSigned(I.t)) {
          int64_t v = sext(a, w);
          r = uint64_t(v >> (s >= uint64_t(w) ? w - 1 : s));
        } else {
          r = s >= uint64_t(w) ? 0 : a >> s;
        }
        wr(dreg, l, r & tm);
      });
      return;
    case Op::Bfe:
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l) & tm;
        unsigned pos = unsigned(rd(B, l) & 0xFF), len = unsigned(rd(C, l) & 0xFF);
        uint64_t sbit = 0;
        if (isSigned(I.t) && len != 0)
          sbit = (a >> std::min<unsigned>(pos + len - 1, unsigned(w - 1))) & 1;
        uint64_t r = 0;
        for (int i = 0; i < w; ++i) {
          uint64_t bit = (unsigned(i) < len && pos + unsigned(i) <= unsigned(w - 1))
                             ? (a >> (pos + unsigned(i))) & 1
                             : sbit;
          r |= bit << i;
        }
        wr(dreg, l, r);
      });
      return;
    case Op::Bfi:
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l), f = rd(B, l) & tm;
        unsigned pos = unsigned(rd(C, l) & 0xFF),
                 len = unsigned(rd(I.o[4], l) & 0xFF);
        for (unsigned i = 0; i < len && pos + i <= unsigned(w - 1); ++i)
          f = (f & ~(1ull << (pos + i))) | (((a >> i) & 1) << (pos + i));
        wr(dreg, l, f);
      });
      return;
    case Op::Prmt:
      lanes(m, [&](int l) {
        uint64_t src = (rd(A, l) & 0xFFFFFFFFu) | (rd(B, l) & 0xFFFFFFFFu) << 32;
        uint32_t c = uint32_t(rd(C, l)), r = 0;
        for (int i = 0; i < 4; ++i) {
          uint32_t sel = (c >> (4 * i)) & 0xF;
          uint32_t byte = uint32_t(src >> (8 * (sel & 7))) & 0xFF;
          if (sel & 8)
            byte = (byte & 0x80) ? 0xFF : 0;
          r |= byte << (8 * i);
        }
        wr(dreg, l, r);
      });
      return;
    case Op::Selp:
      lanes(m, [&](int l) { wr(dreg, l, (rd(C, l) ? rd(A, l) : rd(B, l)) & tm); });
      return;
    case Op::SetpI:
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l) & tm, b = rd(B, l) & tm;
        bool r;
        if (isSigned(I.t)) {
          int64_t x = sext(a, w), y = sext(b, w);
          switch (I.cmp) {
          case Cmp::EQ: r = x == y; break;
          case Cmp::NE: r = x != y; break;
          case Cmp::LT: r = x < y; break;
          case Cmp::LE: r = x <= y; break;
          case Cmp::GT: r = x > y; break;
          default: r = x >= y; break;
          }
        } else {
          switch (I.cmp) {
          case Cmp::EQ: r = a == b; break;
          case Cmp::NE: r = a != b; break;
          case Cmp::LT: case Cmp::LO: r = a < b; break;
          case Cmp::LE: case Cmp::LS: r = a <= b; break;
          case Cmp::GT: case Cmp::HI: r = a > b; break;
          default: r = a >= b; break;
          }
        }
        wr(dreg, l, r);
      });
      return;
    case Op::SetpF:
      lanes(m, [&](int l) {
        double a, b;
        if (I.t == T::F64) {
          a = asD(rd(A, l));
          b = asD(rd(B, l));
        } else if (I.t == T::F32) {
          uint32_t x = uint32_t(rd(A, l)), y = uint32_t(rd(B, l));
          if (I.ftz) {
            x = ftz32(x);
            y = ftz32(y);
          }
          a = asF(x);
          b = asF(y);
        } else {
          a = toF32(rd(A, l), I.t);
          b = toF32(rd(B, l), I.t);
        }
        wr(dreg, l, cmpF(I.cmp, a, b));
      });
      return;
    case Op::AddF:
    case Op::SubF:
    case Op::MulF:
    case Op::DivF:
    case Op::FmaF:
    case Op::SqrtF:
    case Op::RcpF:
      if (I.op == Op::RcpF) { // 1 / a, one IEEE rounding
        lanes(m, [&](int l) {
          wr(dreg, l,
             I.t == T::F32
                 ? uint64_t(arith32(Op::DivF, I.rnd, I.ftz, 0x3F800000u,
                                    uint32_t(rd(A, l)), 0))
                 : arith64(Op::DivF, I.rnd, 0x3FF0000000000000ull, rd(A, l),
                           0));
        });
        return;
      }
      if (I.t == T::BF16 || I.t == T::BF16X2) {
        const bool fma = I.op == Op::FmaF, two = I.t == T::BF16X2;
        lanes(m, [&](int l) {
          uint64_t a = rd(A, l), b = rd(B, l), c = fma ? rd(C, l) : 0;
          uint64_t lo = arithBF16(I.op, uint16_t(a), uint16_t(b), uint16_t(c));
          uint64_t hi = two ? arithBF16(I.op, uint16_t(a >> 16),
                                        uint16_t(b >> 16), uint16_t(c >> 16))
                            : 0;
          wr(dreg, l, hi << 16 | lo);
        });
      } else if (I.t == T::F32) {
        const bool sq = I.op == Op::SqrtF, fma = I.op == Op::FmaF;
        lanes(m, [&](int l) {
          wr(dreg, l,
             arith32(I.op, I.rnd, I.ftz, uint32_t(rd(A, l)),
                     sq ? 0 : uint32_t(rd(B, l)), fma ? uint32_t(rd(C, l)) : 0));
        });
      } else if (I.t == T::F32X2) {
        const bool fma = I.op == Op::FmaF;
        lanes(m, [&](int l) {
          uint64_t a = rd(A, l), b = rd(B, l), c = fma ? rd(C, l) : 0;
          uint64_t lo = arith32(I.op, I.rnd, false, uint32_t(a), uint32_t(b),
                                uint32_t(c));
          uint64_t hi = arith32(I.op, I.rnd, false, uint32_t(a >> 32),
                                uint32_t(b >> 32), uint32_t(c >> 32));
          wr(dreg, l, hi << 32 | lo);
        });
      } else {
        const bool sq = I.op == Op::SqrtF, fma = I.op == Op::FmaF;
        lanes(m, [&](int l) {
          wr(dreg, l, arith64(I.op, I.rnd, rd(A, l), sq ? 0 : rd(B, l),
                              fma ? rd(C, l) : 0));
        });
      }
      return;
    case Op::AbsF:
    case Op::NegF: {
      uint64_t sign;
      switch (I.t) {
      case T::F16: case T::BF16: sign = 0x8000u; break;
      case T::F16X2: case T::BF16X2: sign = 0x80008000u; break;
      case T::F64: sign = 1ull << 63; break;
      default: sign = 0x80000000u; break;
      }
      const bool abs = I.op == Op::AbsF;
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l) & tm;
        if (I.ftz)
          a = ftz32(uint32_t(a));
        wr(dreg, l, abs ? a & ~sign : a ^ sign);
      });
      return;
    }
    case Op::MinF:
    case Op::MaxF:
      lanes(m, [&](int l) {
        wr(dreg, l,
           minmax(uint32_t(rd(A, l)), uint32_t(rd(B, l)), I.op == Op::MaxF,
                  I.nanMode, I.ftz));
      });
      return;
    case Op::CopysignF: {
      const uint64_t sign = w == 64 ? 1ull << 63 : 0x80000000u;
      lanes(m, [&](int l) {
        wr(dreg, l, (rd(B, l) & tm & ~sign) | (rd(A, l) & sign));
      });
      return;
    }
    case Op::Cvt: {
      const bool packed = I.t == T::F16X2 || I.t == T::BF16X2;
      try {
        lanes(m, [&](int l) {
          wr(dreg, l, cvt(I, rd(A, l), packed ? rd(B, l) : 0));
        });
      } catch (const Fault &f) {
        fault(I, __builtin_ctz(m), f.what());
      }
      return;
    }
    case Op::Shfl: {
      ++stats.shuffles;
      if (m == 0)
        return;
      // Member mask: one value for the warp is required here.
      const uint32_t member = uint32_t(rd(I.o[4], __builtin_ctz(m)));
      lanes(m, [&](int l) {
        if (uint32_t(rd(I.o[4], l)) != member)
          fault(I, l, "shfl.sync member masks differ across lanes");
      });
      if ((m & ~member) != 0)
        fault(I, __builtin_ctz(m & ~member),
              "shfl.sync executed by a lane outside its member mask");
      if ((member & live & ~m) != 0)
        fault(I, __builtin_ctz(member & live & ~m),
              "shfl.sync: a lane named in the member mask does not execute "
              "it (divergence or predication)");
      uint64_t out[32];
      lanes(m, [&](int l) {
        uint32_t b = uint32_t(rd(B, l)) & 31, c = uint32_t(rd(C, l));
        uint32_t clamp = c & 31, seg = (c >> 8) & 31;
        uint32_t lane = uint32_t(l);
        uint32_t maxLane = (lane & seg) | (clamp & ~seg);
        uint32_t minLane = lane & seg;
        int64_t j;
        bool p;
        switch (I.mode) {
        case ShflMode::Up:
          j = int64_t(lane) - b;
          p = j >= int64_t(maxLane);
          break;
        case ShflMode::Down:
          j = int64_t(lane) + b;
          p = j <= int64_t(maxLane);
          break;
        case ShflMode::Bfly:
          j = lane ^ b;
          p = j <= int64_t(maxLane);
          break;
        default:
          j = minLane | (b & ~seg);
          p = j <= int64_t(maxLane);
          break;
        }
        if (!p)
          j = lane;
        if (!((m >> j) & 1))
          fault(I, l, "shfl.sync reads lane " + std::to_string(j) +
                          ", which does not take part");
        out[l] = R[size_t(A.reg >= 0 && A.kind == Operand::Reg ? A.reg : 0) * 32 + size_t(j)];
        if (A.kind != Operand::Reg)
          out[l] = A.imm;
      });
      (void)active;
      lanes(m, [&](int l) { wr(dreg, l, out[l] & 0xFFFFFFFFu); });
      return;
    }
    default:
      fault(I, __builtin_ctz(m | 1), "internal: unhandled operation");
    }
  }

  void run() {
    const unsigned threads = dims.block[0] * dims.block[1] * dims.block[2];
    const unsigned warps = (threads + 31) / 32;
    for (unsigned bz = 0; bz < dims.grid[2]; ++bz)
      for (unsigned by = 0; by < dims.grid[1]; ++by)
        for (unsigned bx = 0; bx < dims.grid[0]; ++bx) {
          block[0] = bx;
          block[1] = by;
          block[2] = bz;
          for (unsigned wi = 0; wi < warps; ++wi) {
            warpInBlock = wi;
            uint32_t live = 0;
            for (unsigned l = 0; l < 32; ++l) {
              unsigned t = wi * 32 + l;
              if (t < threads) {
                live |= 1u << l;
                tid[l][0] = t % dims.block[0];
                tid[l][1] = (t / dims.block[0]) % dims.block[1];
                tid[l][2] = t / (dims.block[0] * dims.block[1]);
              } else {
                tid[l][0] = tid[l][1] = tid[l][2] = 0;
              }
            }
            // Registers start undefined on a GPU; a recognisable pattern
            // makes reads before writes visible in results.
            std::fill(R.begin(), R.end(), 0xDEADBEEFDEADBEEFull);
            for (size_t r = 0; r < size_t(k.numRegs); ++r)
              for (int l = 0; l < 32; ++l)
                R[r * 32 + size_t(l)] &= k.regMask[r];
            runWarp(live);
          }
        }
  }
};

} // namespace

bool implemented(const std::string &opcode, std::string *why) {
  Inst I;
  try {
    decodeOpcode(opcode, I);
  } catch (const std::exception &e) {
    if (why)
      *why = e.what();
    return false;
  }
  return true;
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

bool launch(const Kernel &kernel, const LaunchDims &dims,
            const std::vector<uint8_t> &params, const MemoryCheck &check,
            std::string *error, LaunchStats *stats) {
  const KernelImpl &k = kernel.impl();
  if (params.size() < k.paramBytes) {
    if (error)
      *error = k.name + ": parameter buffer too small";
    return false;
  }
  for (int i = 0; i < 3; ++i)
    if (dims.grid[i] == 0 || dims.block[i] == 0) {
      if (error)
        *error = k.name + ": empty grid or block";
      return false;
    }
  if (dims.block[0] * dims.block[1] * dims.block[2] > 1024) {
    if (error)
      *error = k.name + ": more than 1024 threads per block";
    return false;
  }
  if (k.ntidLimit[0]) {
    bool bad = false;
    for (int i = 0; i < 3; ++i)
      bad |= k.ntidExact ? dims.block[i] != k.ntidLimit[i]
                         : dims.block[i] > k.ntidLimit[i];
    if (bad) {
      if (error)
        *error = k.name + ": block (" + std::to_string(dims.block[0]) + "," +
                 std::to_string(dims.block[1]) + "," +
                 std::to_string(dims.block[2]) + ") violates its " +
                 (k.ntidExact ? ".reqntid " : ".maxntid ") +
                 std::to_string(k.ntidLimit[0]) + ", " +
                 std::to_string(k.ntidLimit[1]) + ", " +
                 std::to_string(k.ntidLimit[2]);
      return false;
    }
  }
  Executor ex(k, dims, params, check);
  try {
    ex.run();
  } catch (const std::exception &e) {
    if (error)
      *error = e.what();
    if (stats)
      *stats = ex.stats;
    return false;
  }
  if (stats)
    *stats = ex.stats;
  return true;
}

} // namespace flashopt::ptxemu
