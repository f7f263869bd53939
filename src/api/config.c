/*
 * config.c: ncclConfig_t, read with NCCL's version-tolerant rules.
 *
 * A program built against an older nccl.h passes a smaller struct whose leading size, magic and
 * version say what it holds. We read that header first (every NCCL version has it), reject a
 * struct not made with NCCL_CONFIG_INITIALIZER (wrong magic), copy min(size, sizeof) bytes over a
 * default-initialised struct, reset the fields that the caller's header version did not have,
 * validate what is set (a WARN names the field), fill defaults for NCCL_CONFIG_UNDEF values and
 * apply the environment overrides NCCL has (NCCL_COMM_BLOCKING, NCCL_NET). As in NCCL, the
 * environment overrides the config for these two knobs: that is what users of NCCL expect when
 * they set NCCL_COMM_BLOCKING to debug a program.
 *
 * What the fields mean to Chorus: blocking as in NCCL; maxCTAs caps the number of channels
 * (rings), the analogue of NCCL's CTAs (minCTAs is validated; the topology picks the channel count
 * at or above CHORUS_MIN_NCHANNELS); commName and netName are copied into the comm;
 * the GPU-kernel knobs (cgaClusterSize, CTAPolicy, nvlsCTAs, collnetEnable, nvlinkCentricSched,
 * nChannelsPerNetPeer, trafficClass) and splitShare/shrinkShare are validated and kept, and have
 * no effect (a Chorus child communicator never shares resources with its parent).
 */
#include <stddef.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "param.h"

#define CFG_MAGIC 0xcafebeefu
#define CFG_UNDEF NCCL_CONFIG_UNDEF_INT
/* The smallest config any NCCL header ever produced holds size, magic and version. */
#define CFG_HEADER_BYTES (offsetof(ncclConfig_t, version) + sizeof(unsigned int))

static void cfg_undef(ncclConfig_t *c) {
    ncclConfig_t d = NCCL_CONFIG_INITIALIZER;
    *c = d;
}

/* Reset the fields a header of version `v` did not have (NCCL_VERSION codes). */
static void cfg_reset_newer(ncclConfig_t *c, unsigned int v) {
    if (v < (unsigned)NCCL_VERSION(2, 14, 0)) c->blocking = CFG_UNDEF;
    if (v < (unsigned)NCCL_VERSION(2, 17, 0)) {
        c->cgaClusterSize = CFG_UNDEF;
        c->minCTAs = CFG_UNDEF;
        c->maxCTAs = CFG_UNDEF;
        c->netName = NCCL_CONFIG_UNDEF_PTR;
    }
    if (v < (unsigned)NCCL_VERSION(2, 25, 0)) c->trafficClass = CFG_UNDEF;
    if (v < (unsigned)NCCL_VERSION(2, 27, 0)) {
        c->collnetEnable = CFG_UNDEF;
        c->CTAPolicy = CFG_UNDEF;
        c->shrinkShare = CFG_UNDEF;
        c->nvlsCTAs = CFG_UNDEF;
    }
    if (v < (unsigned)NCCL_VERSION(2, 28, 0)) {
        c->nChannelsPerNetPeer = CFG_UNDEF;
        c->nvlinkCentricSched = CFG_UNDEF;
    }
}

#define CFG_BOOL(field)                                                                            \
    ARGCHECK(c->field == CFG_UNDEF || c->field == 0 || c->field == 1,                              \
             "ncclConfig_t." #field " must be 0 or 1 (got %d)", c->field)

static ncclResult_t cfg_validate(const ncclConfig_t *c) {
    CFG_BOOL(blocking);
    CFG_BOOL(splitShare);
    CFG_BOOL(shrinkShare);
    CFG_BOOL(collnetEnable);
    CFG_BOOL(nvlinkCentricSched);
    ARGCHECK(c->cgaClusterSize == CFG_UNDEF || c->cgaClusterSize >= 0,
             "ncclConfig_t.cgaClusterSize must be >= 0 (got %d)", c->cgaClusterSize);
    ARGCHECK(c->minCTAs == CFG_UNDEF || c->minCTAs > 0, "ncclConfig_t.minCTAs must be > 0 (got %d)",
             c->minCTAs);
    ARGCHECK(c->maxCTAs == CFG_UNDEF || c->maxCTAs > 0, "ncclConfig_t.maxCTAs must be > 0 (got %d)",
             c->maxCTAs);
    ARGCHECK(c->minCTAs == CFG_UNDEF || c->maxCTAs == CFG_UNDEF || c->minCTAs <= c->maxCTAs,
             "ncclConfig_t.minCTAs (%d) must be <= ncclConfig_t.maxCTAs (%d)", c->minCTAs,
             c->maxCTAs);
    ARGCHECK(c->trafficClass == CFG_UNDEF || c->trafficClass >= 0,
             "ncclConfig_t.trafficClass must be >= 0 (got %d)", c->trafficClass);
    ARGCHECK(c->CTAPolicy == CFG_UNDEF ||
                 (c->CTAPolicy >= 0 &&
                  (c->CTAPolicy & ~(NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO)) == 0),
             "ncclConfig_t.CTAPolicy has unknown bits (got 0x%x)", c->CTAPolicy);
    ARGCHECK(c->nvlsCTAs == CFG_UNDEF || c->nvlsCTAs > 0,
             "ncclConfig_t.nvlsCTAs must be > 0 (got %d)", c->nvlsCTAs);
    ARGCHECK(c->nChannelsPerNetPeer == CFG_UNDEF ||
                 (c->nChannelsPerNetPeer > 0 && c->nChannelsPerNetPeer <= 64),
             "ncclConfig_t.nChannelsPerNetPeer must be in 1..64 (got %d)", c->nChannelsPerNetPeer);
    return ncclSuccess;
}

static void cfg_defaults(ncclConfig_t *c) {
    if (c->blocking == CFG_UNDEF) c->blocking = 1;
    if (c->cgaClusterSize == CFG_UNDEF) c->cgaClusterSize = 4;
    if (c->minCTAs == CFG_UNDEF) c->minCTAs = 1;
    if (c->maxCTAs == CFG_UNDEF) c->maxCTAs = CHORUS_MAXCHANNELS;
    if (c->splitShare == CFG_UNDEF) c->splitShare = 0;
    if (c->trafficClass == CFG_UNDEF) c->trafficClass = 0;
    if (c->collnetEnable == CFG_UNDEF) c->collnetEnable = 0;
    if (c->CTAPolicy == CFG_UNDEF) c->CTAPolicy = NCCL_CTA_POLICY_DEFAULT;
    if (c->shrinkShare == CFG_UNDEF) c->shrinkShare = 0;
    if (c->nvlsCTAs == CFG_UNDEF) c->nvlsCTAs = 1;
    if (c->nChannelsPerNetPeer == CFG_UNDEF) c->nChannelsPerNetPeer = 1;
    if (c->nvlinkCentricSched == CFG_UNDEF) c->nvlinkCentricSched = 0;
    if (c->maxCTAs < c->minCTAs) c->maxCTAs = c->minCTAs; /* only minCTAs was given */
}

static ncclResult_t cfg_env_override(ncclConfig_t *c) {
    int64_t b = chorus_param_int(PARAM_COMM_BLOCKING);
    if (chorus_param_source(PARAM_COMM_BLOCKING) != PARAM_SRC_DEFAULT) {
        if (b != 0 && b != 1) {
            WARN("invalid value %lld for NCCL_COMM_BLOCKING: expected 0 or 1", (long long)b);
            return ncclInvalidArgument;
        }
        c->blocking = (int)b;
    }
    const char *net = chorus_param_str(PARAM_NET);
    if (net != NULL && net[0] != '\0') c->netName = net;
    return ncclSuccess;
}

ncclResult_t comm_config_parse(const ncclConfig_t *user, const ncclConfig_t *inherit,
                               ncclConfig_t *out_p) {
    ncclConfig_t c;
    CHECK(chorus_param_init());
    if (user == NULL) {
        if (inherit) {
            *out_p = *inherit;
            return ncclSuccess;
        }
        cfg_undef(&c);
    } else {
        /* Read the header fields one by one: they are present in every version. */
        size_t size;
        unsigned int magic, version;
        memcpy(&size, (const char *)user + offsetof(ncclConfig_t, size), sizeof(size));
        memcpy(&magic, (const char *)user + offsetof(ncclConfig_t, magic), sizeof(magic));
        memcpy(&version, (const char *)user + offsetof(ncclConfig_t, version), sizeof(version));
        ARGCHECK(magic == CFG_MAGIC,
                 "ncclConfig_t argument not initialized with NCCL_CONFIG_INITIALIZER "
                 "(magic 0x%x, expected 0x%x)",
                 magic, CFG_MAGIC);
        ARGCHECK(size >= CFG_HEADER_BYTES, "ncclConfig_t.size %zu is too small (< %zu)", size,
                 (size_t)CFG_HEADER_BYTES);
        cfg_undef(&c);
        memcpy(&c, user, CHORUS_MIN(size, sizeof(c)));
        cfg_reset_newer(&c, version);
        /* A smaller struct from an older header: the fields past its end keep UNDEF (the copy
         * above did not touch them), and then take defaults like any unset field. */
        if (inherit) {
            /* Split/shrink: unset fields come from the parent. */
#define INHERIT(f)                                                                                 \
    if (c.f == CFG_UNDEF) c.f = inherit->f
            INHERIT(blocking);
            INHERIT(cgaClusterSize);
            INHERIT(minCTAs);
            INHERIT(maxCTAs);
            INHERIT(splitShare);
            INHERIT(trafficClass);
            INHERIT(collnetEnable);
            INHERIT(CTAPolicy);
            INHERIT(shrinkShare);
            INHERIT(nvlsCTAs);
            INHERIT(nChannelsPerNetPeer);
            INHERIT(nvlinkCentricSched);
#undef INHERIT
            if (c.netName == NCCL_CONFIG_UNDEF_PTR) c.netName = inherit->netName;
        }
    }
    CHECK(cfg_validate(&c));
    cfg_defaults(&c);
    CHECK(cfg_env_override(&c));
    c.size = sizeof(c);
    c.magic = CFG_MAGIC;
    c.version = NCCL_VERSION_CODE;
    *out_p = c;
    return ncclSuccess;
}
