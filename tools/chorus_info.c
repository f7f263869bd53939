/*
 * chorus_info: what Chorus sees on this machine.
 *
 *   chorus_info --params            every parameter: the variable to set, its value now and where
 *                                   that value came from (default, CHORUS_ env, NCCL_ env)
 *   chorus_info --params --markdown the parameter table of docs/parameters.md (name, NCCL alias, type, default, meaning),
 *                                   built from defaults only, so it does not depend on the caller's
 *                                   environment; scripts/gen_param_table.sh uses it
 *   chorus_info --topo [--xml F]    topology discovery (topo_print), optionally the hwloc XML to F
 *   chorus_info --topo-dump F       only write the hwloc XML to F (load it elsewhere: CHORUS_TOPO_FILE)
 *   chorus_info --version           library and NCCL API versions
 *
 * With no option it prints the version, the parameters and the topology. Exit status 1 when a
 * parameter is malformed (the value is shown with the error, as init would report it).
 */
#include <stdio.h>
#include <string.h>

#include "chorus.h"
#include "nccl.h"
#include "param.h"
#include "topo.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: chorus_info [--version] [--params [--markdown]] [--topo [--xml FILE]]\n"
            "                   [--topo-dump FILE]\n"
            "What Chorus sees on this machine. With no option: the version, the parameters and the\n"
            "topology.\n"
            "  --version         the Chorus version and the NCCL API it implements\n"
            "  --params          every parameter: the variable to set, its value now, and where the\n"
            "                    value came from (default, CHORUS_ or NCCL_ environment variable)\n"
            "  --markdown        with --params: the parameter table of docs/parameters.md (defaults\n"
            "                    only, whatever the environment says)\n"
            "  --topo            the topology as discovered (hwloc): hosts, packages, NUMA nodes,\n"
            "                    caches, NICs and GPUs\n"
            "  --xml FILE        with --topo: also write the hwloc XML to FILE\n"
            "  --topo-dump FILE  only write the hwloc XML to FILE (load it with CHORUS_TOPO_FILE)\n"
            "  -h, --help        this text\n"
            "Exit status 1 when a parameter is malformed, 2 on a bad argument.\n"
            "To see which libnccl.so.2 a program loads, run it with NCCL_DEBUG=VERSION: Chorus\n"
            "prints 'NCCL VERSION Chorus ... from <path>' at the first communicator init.\n");
}

static void print_version(void) {
    int v = 0;
    ncclGetVersion(&v);
    printf("Chorus %d.%d, NCCL API %d.%d.%d (version code %d)\n", CHORUS_VERSION_MAJOR,
           CHORUS_VERSION_MINOR, v / 10000, (v / 100) % 100, v % 100, v);
}

/* The variable a user sets for a parameter: CHORUS_<NAME>, and NCCL_<NAME> where accepted. */
static const char *var_names(chorus_param_id_t id, char *buf, int len) {
    const char *n = chorus_param_name(id);
    if (chorus_param_has_nccl_alias(id))
        snprintf(buf, len, "CHORUS_%s|NCCL_%s", n, n);
    else
        snprintf(buf, len, "CHORUS_%s", n);
    return buf;
}

static int print_params(void) {
    ncclResult_t res = chorus_param_init();
    char name[128], val[256];
    printf("# parameters: variable = value (source)\n");
    for (int i = 0; i < PARAM_COUNT; i++) {
        chorus_param_id_t id = (chorus_param_id_t)i;
        printf("%-46s = %-16s (%s)\n", var_names(id, name, sizeof(name)),
               chorus_param_value_text(id, val, sizeof(val)),
               chorus_param_source_name(chorus_param_source(id)));
    }
    if (res != ncclSuccess) {
        fprintf(stderr, "chorus_info: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    return 0;
}

/* Markdown cells must not contain a bare '|'. */
static void md_cell(const char *s) {
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", stdout);
        else
            putchar(*s);
    }
}

static int print_params_markdown(void) {
    char def[256];
    printf("| Parameter | NCCL_ alias | Type | Default | Meaning |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < PARAM_COUNT; i++) {
        chorus_param_id_t id = (chorus_param_id_t)i;
        printf("| `CHORUS_%s` | %s | %s | `", chorus_param_name(id),
               chorus_param_has_nccl_alias(id) ? "yes" : "no",
               chorus_param_is_int(id) ? "int" : "string");
        md_cell(chorus_param_default_text(id, def, sizeof(def)));
        printf("` | ");
        md_cell(chorus_param_help(id));
        printf(" |\n");
    }
    return 0;
}

static int print_topo(const char *xml) {
    printf("# topology\n");
    ncclResult_t res = topo_print(stdout);
    if (res != ncclSuccess) {
        fprintf(stderr, "chorus_info: topology discovery failed: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    if (xml) {
        res = topo_dump_xml(xml);
        if (res != ncclSuccess) {
            fprintf(stderr, "chorus_info: writing %s failed: %s\n", xml, ncclGetLastError(NULL));
            return 1;
        }
        printf("# hwloc XML written to %s\n", xml);
    }
    return 0;
}

int main(int argc, char **argv) {
    int want_version = 0, want_params = 0, markdown = 0, want_topo = 0;
    const char *xml = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            want_version = 1;
        } else if (strcmp(argv[i], "--params") == 0) {
            want_params = 1;
        } else if (strcmp(argv[i], "--markdown") == 0) {
            markdown = 1;
        } else if (strcmp(argv[i], "--topo") == 0) {
            want_topo = 1;
        } else if (strcmp(argv[i], "--topo-dump") == 0 && i + 1 < argc) {
            ncclResult_t res = topo_dump_xml(argv[++i]);
            if (res != ncclSuccess) {
                fprintf(stderr, "chorus_info: writing %s failed: %s\n", argv[i], ncclGetLastError(NULL));
                return 1;
            }
            printf("hwloc XML written to %s\n", argv[i]);
            return 0;
        } else if (strcmp(argv[i], "--xml") == 0 && i + 1 < argc) {
            xml = argv[++i];
            want_topo = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "chorus_info: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (markdown && !want_params) want_params = 1;
    if (markdown) return print_params_markdown();
    if (!want_version && !want_params && !want_topo) want_version = want_params = want_topo = 1;
    int rc = 0;
    if (want_version) print_version();
    if (want_params) rc |= print_params();
    if (want_topo) rc |= print_topo(xml);
    return rc;
}
