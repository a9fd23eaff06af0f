//===- StateEncodingInterface.td - how a state is stored ---*- tablegen -*-===//
//
// Part of flashopt. The attribute interface every state encoding implements.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_STATE_ENCODING_INTERFACE_TD
#define FLASHOPT_STATE_ENCODING_INTERFACE_TD

include "mlir/IR/OpBase.td"

def FlashOpt_StateEncodingInterface
    : AttrInterface<"StateEncodingAttrInterface"> {
  let cppNamespace = "::mlir::flashopt";
  let summary = "How an optimizer state is stored between steps";
  let description = [{
    A state encoding says which buffers a state needs per tensor, how a
    stored value turns into the f32 the update rule reads (decode) and how the
    rule's new f32 value is stored again (encode), and how a bundle's
    manifest describes it to the runtime. `flashopt-expand-encodings` and
    `flashopt-gen` ask only this interface, so a new encoding is one
    attribute implementing it (plus its spec spelling and the runtime codec;
    docs/ARCHITECTURE.md, "What a new encoding touches").

    The encodings of the dialect implement it: `#flashopt.quant` (codes plus
    one scale per group), `#flashopt.plain` (one float per element) and
    `#flashopt.elided` (nothing stored).

    ```mlir
    flashopt.state "exp_avg" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
    flashopt.state "exp_avg_sq" : #flashopt.plain<f32>
    flashopt.state "momentum_buffer" elidable("momentum") : #flashopt.elided
    ```

    With the first state, `getBuffers()` returns `.codes` (i8 per element)
    and `.scales` (f16 per group); `emitDecode` gets the loaded code and
    scale and returns the dequantized f32; `emitEncode` gets the new f32
    value and returns the code and the scale (the group absmax as
    `flashopt.group_max`).
  }];
  let methods = [
    InterfaceMethod<[{
        The buffers this encoding needs for each tensor, in ABI order. The
        kernel buffer of a state is named after the state plus the buffer's
        suffix (`exp_avg.codes`); every state buffer is read and written.
        An encoding that stores nothing returns no buffers.
      }],
      "::llvm::SmallVector<::mlir::flashopt::EncodingBuffer>", "getBuffers">,
    InterfaceMethod<[{
        The number of elements that share a per-group buffer value, or
        nullopt when the encoding has no per-group buffer. All grouped
        states of an optimizer share one group size; it is the kernel's.
      }],
      "std::optional<int64_t>", "getGroupSize", (ins), [{}],
      [{ return std::nullopt; }]>,
    InterfaceMethod<[{
        Emits the decode of one element at the builder's insertion point:
        `loaded` holds one value per buffer of getBuffers(), in that order
        (per-element buffers loaded with `flashopt.load_element` in their
        access type, per-group ones with `flashopt.load_group`). Returns
        the f32 value the update rule reads.
      }],
      "::mlir::Value", "emitDecode",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::Location":$loc,
           "::mlir::ValueRange":$loaded)>,
    InterfaceMethod<[{
        Emits the encode of the rule's new f32 `value` of one element and
        returns one value to store per buffer of getBuffers(), in that order
        (per-element values in the buffer's access type, per-group values in
        its storage type; reductions over the group as `flashopt.group_max`).
        `ditherStep` is the step count (i64) of the bounded numerics, whose
        codes round with the element's dither (a `flashopt.dither` of that
        step and of phase `ditherPhase`, which the encoding creates in the
        form it needs), or null for the FlashOptim numerics (round to
        nearest); an encoding that rounds to a code uses the dither in place
        of one half (docs/NUMERICS.md §8). Each state of an optimizer gets
        its own phase, so that the rounding errors of one element's states
        are uncorrelated (§8.3). `subnormalFree` asks for arithmetic that
        never produces a subnormal from normal operands (x86 takes a
        microcode assist for each), with the same bits (the CPU pipeline
        sets it; docs/NUMERICS.md §2d).
      }],
      "::llvm::SmallVector<::mlir::Value>", "emitEncode",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::Location":$loc,
           "::mlir::Value":$value, "::mlir::Value":$ditherStep,
           "int32_t":$ditherPhase, "bool":$subnormalFree)>,
    InterfaceMethod<[{
        Fills the encoding fields of a manifest state (the ABI library's
        model, abi/Manifest.h: kind, storage, group, compand, scale); the
        name and elidability are the caller's. This is the one place an
        encoding names itself to the runtime.
      }],
      "void", "describeInManifest",
      (ins "::flashopt::abi::StateSpec &":$state)>,
  ];
}

#endif // FLASHOPT_STATE_ENCODING_INTERFACE_TD
