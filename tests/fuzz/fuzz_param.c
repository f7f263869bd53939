/*
 * fuzz_param: environment values as chorus_param_init reads them (param.c): one parameter of the
 * table, chosen by the first byte, set to the rest of the input through its CHORUS_ name, then
 * the whole table parsed again. Integers take K/M/G suffixes, strings are copied. Checks: the
 * parse either succeeds or fails with ncclInvalidArgument; a failed integer keeps its default; a
 * string reads back exactly as set; the value text of every parameter can be printed.
 *
 * Input: [parameter index (mod PARAM_COUNT)][value...]
 */
#include <sanitizer/lsan_interface.h>

#include "fuzz_common.h"
#include "param.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    /* A rejected value WARNs: keep the fuzzer's output readable. */
    setenv("CHORUS_DEBUG_FILE", "/dev/null", 1);
    /* Every parse keeps its strings (see above), so libFuzzer's per-input leak check would run a
     * full LeakSanitizer scan each time (100x slower): turn it off for this harness. */
    static char *args[256];
    int n = 0;
    for (int i = 0; i < *argc && n < 254; i++)
        args[n++] = (*argv)[i];
    args[n++] = "-detect_leaks=0";
    args[n] = NULL;
    *argc = n;
    *argv = args;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    chorus_param_id_t id = (chorus_param_id_t)(fuzz_u8(&in) % PARAM_COUNT);
    char *value = fuzz_rest_str(&in);
    char var[160];
    snprintf(var, sizeof(var), "CHORUS_%s", chorus_param_name(id));
    /* The debug variables would make every later input log. */
    if (strcmp(chorus_param_name(id), "DEBUG") == 0 ||
        strcmp(chorus_param_name(id), "DEBUG_SUBSYS") == 0 ||
        strcmp(chorus_param_name(id), "DEBUG_FILE") == 0) {
        free(value);
        return 0;
    }
    setenv(var, value, 1);
    /* Parsing keeps the strings of earlier parses alive on purpose (readers may hold them). */
    __lsan_disable();
    chorus_param_reset();
    ncclResult_t res = chorus_param_init();
    FUZZ_ASSERT(res == ncclSuccess || res == ncclInvalidArgument);
    char def[64], buf[64];
    if (chorus_param_is_int(id)) {
        if (res != ncclSuccess) {
            chorus_param_default_text(id, def, sizeof(def));
            chorus_param_value_text(id, buf, sizeof(buf));
            FUZZ_ASSERT(strcmp(def, buf) == 0);
        }
    } else {
        const char *got = chorus_param_str(id);
        FUZZ_ASSERT(got != NULL && strcmp(got, value) == 0);
    }
    for (int i = 0; i < PARAM_COUNT; i++)
        chorus_param_value_text((chorus_param_id_t)i, buf, sizeof(buf));
    unsetenv(var);
    chorus_param_reset();
    (void)chorus_param_init();
    __lsan_enable();
    free(value);
    return 0;
}
