/*
 * fuzz_ring_order: CHORUS_RING_ORDER strings as topo_parse_order reads them for a communicator of
 * n ranks. Checks: success means the order is a permutation of 0..n-1 (the output array is
 * allocated at exactly n entries, so AddressSanitizer sees any write past it); anything else is
 * ncclInvalidArgument.
 *
 * Input: [n-1 (mod 256) + 1][text...]
 */
#include "fuzz_common.h"
#include "topology/topo_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    setenv("CHORUS_DEBUG_FILE", "/dev/null", 1); /* rejected orders WARN */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    int n = fuzz_u8(&in) + 1;
    char *text = fuzz_rest_str(&in);
    int *order = malloc(sizeof(int) * n);
    FUZZ_ASSERT(order != NULL);
    ncclResult_t res = topo_parse_order(text, n, order);
    FUZZ_ASSERT(res == ncclSuccess || res == ncclInvalidArgument);
    if (res == ncclSuccess) {
        char *seen = calloc(n, 1);
        FUZZ_ASSERT(seen != NULL);
        for (int i = 0; i < n; i++) {
            FUZZ_ASSERT(order[i] >= 0 && order[i] < n && !seen[order[i]]);
            seen[order[i]] = 1;
        }
        free(seen);
    }
    free(order);
    free(text);
    return 0;
}
