/*
 * algo_filter.c: which algorithms NCCL_ALGO / CHORUS_ALGO allow for a collective, in NCCL's
 * syntax, for the tuner (tuner.c).
 *
 *   spec     := section (';' section)*
 *   section  := list | function ':' list
 *   list     := ['^'] name (',' name)*        '^' makes the whole list an exclusion
 *
 * A list without a function applies to every collective; a function's own section replaces it
 * for that function ("ring,oneshot;allreduce:^ll": ring or one-shot everywhere, anything but
 * recursive doubling for all-reduce). Function names are NCCL's (allreduce, reducescatter,
 * allgather, broadcast, reduce); names are case-insensitive. Chorus's algorithms: ring, ll
 * (recursive doubling), oneshot, direct, tree and hier (all-reduce only; hier is Chorus's name
 * for its hierarchical all-reduce, which NCCL has no name for). NCCL's other algorithms
 * (collnetdirect, collnetchain, nvls, nvlstree, pat) are accepted and have no counterpart here:
 * a list that allows only those leaves the tuner's own choice, and says so. An unknown name is WARNed once
 * and ignored (NCCL fails the op; a variable copied from an NCCL job should not stop a Chorus
 * one). The older Chorus form with ',' between function sections ("allreduce:ll,broadcast:ring")
 * is still read: a name with a ':' starts a new section.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "coll_internal.h"
#include "log.h"
#include "param.h"

static const struct {
    const char *name;
    int id; /* COLL_ALGO_*, or -1: an NCCL algorithm Chorus does not have */
} algo_names[] = {
    {"ring", COLL_ALGO_RING},
    {"ll", COLL_ALGO_LL},
    {"oneshot", COLL_ALGO_ONESHOT},
    {"direct", COLL_ALGO_DIRECT},
    {"tree", COLL_ALGO_TREE},
    {"hier", COLL_ALGO_HIER},
    {"collnetdirect", -1},
    {"collnetchain", -1},
    {"collnet", -1},
    {"nvls", -1},
    {"nvlstree", -1},
    {"pat", -1},
};

/* One list ("ring,ll" or "^tree") into *f; names that are not algorithms are WARNed. */
static void filter_list(char *list, const char *spec, coll_algo_filter_t *f) {
    while (*list == ' ')
        list++;
    const int exclude = *list == '^';
    if (exclude) list++;
    unsigned named = 0;
    int foreign = 0;
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        size_t len = strlen(tok);
        while (len && tok[len - 1] == ' ')
            tok[--len] = 0;
        if (len == 0) continue;
        size_t i = 0, n = sizeof(algo_names) / sizeof(algo_names[0]);
        while (i < n && strcasecmp(tok, algo_names[i].name) != 0)
            i++;
        if (i == n) {
            /* Once per value of the variable: the spec is parsed per tuner pick, by every rank
             * thread of the process. */
            static pthread_mutex_t warned_lock = PTHREAD_MUTEX_INITIALIZER;
            static char warned[256];
            pthread_mutex_lock(&warned_lock);
            const int first = strncmp(warned, spec, sizeof(warned) - 1) != 0;
            if (first) snprintf(warned, sizeof(warned), "%s", spec);
            pthread_mutex_unlock(&warned_lock);
            if (first) {
                WARN("NCCL_ALGO/CHORUS_ALGO '%s': unknown algorithm '%s' ignored (Chorus has "
                     "ring, ll, oneshot, direct, tree, hier; NCCL's collnet*, nvls*, pat are "
                     "accepted and run Chorus's default)",
                     spec, tok);
            }
            continue;
        }
        if (algo_names[i].id < 0)
            foreign = 1;
        else
            named |= 1u << algo_names[i].id;
    }
    f->set = 1;
    f->allow = exclude ? COLL_ALLOW_ALL & ~named : named;
    f->foreign_only = !exclude && named == 0 && foreign;
}

void coll_algo_filter_parse(const char *spec, int coll, coll_algo_filter_t *f) {
    memset(f, 0, sizeof(*f));
    f->allow = COLL_ALLOW_ALL;
    if (spec == NULL || spec[0] == 0) return;
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s", spec);
    const char *fname = coll_kind_name(coll);
    /* Split into sections: at ';', and at ',' before a name that carries a function. */
    char *sections[32];
    int nsec = 0;
    char *p = tmp;
    sections[nsec++] = p;
    for (; *p && nsec < 32; p++) {
        if (*p == ';') {
            *p = 0;
            sections[nsec++] = p + 1;
        } else if (*p == ',') {
            const char *colon = strchr(p + 1, ':');
            const char *end = p + 1 + strcspn(p + 1, ",;");
            if (colon && colon < end) {
                *p = 0;
                sections[nsec++] = p + 1;
            }
        }
    }
    coll_algo_filter_t general = *f, own = *f;
    for (int s = 0; s < nsec; s++) {
        char *sec = sections[s];
        while (*sec == ' ')
            sec++;
        if (*sec == 0) continue;
        char *colon = strchr(sec, ':');
        if (colon == NULL) {
            filter_list(sec, spec, &general);
            continue;
        }
        *colon = 0;
        char *name = sec;
        size_t len = strlen(name);
        while (len && name[len - 1] == ' ')
            name[--len] = 0;
        if (strcasecmp(name, fname) == 0) filter_list(colon + 1, spec, &own);
    }
    *f = own.set ? own : general;
    if (f->foreign_only) {
        /* Only NCCL algorithms Chorus lacks: the tuner's own choice. */
        f->allow = COLL_ALLOW_ALL;
    }
}

void coll_algo_filter(int coll, coll_algo_filter_t *f) {
    coll_algo_filter_parse(chorus_param_str(PARAM_ALGO), coll, f);
}
