//===- FlashOptAttrs.td - flashopt encoding attributes -----*- tablegen -*-===//
//
// Part of flashopt. Attributes that say how a value is stored.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ATTRS_TD
#define FLASHOPT_ATTRS_TD

include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "flashopt/Dialect/FlashOpt/IR/StateEncodingInterface.td"

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def FlashOpt_CompanderNone : I32EnumAttrCase<"none", 0>;
def FlashOpt_CompanderSoftsign : I32EnumAttrCase<"softsign", 1>;
def FlashOpt_CompanderSqrt : I32EnumAttrCase<"sqrt", 2>;
def FlashOpt_CompanderE3M4 : I32EnumAttrCase<"e3m4", 3>;
def FlashOpt_CompanderE4M4 : I32EnumAttrCase<"e4m4", 4>;
def FlashOpt_CompanderE2M1 : I32EnumAttrCase<"e2m1", 5>;
def FlashOpt_CompanderE3M0 : I32EnumAttrCase<"e3m0", 6>;
def FlashOpt_CompanderE3M1 : I32EnumAttrCase<"e3m1", 7>;
def FlashOpt_CompanderE4M0 : I32EnumAttrCase<"e4m0", 8>;
def FlashOpt_Compander : I32EnumAttr<"Compander",
    "companding function or code format of a quantized state",
    [FlashOpt_CompanderNone, FlashOpt_CompanderSoftsign, FlashOpt_CompanderSqrt,
     FlashOpt_CompanderE3M4, FlashOpt_CompanderE4M4, FlashOpt_CompanderE2M1,
     FlashOpt_CompanderE3M0, FlashOpt_CompanderE3M1,
     FlashOpt_CompanderE4M0]> {
  let cppNamespace = "::mlir::flashopt";
  let genSpecializedAttr = 0;
}

def FlashOpt_EnvelopeMax : I32EnumAttrCase<"max", 0>;
def FlashOpt_EnvelopeMin : I32EnumAttrCase<"min", 1>;
def FlashOpt_Envelope : I32EnumAttr<"Envelope",
    "which running extreme of a hyper-parameter an envelope hyper-parameter keeps",
    [FlashOpt_EnvelopeMax, FlashOpt_EnvelopeMin]> {
  let cppNamespace = "::mlir::flashopt";
}

def FlashOpt_RateElement : I32EnumAttrCase<"element", 0>;
def FlashOpt_RateGroup : I32EnumAttrCase<"group", 1>;
def FlashOpt_BufferRate : I32EnumAttr<"BufferRate",
    "whether a kernel buffer holds one value per element or per group",
    [FlashOpt_RateElement, FlashOpt_RateGroup]> {
  let cppNamespace = "::mlir::flashopt";
  let genSpecializedAttr = 0;
}

def FlashOpt_AccessRead : I32EnumAttrCase<"read", 0>;
def FlashOpt_AccessReadWrite : I32EnumAttrCase<"readwrite", 1>;
def FlashOpt_BufferAccess : I32EnumAttr<"BufferAccess",
    "whether a kernel reads or reads and writes a buffer",
    [FlashOpt_AccessRead, FlashOpt_AccessReadWrite]> {
  let cppNamespace = "::mlir::flashopt";
  let genSpecializedAttr = 0;
}

// The compiler's modes: typed attributes of the ops they govern, spelled as
// `arith`'s fastmath is (`numerics<flashoptim>` in an op's own syntax,
// `#flashopt.numerics<flashoptim>` in a generic attribute dictionary), and
// checked by ODS when parsed.

def FlashOpt_NumericsBounded : I32EnumAttrCase<"Bounded", 0, "bounded">;
def FlashOpt_NumericsFlashOptim : I32EnumAttrCase<"FlashOptim", 1, "flashoptim">;
def FlashOpt_Numerics : I32EnumAttr<"Numerics",
    "the numerics of an optimizer (bounded or flashoptim; docs/NUMERICS.md §8)",
    [FlashOpt_NumericsBounded, FlashOpt_NumericsFlashOptim]> {
  let cppNamespace = "::mlir::flashopt";
  let genSpecializedAttr = 0;
}
def FlashOpt_NumericsAttr : EnumAttr<FlashOpt_Dialect, FlashOpt_Numerics,
                                     "numerics"> {
  let assemblyFormat = "`<` $value `>`";
}

def FlashOpt_ArithmeticExact : I32EnumAttrCase<"Exact", 0, "exact">;
def FlashOpt_ArithmeticFast : I32EnumAttrCase<"Fast", 1, "fast">;
def FlashOpt_Arithmetic : I32EnumAttr<"Arithmetic",
    "the arithmetic of an optimizer or kernel (exact or fast; docs/NUMERICS.md §7)",
    [FlashOpt_ArithmeticExact, FlashOpt_ArithmeticFast]> {
  let cppNamespace = "::mlir::flashopt";
  let genSpecializedAttr = 0;
}
def FlashOpt_ArithmeticAttr : EnumAttr<FlashOpt_Dialect, FlashOpt_Arithmetic,
                                       "arithmetic"> {
  let assemblyFormat = "`<` $value `>`";
}

// The kinds of ::flashopt::abi::KernelKind by the same names
// (docs/KERNEL-ABI.md "Gradient accumulation"; the driver converts by name).
def FlashOpt_KernelStep : I32EnumAttrCase<"Step", 0, "step">;
def FlashOpt_KernelAccumulate : I32EnumAttrCase<"Accumulate", 1, "accumulate">;
def FlashOpt_KernelStepAccumulated
    : I32EnumAttrCase<"StepAccumulated", 2, "step_accumulated">;
def FlashOpt_KernelStepFused : I32EnumAttrCase<"StepFused", 3, "step_fused">;
def FlashOpt_KernelKind : I32EnumAttr<"KernelKind",
    "the kind of a kernel (step, accumulate, step_accumulated or step_fused)",
    [FlashOpt_KernelStep, FlashOpt_KernelAccumulate,
     FlashOpt_KernelStepAccumulated, FlashOpt_KernelStepFused]> {
  let cppNamespace = "::mlir::flashopt";
  let genSpecializedAttr = 0;
}
def FlashOpt_KernelKindAttr : EnumAttr<FlashOpt_Dialect, FlashOpt_KernelKind,
                                       "kernel_kind"> {
  let assemblyFormat = "`<` $value `>`";
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

class FlashOpt_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<FlashOpt_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def FlashOpt_MasterAttr : FlashOpt_Attr<"Master", "master"> {
  let summary = "How the master weight is stored: a parameter plus a correction";
  let description = [{
    The parameter dtype (`bf16`, `f16` or `f32`) and an optional correction
    term (`i8` for 24-bit master weights, `i16` for 32-bit ones) holding the
    ULP-normalized rounding error of the parameter (FlashOptim §3.1). `f32`
    parameters take no correction.

    ```mlir
    #flashopt.master<bf16, correction = i8>
    #flashopt.master<f32>
    ```
  }];
  let parameters = (ins "::mlir::Type":$paramType,
                        OptionalParameter<"::mlir::Type">:$correction);
  let assemblyFormat = "`<` $paramType (`,` `correction` `=` $correction^)? `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Whether a correction term is stored.
    bool hasCorrection() const { return static_cast<bool>(getCorrection()); }
  }];
}

/// An encoding of optimizer states: implements StateEncodingAttrInterface
/// (in lib/Dialect/FlashOpt/IR/StateEncodings.cpp).
class FlashOpt_StateEncoding<string name, string attrMnemonic,
                             list<string> overriddenMethods = []>
    : FlashOpt_Attr<name, attrMnemonic, [
        DeclareAttrInterfaceMethods<FlashOpt_StateEncodingInterface,
                                    overriddenMethods>]>;

def FlashOpt_QuantAttr
    : FlashOpt_StateEncoding<"Quant", "quant", ["getGroupSize"]> {
  let summary = "An 8- or 4-bit companded state with one scale per group";
  let description = [{
    Codes in `i8` (signed, 127 levels each side) or `ui8` (unsigned, 255
    levels), one scale per group of `group` elements (a power of two in
    [16, 128]) stored as `f16`, `bf16` or `f32`, and a compander applied
    before quantization: `softsign` (2x/(1+|x|), signed only), `sqrt`
    (unsigned only) or `none` — FlashOptim's linear codes of the companded
    value over the group absmax (docs/NUMERICS.md §2) — or a minifloat
    code with subnormals, a code times the group scale, the scale being the
    absmax over the top code's value rounded up to the scale type: `e3m4`
    (signed only: a sign, 3 exponent and 4 mantissa bits) or `e4m4`
    (unsigned only, zero-free: code 0 decodes as half the smallest
    subnormal) (docs/NUMERICS.md §2d, the bounded numerics' codebooks).

    4-bit codes (docs/NUMERICS.md §2e) are `i4` or `ui4`, packed two per
    byte in memory (docs/KERNEL-ABI.md), and take a 4-bit minifloat: `e2m1`
    or `e3m0` (signed, `i4`), `e3m1` or `e4m0` (unsigned, zero-free, `ui4`);
    an 8-bit code takes one of the companders above, never a 4-bit format.

    ```mlir
    #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
    #flashopt.quant<ui8, group = 32, compand = sqrt, scale = f16>
    #flashopt.quant<i8, group = 32, compand = e3m4, scale = bf16>
    #flashopt.quant<ui8, group = 32, compand = e4m4, scale = bf16>
    #flashopt.quant<i4, group = 32, compand = e2m1, scale = bf16>
    #flashopt.quant<ui4, group = 32, compand = e3m1, scale = bf16>
    ```
  }];
  let parameters = (ins "::mlir::Type":$storage, "int64_t":$group,
                        EnumParameter<FlashOpt_Compander>:$compand,
                        "::mlir::Type":$scale);
  let assemblyFormat = [{
    `<` $storage `,` `group` `=` $group `,` `compand` `=` $compand `,`
        `scale` `=` $scale `>`
  }];
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Whether the codes are signed (i8, i4).
    bool isSigned() const;
    /// The width of a code: 8 or 4.
    unsigned getCodeBits() const { return getStorage().getIntOrFloatBitWidth(); }
    /// The largest code magnitude of the linear companders (8-bit codes
    /// only): 127 (i8) or 255 (ui8).
    int64_t getMaxCode() const { return isSigned() ? 127 : 255; }
    /// The format of a minifloat compander (e3m4, e4m4, e2m1, e3m0, e3m1,
    /// e4m0).
    ::flashopt::abi::MinifloatFormat getMinifloatFormat() const;
    /// The minifloat decode and encode (docs/NUMERICS.md §2d).
    ::mlir::Value emitMinifloatDecode(::mlir::OpBuilder &b,
                                      ::mlir::Location loc,
                                      ::mlir::Value code,
                                      ::mlir::Value scale) const;
    ::llvm::SmallVector<::mlir::Value>
    emitMinifloatEncode(::mlir::OpBuilder &b, ::mlir::Location loc,
                        ::mlir::Value x, ::mlir::Value ditherStep,
                        int32_t ditherPhase, bool subnormalFree) const;
  }];
}

def FlashOpt_PlainAttr : FlashOpt_StateEncoding<"Plain", "plain"> {
  let summary = "A state stored as plain floats";
  let description = [{
    The state is stored element by element as `f32`, `bf16` or `f16`
    (round-to-nearest-even when narrower than f32).

    ```mlir
    #flashopt.plain<f32>
    ```
  }];
  let parameters = (ins "::mlir::Type":$storage);
  let assemblyFormat = "`<` $storage `>`";
  let genVerifyDecl = 1;
}

def FlashOpt_ElidedAttr : FlashOpt_StateEncoding<"Elided", "elided"> {
  let summary = "A state that is not stored at all";
  let description = [{
    The state reads as 0.0 on every step and its new value is discarded.
    Only a state declared `elidable("hyper")` may be elided, and the runtime
    then requires that hyper-parameter to be 0 (SGD without momentum).

    ```mlir
    #flashopt.elided
    ```
  }];
}

def FlashOpt_BufferAttr : FlashOpt_Attr<"Buffer", "buffer"> {
  let summary = "One buffer of a kernel's per-tensor ABI";
  let description = [{
    A named buffer that every tensor of a kernel has: its element type, whether
    it holds one value per element or per group, and whether the kernel writes
    it. The order of a kernel's buffers is its ABI (docs/KERNEL-ABI.md).

    ```mlir
    #flashopt.buffer<"exp_avg.scales", f16, group, readwrite>
    ```
  }];
  let parameters = (ins StringRefParameter<"buffer name">:$name,
                        "::mlir::Type":$elementType,
                        EnumParameter<FlashOpt_BufferRate>:$rate,
                        EnumParameter<FlashOpt_BufferAccess>:$access);
  let assemblyFormat = "`<` $name `,` $elementType `,` $rate `,` $access `>`";
  let genVerifyDecl = 1;
}


/// A state's encoding: any attribute implementing StateEncodingAttrInterface.
/// Stored as a plain attribute so that anything else parses and is then
/// rejected by the verifier with this summary; the getter returns the
/// interface.
def FlashOpt_StateEncodingAttr : Attr<
    CPred<"::llvm::isa<::mlir::flashopt::StateEncodingAttrInterface>($_self)">,
    "a state encoding (#flashopt.quant, #flashopt.plain, #flashopt.elided or "
    "another attribute implementing StateEncodingAttrInterface)"> {
  let returnType = "::mlir::flashopt::StateEncodingAttrInterface";
  let convertFromStorage =
      "::llvm::cast<::mlir::flashopt::StateEncodingAttrInterface>($_self)";
}

#endif // FLASHOPT_ATTRS_TD
