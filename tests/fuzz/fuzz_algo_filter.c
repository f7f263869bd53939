/*
 * fuzz_algo_filter: NCCL_ALGO / CHORUS_ALGO strings as the tuner parses them
 * (coll_algo_filter_parse), for every collective. Checks: the allowed set only names Chorus's
 * algorithms; an unset or empty value allows all of them.
 */
#include "coll_internal.h"
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    setenv("CHORUS_DEBUG_FILE", "/dev/null", 1); /* unknown names WARN */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    char *spec = fuzz_rest_str(&in);
    for (int coll = 0; coll < COLL_NKINDS; coll++) {
        coll_algo_filter_t f;
        memset(&f, 0xa5, sizeof(f));
        coll_algo_filter_parse(spec, coll, &f);
        FUZZ_ASSERT((f.allow & ~COLL_ALLOW_ALL) == 0);
        if (spec[0] == '\0') FUZZ_ASSERT(f.allow == COLL_ALLOW_ALL);
    }
    free(spec);
    return 0;
}
