//===- PtxOpcodes.cpp - PTX opcode decoding ---------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The opcode decoder of the PTX interpreter (PtxInternal.h): an opcode and
/// its modifiers into an Inst, and `implemented` (PtxEmulator.h).
///
//===----------------------------------------------------------------------===//

#include "PtxInternal.h"

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

//===----------------------------------------------------------------------===//
// Opcode decoding
//===----------------------------------------------------------------------===//

std::vector<std::string> detail::split(const std::string &s, char c) {
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
void detail::decodeOpcode(const std::string &text, Inst &I) {
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
    } else if (p == "approx" && (base == "rcp" || base == "sqrt")) {
      I.approx = true;
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
    } else if ((base == "shfl" || base == "redux") && p == "sync" && i == 1) {
      // required
    } else if (base == "redux" && I.redux == ReduxKind::None &&
               (p == "and" || p == "or" || p == "xor" || p == "add" ||
                p == "min" || p == "max")) {
      I.redux = p == "and"   ? ReduxKind::And
                : p == "or"  ? ReduxKind::Or
                : p == "xor" ? ReduxKind::Xor
                : p == "add" ? ReduxKind::Add
                : p == "min" ? ReduxKind::Min
                             : ReduxKind::Max;
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
  } else if (base == "rcp" || base == "sqrt") {
    // rcp/sqrt.rn/rz/rm/rp: the IEEE result in the given rounding;
    // .approx.f32: within the ISA's bound (approxF32).
    need(1);
    I.t = types[0];
    if (I.t != T::F32 && I.t != T::F64)
      throw std::runtime_error(base + " of this type is not implemented");
    if (I.approx && (I.t != T::F32 || I.rnd != Rnd::None))
      throw std::runtime_error(base + ".approx is modelled for .f32 only");
    if (!I.approx && I.rnd != Rnd::RN && I.rnd != Rnd::RZ &&
        I.rnd != Rnd::RM && I.rnd != Rnd::RP)
      throw std::runtime_error(base + " needs .approx or an IEEE rounding "
                                      "modifier");
    if (I.sat || I.nanMode)
      throw std::runtime_error(".sat/.NaN on " + base);
    I.op = base == "rcp" ? Op::RcpF : Op::SqrtF;
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
  } else if (base == "redux") {
    // redux.sync.{and,or,xor}.b32, redux.sync.{add,min,max}.{u32,s32}:
    // the warp-wide reduction of sm_80+.
    need(1);
    I.t = types[0];
    if (parts.size() < 2 || parts[1] != "sync")
      throw std::runtime_error("redux without .sync is not implemented");
    bool bitwise = I.redux == ReduxKind::And || I.redux == ReduxKind::Or ||
                   I.redux == ReduxKind::Xor;
    if (I.redux == ReduxKind::None)
      throw std::runtime_error("redux.sync needs an operation");
    if (bitwise ? I.t != T::B32 : (I.t != T::U32 && I.t != T::S32))
      throw std::runtime_error("this redux.sync type is not implemented");
    noRound();
    noFlags();
    I.op = Op::Redux;
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

} // namespace flashopt::ptxemu
