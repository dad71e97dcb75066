/* Runs a model through Kiln's C API, as an application would:
 *   run_model MODEL INPUT.bin OUTPUT.bin DEVICE
 * Opens MODEL from its file and from memory, lists its inputs and outputs, feeds the
 * first input from INPUT.bin (raw bytes of its dtype and fixed dims), writes the first
 * output's raw bytes to OUTPUT.bin, and checks that mistakes come back as status codes
 * with messages. Exits 0 when all went as expected. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln.h"

static int fail(const char *what, KilnStatus s) {
    fprintf(stderr, "%s: status %d: %s\n", what, (int)s, kiln_last_error());
    return 1;
}

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(buf, 1, (size_t)n, f);
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL INPUT.bin OUTPUT.bin DEVICE\n", argv[0]);
        return 2;
    }
    printf("kiln %s\n", kiln_version());
    KilnSessionOptions options = kiln_session_options_default();
    options.device = argv[4];
    options.threads = 2;

    KilnSession *session = NULL;
    KilnStatus s = kiln_session_create_from_file(argv[1], &options, &session);
    if (s != KILN_STATUS_OK) return fail("create_from_file", s);
    printf("device: %s\n", kiln_session_device(session));

    KilnValueInfo input = {0}, output = {0};
    for (size_t i = 0; i < kiln_session_input_count(session); i++) {
        KilnValueInfo v;
        if ((s = kiln_session_input_info(session, i, &v)) != KILN_STATUS_OK) return fail("input_info", s);
        printf("input %zu: %s dtype %d rank %d\n", i, v.name, v.dtype, v.rank);
        if (i == 0) input = v;
    }
    for (size_t i = 0; i < kiln_session_output_count(session); i++) {
        KilnValueInfo v;
        if ((s = kiln_session_output_info(session, i, &v)) != KILN_STATUS_OK) return fail("output_info", s);
        printf("output %zu: %s dtype %d rank %d\n", i, v.name, v.dtype, v.rank);
        if (i == 0) output = v;
    }

    size_t in_len = 0;
    void *in_data = read_file(argv[2], &in_len);
    if (!in_data) { fprintf(stderr, "cannot read %s\n", argv[2]); return 1; }
    KilnTensor in = {0};
    in.name = input.name;
    in.dtype = input.dtype;
    in.rank = input.rank;
    memcpy(in.dims, input.dims, sizeof in.dims);
    in.data = in_data;
    in.byte_size = in_len;

    /* A buffer too small: the status says so and byte_size says what is needed. */
    float tiny[1];
    KilnTensor out = {0};
    out.name = output.name;
    out.data = tiny;
    out.byte_size = 1;
    s = kiln_session_run(session, &in, 1, &out, 1);
    if (s != KILN_STATUS_BUFFER_TOO_SMALL) return fail("expected BUFFER_TOO_SMALL", s);
    printf("output needs %zu bytes (rank %d)\n", out.byte_size, out.rank);

    out.data = malloc(out.byte_size);
    if ((s = kiln_session_run(session, &in, 1, &out, 1)) != KILN_STATUS_OK) return fail("run", s);

    /* The same model from memory gives the same bytes. */
    size_t model_len = 0;
    void *model = read_file(argv[1], &model_len);
    KilnSession *from_memory = NULL;
    if ((s = kiln_session_create_from_memory(model, model_len, &options, &from_memory)) != KILN_STATUS_OK) return fail("create_from_memory", s);
    free(model);
    KilnTensor out2 = out;
    out2.name = NULL; /* by position */
    out2.data = malloc(out.byte_size);
    if ((s = kiln_session_run(from_memory, &in, 1, &out2, 1)) != KILN_STATUS_OK) return fail("run from memory", s);
    if (memcmp(out.data, out2.data, out.byte_size) != 0) { fprintf(stderr, "the session from memory disagrees\n"); return 1; }
    kiln_session_free(from_memory);

    /* Mistakes are status codes with messages, never crashes. */
    KilnTensor wrong = in;
    wrong.name = "no_such_input";
    s = kiln_session_run(session, &wrong, 1, &out2, 1);
    if (s != KILN_STATUS_INPUT || !strstr(kiln_last_error(), "no_such_input")) return fail("expected INPUT for a wrong name", s);
    printf("wrong name: %s\n", kiln_last_error());
    wrong = in;
    wrong.byte_size = in.byte_size - 4;
    s = kiln_session_run(session, &wrong, 1, &out2, 1);
    if (s != KILN_STATUS_INPUT || !strstr(kiln_last_error(), "byte_size")) return fail("expected INPUT for a short buffer", s);
    KilnSession *none = NULL;
    s = kiln_session_create_from_file("/no/such/model.onnx", &options, &none);
    if (s != KILN_STATUS_MODEL || none != NULL) return fail("expected MODEL for a missing file", s);
    printf("missing file: %s\n", kiln_last_error());
    s = kiln_session_input_info(NULL, 0, &input);
    if (s != KILN_STATUS_INVALID_ARGUMENT) return fail("expected INVALID_ARGUMENT for a NULL session", s);

    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(out.data, 1, out.byte_size, f) != out.byte_size) { fprintf(stderr, "cannot write %s\n", argv[3]); return 1; }
    fclose(f);
    kiln_session_free(session);
    free(in_data);
    free(out.data);
    free(out2.data);
    printf("ok\n");
    return 0;
}
