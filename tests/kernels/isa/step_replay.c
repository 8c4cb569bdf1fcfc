/* Replays C steps written by tests/kernels/isa/replay.py, for a build of the kernels that the
 * test's Python cannot load (the aarch64 build, run under qemu-user): reads named arrays, builds
 * the step's model and rows from them, runs every step in order on the same KV caches, and
 * writes each step's logits (float32, in order) to the output file. The kernels are linked in
 * from their sources. Usage: step_replay IN OUT */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_step.h"

int64_t kiln_cpu_step_scratch_floats(const KilnCpuStepModel *md, int64_t M, int64_t max_ctx);
int64_t kiln_cpu_step(const KilnCpuStepModel *md, const KilnCpuStepRows *st, int nthreads);

typedef struct {
    char name[64];
    uint64_t n;
    uint8_t *data; /* 64-byte aligned */
} Arr;

static Arr arrs[4096];
static int narr;

static const Arr *find(const char *name) {
    for (int i = 0; i < narr; i++)
        if (!strcmp(arrs[i].name, name)) return &arrs[i];
    return NULL;
}

static void *get(const char *name) {
    const Arr *a = find(name);
    return a ? a->data : NULL;
}

static void *need(const char *name) {
    void *p = get(name);
    if (!p) {
        fprintf(stderr, "missing array %s\n", name);
        exit(2);
    }
    return p;
}

static KilnWeight weights[1024];
static int nweights;

static const KilnWeight *weight(const char *name) {
    char key[96];
    snprintf(key, sizeof key, "w.%s.meta", name);
    const int64_t *meta = get(key);
    if (!meta) return NULL;
    KilnWeight *w = &weights[nweights++];
    memset(w, 0, sizeof *w);
    w->parts = meta[0], w->K = meta[1];
    for (int p = 0; p < w->parts; p++) {
        w->fmt[p] = meta[2 + p], w->rows[p] = meta[2 + KILN_MAX_PARTS + p];
        snprintf(key, sizeof key, "w.%s.data%d", name, p);
        w->data[p] = need(key);
    }
    return w;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    for (;;) {
        uint32_t len;
        if (fread(&len, 4, 1, f) != 1) break;
        Arr *a = &arrs[narr++];
        memset(a->name, 0, sizeof a->name);
        if (len >= sizeof a->name || fread(a->name, 1, len, f) != len || fread(&a->n, 8, 1, f) != 1)
            return 3;
        a->data = aligned_alloc(64, (a->n + 63) / 64 * 64 + 64);
        if (fread(a->data, 1, a->n, f) != a->n) return 3;
    }
    fclose(f);
    const int64_t *mi = need("model.i64");
    const float *mf = need("model.f32");
    KilnCpuStepModel md;
    memset(&md, 0, sizeof md);
    md.layers = mi[0], md.hidden = mi[1], md.inter = mi[2], md.heads = mi[3];
    md.kv_heads = mi[4], md.head_dim = mi[5], md.vocab = mi[6], md.block_size = mi[7];
    md.fields = F_COUNT, md.kv_f16 = mi[8], md.kv_sb = mi[9], md.kv_sp = mi[10], md.kv_sh = mi[11];
    md.eps = mf[0], md.scale = mf[1];
    int64_t *table = calloc((size_t)(md.layers * F_COUNT), 8);
    static const char *names[F_COUNT] = {"qkv", "o", "gate_up", "down", "in_norm", "post_norm",
                                         "q_norm", "k_norm", "q_bias", "k_bias", "v_bias",
                                         "k_cache", "v_cache"};
    char key[96];
    for (int64_t l = 0; l < md.layers; l++)
        for (int fi = 0; fi < F_COUNT; fi++) {
            snprintf(key, sizeof key, "L%lld.%s", (long long)l, names[fi]);
            table[l * F_COUNT + fi] = fi < F_IN_NORM ? (int64_t)(intptr_t)weight(key)
                                                     : (int64_t)(intptr_t)get(key);
        }
    md.table = table;
    md.final_norm = need("final_norm");
    md.inv_freq = need("inv_freq");
    md.head = weight("head");
    md.embed = weight("embed");
    const int nthreads = (int)((const int64_t *)need("threads"))[0];
    FILE *out = fopen(argv[2], "wb");
    if (!out) return 2;
    for (int s = 0;; s++) {
        snprintf(key, sizeof key, "s%d.i64", s);
        const int64_t *si = get(key);
        if (!si) break;
        KilnCpuStepRows st;
        memset(&st, 0, sizeof st);
        st.M = si[0], st.max_blocks = si[1], st.max_ctx = si[2], st.L = si[3];
#define ROW(field, nm) snprintf(key, sizeof key, "s%d." nm, s), st.field = need(key)
        ROW(ctx_lens, "ctx_lens");
        ROW(block_tables, "block_tables");
        ROW(slots, "slots");
        ROW(seq_first, "seq_first");
        ROW(logit_rows, "logit_rows");
        snprintf(key, sizeof key, "s%d.ids", s);
        st.ids = get(key);
        snprintf(key, sizeof key, "s%d.x", s);
        st.x = get(key);
        if (!st.x) st.x = aligned_alloc(64, (size_t)(st.M * md.hidden * 4 + 64));
        st.logits = aligned_alloc(64, (size_t)(st.L * md.vocab * 4 + 64));
        st.scratch = aligned_alloc(64, (size_t)(kiln_cpu_step_scratch_floats(&md, st.M, st.max_ctx) * 4 + 64));
        if (kiln_cpu_step(&md, &st, nthreads) >= 0) return 4;
        fwrite(st.logits, 4, (size_t)(st.L * md.vocab), out);
    }
    fclose(out);
    return 0;
}
