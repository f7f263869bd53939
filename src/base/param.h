/*
 * param.h: typed access to the parameter table (param_table.h).
 *
 * chorus_param_init() parses the environment once per process (again after
 * chorus_param_reset()); a malformed value fails it with a WARN naming the variable.
 */
#ifndef CHORUS_PARAM_H_
#define CHORUS_PARAM_H_

#include <stdint.h>
#include "nccl.h"

typedef enum {
#define PARAM(name, type, def, alias, help) PARAM_##name,
#include "param_table.h"
#undef PARAM
    PARAM_COUNT
} chorus_param_id_t;

typedef enum { PARAM_SRC_DEFAULT = 0, PARAM_SRC_ENV_CHORUS, PARAM_SRC_ENV_NCCL, PARAM_SRC_API } chorus_param_src_t;

ncclResult_t chorus_param_init(void);
void chorus_param_reset(void);
int64_t chorus_param_int(chorus_param_id_t id);
const char *chorus_param_str(chorus_param_id_t id); /* NULL when unset */
/* Nonzero, and different after every parse (chorus_param_reset): whoever caches a choice made
 * from parameter values keeps it only while this stays the same. */
uint64_t chorus_param_generation(void);
/* Introspection for chorus_info --params and the README table. */
const char *chorus_param_name(chorus_param_id_t id);
const char *chorus_param_help(chorus_param_id_t id);
const char *chorus_param_value_text(chorus_param_id_t id, char *buf, int len);
chorus_param_src_t chorus_param_source(chorus_param_id_t id);
int chorus_param_is_int(chorus_param_id_t id);
const char *chorus_param_default_text(chorus_param_id_t id, char *buf, int len);
int chorus_param_has_nccl_alias(chorus_param_id_t id);
const char *chorus_param_source_name(chorus_param_src_t src);
/* The valid range of an INT parameter (param_table.h's PARAM_RANGE): 1 and *min_p, *max_p, or 0
 * where it has none (STR parameters). */
int chorus_param_range(chorus_param_id_t id, int64_t *min_p, int64_t *max_p);

/* Variables that belong to other programs (torchrun, mpirun, srun, the host). All environment
 * reading goes through param.c; this is the door for names that are not Chorus parameters. */
const char *chorus_env_foreign(const char *name);

#endif
