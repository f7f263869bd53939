/*
 * shm_wire.c: checking what the peer of a shm connection published at setup before anything is
 * opened, mapped or trusted: the receiver's blob (segment name and geometry), the control header
 * found in the mapped segment, and the sender's blob (its pid). Pure functions: shm_conn.c and
 * shm_segment.c call them, and so do the fuzz harnesses in tests/fuzz.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "shm.h"

/* The name shm_segment_create gives: "/chorus-shm-" and no other '/' (shm_open takes one
 * component under /dev/shm). */
#define SHM_NAME_PREFIX "/chorus-shm-"

const char *shm_recv_blob_problem(const shm_recv_blob_t *rb) {
    size_t len = strnlen(rb->name, sizeof(rb->name));
    if (len == sizeof(rb->name)) return "its segment name is not terminated";
    if (strncmp(rb->name, SHM_NAME_PREFIX, strlen(SHM_NAME_PREFIX)) != 0 ||
        strchr(rb->name + 1, '/') != NULL)
        return "its segment name is not a chorus segment";
    if (rb->nslots < 1 || rb->nslots > SHM_MAX_SLOTS) return "its slot count is out of range";
    if (rb->slot_bytes == 0 || rb->slot_bytes > SHM_MAX_SLOT_BYTES)
        return "its slot size is out of range";
    /* nslots <= SHM_MAX_SLOTS and slot_bytes <= SHM_MAX_SLOT_BYTES: no overflow below. */
    uint64_t want = (uint64_t)shm_ctrl_bytes((int)rb->nslots) + rb->nslots * rb->slot_bytes;
    if (rb->map_bytes != want) return "its segment size does not match its geometry";
    return NULL;
}

const char *shm_ctrl_problem(const shm_ctrl_t *ctrl, const shm_recv_blob_t *rb) {
    if (ctrl->magic != SHM_CTRL_MAGIC) return "bad magic";
    if (ctrl->nslots != rb->nslots || ctrl->slot_bytes != rb->slot_bytes)
        return "geometry differs from the receiver's blob";
    if (ctrl->data_offset != shm_ctrl_bytes((int)rb->nslots))
        return "data offset differs from the header size";
    return NULL;
}

const char *shm_send_blob_problem(const shm_send_blob_t *sb) {
    if (sb->pid == 0 || sb->pid > (uint32_t)INT_MAX) return "its pid is out of range";
    return NULL;
}
