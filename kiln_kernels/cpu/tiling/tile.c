/* Tiling a GGUF file's matrices for the CPU products, all of a file's matrices in one call.
 *
 * The tiled layout (kiln_kernels/tiling.py, which holds the numpy reference of this file):
 * every 4 rows' blocks one after another, [N/4, nb, tile]. GGML Q4_0 / Q4_1 / Q8_0 are
 * repacked with float32 scales: a q4 tile is 4 x (d, m) then 4 x 16 bytes of nibbles (Q4_0's
 * m = -8 d, exact), a q8 tile 4 x d then 4 x 32 int8 values; every other type keeps its blocks
 * byte for byte.
 *
 * Why C beside the numpy reference: start-up tiles on a thread while the main thread imports
 * torch. numpy drops the GIL only inside each copy, and the thread then waited for it again
 * once a matrix (a few hundred times a file); here ctypes drops it once for the whole file.
 * The copies are plain memcpy of whole blocks, where numpy's strided copy moved ~1.4 GB/s.
 *
 * Built as its own small library without OpenMP (kiln_kernels/cpu/loader.py, "tiling"): it is
 * loaded before torch, whose OpenMP runtime the main library must share. Threads share a file's
 * jobs through a counter instead (kiln_tile_claim): start-up's tiling thread begins, and the
 * main thread helps once its imports are done, if any job is left.
 */
#include <stdint.h>
#include <string.h>

enum { TILE_RAW = 0, TILE_Q4_0 = 1, TILE_Q4_1 = 2, TILE_Q8_0 = 3 };

typedef struct {
    const uint8_t *src;  /* rows of blocks: row r at src + r * nb * block */
    uint8_t *dst;        /* tiles [n / 4, nb, tile bytes] */
    const int64_t *rows; /* NULL, or the source row of each tiled row (llama's q/k order) */
    int64_t n;           /* rows, a multiple of 4 */
    int64_t nb;          /* blocks per row */
    int64_t block;       /* bytes of one source block */
    int64_t kind;        /* TILE_* */
} kiln_tile_job;

/* IEEE half -> float, exact (numpy's npy_halfbits_to_floatbits: subnormals normalized,
 * inf and NaN payloads kept). */
static float half_to_float(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            uint32_t e = 0;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((127u - 14u - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void tile_one(const kiln_tile_job *j) {
    const int64_t row_bytes = j->nb * j->block;
    int64_t tile;
    switch (j->kind) {
    case TILE_Q4_0: case TILE_Q4_1: tile = 96; break;
    case TILE_Q8_0: tile = 144; break;
    default: tile = 4 * j->block;
    }
    for (int64_t g = 0; g < j->n / 4; g++) {
        const uint8_t *row[4];
        for (int r = 0; r < 4; r++) {
            int64_t src_row = j->rows ? j->rows[4 * g + r] : 4 * g + r;
            row[r] = j->src + src_row * row_bytes;
        }
        uint8_t *out = j->dst + g * j->nb * tile;
        for (int64_t b = 0; b < j->nb; b++, out += tile) {
            for (int r = 0; r < 4; r++) {
                const uint8_t *blk = row[r] + b * j->block;
                if (j->kind == TILE_RAW) {
                    memcpy(out + r * j->block, blk, (size_t)j->block);
                } else if (j->kind == TILE_Q8_0) {
                    float d = half_to_float(blk);
                    memcpy(out + 4 * r, &d, 4);
                    memcpy(out + 16 + 32 * r, blk + 2, 32);
                } else {
                    float dm[2];
                    dm[0] = half_to_float(blk);
                    dm[1] = j->kind == TILE_Q4_1 ? half_to_float(blk + 2) : -8.0f * dm[0];
                    memcpy(out + 8 * r, dm, 8);
                    memcpy(out + 32 + 16 * r, blk + (j->kind == TILE_Q4_1 ? 4 : 2), 16);
                }
            }
        }
    }
}

/* Tile the jobs this caller claims, one at a time, from the counter *next that every caller of
 * these jobs shares: callers on several threads split a file's jobs between them. Each returns
 * when none is left to claim; jobs another caller claimed may still be running then. */
void kiln_tile_claim(const kiln_tile_job *jobs, int64_t count, int64_t *next) {
    for (;;) {
        const int64_t i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (i >= count) return;
        tile_one(&jobs[i]);
    }
}
