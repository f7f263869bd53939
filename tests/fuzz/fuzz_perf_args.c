/*
 * fuzz_perf_args: command lines of the perf binaries (all_reduce_perf & co.) as perf_args_parse
 * reads them: the input split at NUL bytes into argv. Checks: the parse succeeds, asks for help,
 * or fails with a message; a successful parse gives a size sweep that starts at -b, never passes
 * -e and strictly grows, and a parameter line that fits its buffer.
 *
 * Input: arguments separated by NUL bytes (argv[0] is added).
 */
#include "fuzz_common.h"
#include "perf.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    FUZZ_ASSERT(buf != NULL);
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "all_reduce_perf";
    for (size_t off = 0; off < size && argc < MAX_ARGS; off += strlen(buf + off) + 1)
        argv[argc++] = buf + off;
    argv[argc] = NULL;

    perf_args_t a;
    perf_args_default(&a);
    char err[256];
    err[0] = '\0';
    int rc = perf_args_parse(argc, argv, &a, err, sizeof(err));
    FUZZ_ASSERT(rc == 0 || rc == 1 || rc == -1);
    if (rc == -1) FUZZ_ASSERT(err[0] != '\0' && strlen(err) < sizeof(err));
    if (rc == 0) {
        size_t sizes[128];
        int n = perf_args_sizes(&a, sizes, 128);
        FUZZ_ASSERT(n >= 0 && n <= 128);
        for (int i = 0; i < n; i++) {
            FUZZ_ASSERT(sizes[i] <= a.max_bytes);
            FUZZ_ASSERT(i == 0 ? sizes[i] == a.min_bytes : sizes[i] > sizes[i - 1]);
        }
        char line[512];
        int len = perf_fmt_params_line(line, sizeof(line), &a);
        FUZZ_ASSERT(len < (int)sizeof(line));
    }
    free(buf);
    return 0;
}
