/*
 * fuzz_shm_blob: what the shm transport takes from its peer at setup: the receiver's blob (segment
 * name, slot geometry, mapping size), the control header found in the mapped segment, and the
 * sender's blob (its pid, for the liveness probe and single copy). Checks: an accepted receiver
 * blob names a /chorus-shm- segment (terminated, one path component) whose size is exactly the
 * control header plus its slots; an accepted control header puts slot 0 right after the slot
 * headers, so slot headers and data stay inside the mapping (the header is allocated at the size
 * the blob promises, so AddressSanitizer sees any overrun); an accepted sender pid is a real pid.
 *
 * Input: [shm_recv_blob_t][shm_ctrl_t][shm_send_blob_t]
 */
#include <limits.h>

#include "fuzz_common.h"
#include "transport/shm/shm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    shm_recv_blob_t rb;
    fuzz_take(&in, &rb, sizeof(rb));
    shm_ctrl_t hdr;
    fuzz_take(&in, &hdr, sizeof(hdr));
    shm_send_blob_t sb;
    fuzz_take(&in, &sb, sizeof(sb));

    if (shm_send_blob_problem(&sb) == NULL) FUZZ_ASSERT(sb.pid > 0 && sb.pid <= (uint32_t)INT_MAX);

    if (shm_recv_blob_problem(&rb) != NULL) return 0;
    FUZZ_ASSERT(memchr(rb.name, '\0', sizeof(rb.name)) != NULL);
    FUZZ_ASSERT(strncmp(rb.name, "/chorus-shm-", 12) == 0 && strchr(rb.name + 1, '/') == NULL);
    FUZZ_ASSERT(rb.nslots >= 1 && rb.slot_bytes >= 1);
    size_t ctrl_bytes = shm_ctrl_bytes((int)rb.nslots);
    FUZZ_ASSERT(ctrl_bytes >= sizeof(shm_ctrl_t) + rb.nslots * sizeof(shm_slot_hdr_t));
    FUZZ_ASSERT(rb.map_bytes >= ctrl_bytes);
    FUZZ_ASSERT((rb.map_bytes - ctrl_bytes) / rb.nslots >= rb.slot_bytes);

    /* The mapped segment's control part, as big as the blob says it is. */
    shm_ctrl_t *ctrl = aligned_alloc(4096, ctrl_bytes);
    FUZZ_ASSERT(ctrl != NULL);
    memset(ctrl, 0, ctrl_bytes);
    memcpy(ctrl, &hdr, sizeof(hdr));
    if (shm_ctrl_problem(ctrl, &rb) == NULL) {
        FUZZ_ASSERT(ctrl->nslots == rb.nslots && ctrl->slot_bytes == rb.slot_bytes);
        FUZZ_ASSERT(ctrl->data_offset + (uint64_t)ctrl->nslots * ctrl->slot_bytes == rb.map_bytes);
        /* What the data path then touches: every slot header. */
        for (uint32_t s = 0; s < ctrl->nslots; s++)
            ((volatile char *)&ctrl->slots[s])[sizeof(shm_slot_hdr_t) - 1] = 1;
    }
    free(ctrl);
    return 0;
}
