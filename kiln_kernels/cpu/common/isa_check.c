/* The ISA layer's self-check (tests/kernels/test_isa_layer.py): every operation of isa.h run on
 * the same pseudo-random inputs, each result folded into one 64-bit FNV-1a hash of its bits.
 * Built once per ISA (and for aarch64, run under qemu-user), the hashes must be equal: the
 * layer gives the same bits on every build. Prints "<isa> <hash>" and, with -v, one hash per
 * operation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

static uint64_t total = 1469598103934665603ull;
static int verbose;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void fold(const char *name, const void *p, size_t n) {
    const uint64_t h = fnv(1469598103934665603ull, p, n);
    total = fnv(total, &h, 8);
    if (verbose) printf("%-14s %016llx\n", name, (unsigned long long)h);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
/* spread over many magnitudes, both signs, with some exact repeats */
static float rnd(float scale) {
    const float u = (float)(next() >> 8) * (1.0f / 16777216.0f) - 0.5f;
    return u * scale;
}

#define N 4096
static float A[N], B[N], C[N], OUT[N];
static int32_t I[N], IO[N];
static uint8_t BY[N];

int main(int argc, char **argv) {
    verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (int i = 0; i < N; i++) {
        A[i] = rnd(i % 7 == 0 ? 400.0f : 8.0f);
        B[i] = rnd(3.0f);
        C[i] = rnd(100.0f);
        I[i] = (int32_t)next();
        BY[i] = (uint8_t)next();
    }
    A[5] = 0.0f, A[6] = -0.0f, A[17] = 1e-30f, A[18] = 89.0f, A[19] = -200.0f, A[20] = 88.5f;
    const uint64_t saved = kiln_fp_flush_enter();
#define EACH for (int i = 0; i + 16 <= N; i += 16)
    EACH vf_store(OUT + i, vf_fma(vf_load(A + i), vf_load(B + i), vf_load(C + i)));
    fold("fma", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_fnma(vf_load(A + i), vf_load(B + i), vf_load(C + i)));
    fold("fnma", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_div(vf_add(vf_load(A + i), vf_load(C + i)), vf_sub(vf_load(B + i), vf_load(C + i))));
    fold("add_sub_div", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_max(vf_mul(vf_load(A + i), vf_load(B + i)), vf_load(C + i)));
    fold("mul_max", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_round(vf_mul(vf_load(A + i), vf_set1(3.7f))));
    fold("round", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_exp(vf_load(A + i)));
    fold("exp", OUT, sizeof OUT);
    for (int i = 0; i < N; i++) OUT[i] = kiln_exp(A[i]);
    fold("exp", OUT, sizeof OUT); /* the same hash as the vector's */
    EACH vf_store(OUT + i, vf_log(vf_add(vf_mul(vf_load(A + i), vf_load(A + i)), vf_set1(1e-3f))));
    fold("log", OUT, sizeof OUT);
    for (int i = 0; i < N; i++) OUT[i] = kiln_log(A[i] * A[i] + 1e-3f);
    fold("log", OUT, sizeof OUT);
    for (int i = 0; i + 16 <= N; i += 16) OUT[i / 16] = vf_hsum(vf_load(C + i));
    fold("hsum", OUT, (N / 16) * 4);
    for (int i = 0; i + 16 <= N; i += 16) OUT[i / 16] = vf_hmax(vf_load(C + i));
    fold("hmax", OUT, (N / 16) * 4);
    for (int i = 0; i + 64 <= N; i += 64)
        vf_hsum4(vf_load(C + i), vf_load(C + i + 16), vf_load(C + i + 32), vf_load(C + i + 48), OUT + i / 16);
    fold("hsum", OUT, (N / 16) * 4); /* the same hash as hsum's */
    for (int i = 0; i + 256 <= N; i += 256) {
        vf v[16];
        for (int k = 0; k < 16; k++) v[k] = vf_load(C + i + 16 * k);
        vf_store(OUT + i / 16, vf_hsum16(v));
    }
    fold("hsum", OUT, (N / 16) * 4); /* again */
    EACH vf_store(OUT + i, vf_lookup16(vf_load(A + (i % 256)), vi_load(I + i)));
    fold("lookup16", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_lookup32(vf_load(A + i), vf_load(B + i), vi_load(I + i)));
    fold("lookup32", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_from_i(vi_from_u8(vb_load(BY + i))));
    fold("from_u8", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_from_i(vi_load_i8(BY + i)));
    fold("from_i8", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_load_f16(BY + 2 * (i % 2048)));
    fold("load_f16", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_load_bf16(BY + 2 * (i % 2048)));
    fold("load_bf16", OUT, sizeof OUT);
    {
        uint16_t h[N];
        EACH vf_store_f16(h + i, vf_mul(vf_load(A + i), vf_set1(1e-3f)));
        fold("store_f16", h, sizeof h);
    }
    EACH {
        const vb b = vb_load(BY + i);
        const vb x = vb_sub8(vb_or(vb_and(vb_srl16(b, 3), vb_set1(0x0F)), vb_and(vb_sll16(b, 2), vb_set1(0x30))), vb_set1(32));
        vi_store(IO + i, vi_from_i8(x));
    }
    fold("bytes", IO, sizeof IO);
    EACH {
        const vi a = vi_load(I + i), b = vi_load(I + ((i + 16) % N));
        vi r = vi_add(vi_mullo(a, b), vi_xor(vi_rol(a, 13), vi_srl(b, 7)));
        r = vi_sub(r, vi_and(vi_sll(a, 3), vi_or(vi_sra(b, 5), vi_set1(0x1234))));
        vi_store(IO + i, r);
    }
    fold("int_ops", IO, sizeof IO);
    EACH {
        const vf a = vf_load(A + i), b = vf_load(B + i);
        const vm m = vf_gt(a, b), g = vf_ge(a, vf_set1(0.0f)), e = vi_eq(vi_and(vi_load(I + i), vi_set1(3)), vi_set1(1));
        IO[i / 16] = (int32_t)(vm_bits(m) | vm_bits(g) << 16) ^ (int32_t)vm_bits(vm_and(e, vi_test(vi_load(I + i), vi_set1(8))));
        vf_store(OUT + i, vf_select(m, vf_maskz(g, a), b));
    }
    fold("masks", IO, (N / 16) * 4);
    fold("select", OUT, sizeof OUT);
    {
        int n = 0;
        int32_t ids[N];
        for (int i = 0; i + 16 <= N; i += 16) {
            const vm m = vf_ge(vf_load(A + i), vf_set1(0.5f));
            const int c = vf_compress_store(OUT + n, m, vf_load(A + i));
            vi_compress_store(ids + n, m, vi_add(vi_iota(), vi_set1(i)));
            n += c;
        }
        fold("compress", OUT, (size_t)n * 4);
        fold("compress_i", ids, (size_t)n * 4);
        EACH {
            const vi idx = vi_and(vi_load(I + i), vi_set1(N - 1));
            vf_store(OUT + i, vf_gather(A, idx, vf_gt(vf_load(B + i), vf_set1(0.0f)), vf_set1(-1.0f)));
        }
        fold("gather", OUT, sizeof OUT);
    }
    for (int n = 0; n <= 16; n++) {
        float t[16];
        for (int j = 0; j < 16; j++) t[j] = -7.0f;
        vf_store_n(t, vf_add(vf_load_n(A + 3 * n, n), vf_set1(1.0f)), n);
        memcpy(OUT + 16 * n, t, 64);
        vi_store(IO + 16 * n, vi_load_n(I + n, n));
    }
    fold("load_store_n", OUT, 17 * 64);
    fold("vi_load_n", IO, 17 * 64);
    /* matmul: vm_from_bits, kiln_half_load, vf_from_f16x8 */
    EACH vf_store(OUT + i, vf_select(vm_from_bits((unsigned)I[i]), vf_load(A + i), vf_load(B + i)));
    fold("vm_from_bits", OUT, sizeof OUT);
    for (int i = 0; i < N; i++) OUT[i] = kiln_half_load(BY + (i % (N - 1)));
    fold("half_load", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_from_f16x8(vb_load(BY + i)));
    fold("f16x8", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_affine16(A[i], B[i], vi_load(I + i)));
    fold("affine16", OUT, sizeof OUT);
    EACH vf_store(OUT + i, vf_affine32(A[i], B[i], vi_load(I + i)));
    fold("affine32", OUT, sizeof OUT);
    kiln_fp_flush_leave(saved);
    printf("%s %016llx\n", KILN_ISA_NAME, (unsigned long long)total);
    return 0;
}
