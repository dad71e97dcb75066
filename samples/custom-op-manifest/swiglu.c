/* SwiGLU on the CPU, for Kiln's custom-op C ABI (include/kiln_custom_op.h).
 * Build: cc -O2 -shared -fPIC -I../../include swiglu.c -o libswiglu.so -lm */
#include <math.h>
#include <stdio.h>
#include "kiln_custom_op.h"

int32_t swiglu(const KilnTensorRef *inputs, int64_t n_inputs, const KilnTensorRef *outputs, int64_t n_outputs,
               const KilnAttribute *attributes, int64_t n_attributes, char *error, int64_t error_capacity) {
    if (n_inputs != 1 || n_outputs != 1 || inputs[0].dtype != 1 || inputs[0].rank != 2) {
        snprintf(error, (size_t)error_capacity, "expected one 2-D float input and one output");
        return 1;
    }
    double beta = 1.0;
    for (int64_t k = 0; k < n_attributes; k++)
        if (attributes[k].kind == 1) beta = attributes[k].f;
    const float *x = (const float *)inputs[0].data;
    float *y = (float *)outputs[0].data;
    int64_t rows = inputs[0].dims[0], width = inputs[0].dims[1], half = width / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < half; c++) {
            float a = x[r * width + c], b = x[r * width + half + c];
            y[r * half + c] = a / (1.0f + expf((float)(-beta) * a)) * b;
        }
    return 0;
}
