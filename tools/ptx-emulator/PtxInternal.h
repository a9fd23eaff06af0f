//===- PtxInternal.h - The PTX interpreter's shared model -------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What the interpreter's parts share (PtxEmulator.h is the interface): the
/// decoded instruction model (types, modifiers, operands), the kernel a
/// module's parser builds, and the opcode decoder the parser calls.
/// PtxOpcodes.cpp decodes opcodes, PtxParser.cpp parses modules
/// (PtxKernelChecks.cpp checks operands and finds reconvergence points),
/// PtxExecutor.cpp (with PtxFloat.h) runs kernels.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_PTXEMU_PTXINTERNAL_H
#define FLASHOPT_PTXEMU_PTXINTERNAL_H

#include "ptx-emulator/PtxEmulator.h"

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashopt::ptxemu {

namespace detail {

//===----------------------------------------------------------------------===//
// Types, modifiers, decoded instructions
//===----------------------------------------------------------------------===//

enum class T : uint8_t {
  None, B8, B16, B32, B64, U8, U16, U32, U64, S8, S16, S32, S64,
  F16, F32, F64, BF16, F16X2, BF16X2, F32X2, Pred
};

inline int bitsOf(T t) {
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
inline bool isSigned(T t) { return t == T::S8 || t == T::S16 || t == T::S32 || t == T::S64; }
inline bool isInt(T t) {
  switch (t) {
  case T::B8: case T::B16: case T::B32: case T::B64: case T::U8: case T::U16:
  case T::U32: case T::U64: case T::S8: case T::S16: case T::S32: case T::S64:
    return true;
  default: return false;
  }
}
inline bool isBits(T t) { return t == T::B8 || t == T::B16 || t == T::B32 || t == T::B64; }
inline bool isScalarFloat(T t) { return t == T::F16 || t == T::F32 || t == T::F64 || t == T::BF16; }

inline const std::map<std::string, T> &typeNames() {
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

inline uint64_t maskOf(int bits) { return bits >= 64 ? ~0ull : ((1ull << bits) - 1); }

enum class Rnd : uint8_t { None, RN, RZ, RM, RP, RNI, RZI, RMI, RPI };
enum class Cmp : uint8_t {
  None, EQ, NE, LT, LE, GT, GE, LO, LS, HI, HS, EQU, NEU, LTU, LEU, GTU, GEU,
  NUM, NAN_
};
enum class Space : uint8_t { None, Global, Param };
enum class ShflMode : uint8_t { None, Up, Down, Bfly, Idx };
/// redux.sync's operation.
enum class ReduxKind : uint8_t { None, And, Or, Xor, Add, Min, Max };

enum class Op : uint8_t {
  Mov, Ld, St, Add, Sub, MulLo, MulHi, MulWide, MadLo, MadWide, MinI, MaxI,
  NegI, AbsI, And, Or, Xor, Not, Shl, Shr, Bfe, Bfi, Prmt, Selp, SetpI, SetpF,
  AddF, SubF, MulF, DivF, SqrtF, RcpF, FmaF, AbsF, NegF, MinF, MaxF, CopysignF, Cvt,
  Shfl, Redux, Bra, Ret
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
  ReduxKind redux = ReduxKind::None;
  bool ftz = false, sat = false, nanMode = false, uni = false;
  bool approx = false; ///< rcp.approx / sqrt.approx (see approxF32)
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

[[noreturn]] inline void fail(int line, const std::string &what) {
  throw ParseError("line " + std::to_string(line) + ": " + what);
}

/// Splits `s` at every `c`.
std::vector<std::string> split(const std::string &s, char c);

/// Decodes an opcode with its modifiers ("cvt.rzi.s32.f32") into `I`;
/// throws for what the interpreter does not implement.
void decodeOpcode(const std::string &text, Inst &I);

/// Throws (ParseError, with the instruction's line) unless `I` has the
/// operand count and kinds its opcode takes (PtxKernelChecks.cpp).
void checkOperands(Inst &I);

} // namespace detail

struct KernelImpl {
  std::string name;
  std::vector<std::pair<size_t, size_t>> params;
  std::map<std::string, size_t> paramOffset;
  size_t paramBytes = 0;
  std::vector<detail::Inst> code;
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

/// Sets every branch's reconvergence point: the immediate post-dominator of
/// its block, over basic blocks with a virtual exit (pc = code size) reached
/// by ret (PtxKernelChecks.cpp).
void computeReconvergence(KernelImpl &k);

/// Why `k` cannot be launched with these dimensions and a parameter buffer
/// of `paramBytes` (empty: it can); PtxKernelChecks.cpp.
std::string launchError(const KernelImpl &k, const LaunchDims &dims,
                        size_t paramBytes);

} // namespace flashopt::ptxemu

#endif // FLASHOPT_PTXEMU_PTXINTERNAL_H
