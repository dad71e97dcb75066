/* The C ABI of a Kiln custom-op CPU kernel (see docs/custom-ops.md).
 *
 * A custom op's manifest may name a shared library and a symbol in its "cpu" section;
 * Kiln loads the library and calls the symbol, a function of type KilnKernelFn, once per
 * application of the op. The function may be called from several threads at once (on
 * different tensors): keep it free of unsynchronised global state. */
#ifndef KILN_CUSTOM_OP_H
#define KILN_CUSTOM_OP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor: `rank` dims in `dims`, elements row-major and contiguous at `data`.
 * `dtype` is ONNX's TensorProto.DataType: 1 float, 2 uint8, 3 int8, 4 uint16, 5 int16,
 * 6 int32, 7 int64, 9 bool, 10 float16, 11 double, 12 uint32, 13 uint64, 16 bfloat16.
 * Inputs are read-only; outputs arrive allocated with the dims of the manifest's shape
 * rule and filled with zeros, and the kernel writes them. */
typedef struct KilnTensorRef {
    void *data;
    int32_t dtype;
    int32_t rank;
    const int64_t *dims;
} KilnTensorRef;

/* An attribute, in the order of the manifest's "attributes". `kind` is ONNX's
 * AttributeProto.AttributeType: 1 float (`f`), 2 int (`i`), 3 string (`s`, NUL-terminated),
 * 6 floats (`floats`, `len` of them), 7 ints (`ints`, `len` of them). */
typedef struct KilnAttribute {
    const char *name;
    int32_t kind;
    int64_t i;
    double f;
    const char *s;
    const int64_t *ints;
    const double *floats;
    int64_t len;
} KilnAttribute;

/* Returns 0 on success. On failure, returns non-zero and writes a NUL-terminated message
 * of at most `error_capacity` bytes (including the NUL) to `error`; Kiln reports it with
 * the node's name. */
typedef int32_t (*KilnKernelFn)(const KilnTensorRef *inputs, int64_t n_inputs,
                                const KilnTensorRef *outputs, int64_t n_outputs,
                                const KilnAttribute *attributes, int64_t n_attributes,
                                char *error, int64_t error_capacity);

#ifdef __cplusplus
}
#endif

#endif /* KILN_CUSTOM_OP_H */
