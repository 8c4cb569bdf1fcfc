/* The sampler's counter hash for every (row, token id) (counter.h): exactly the torch
 * reference's bits, 16 ids at a time (the last ids of a row through a masked store). */
#include <stdint.h>

#include "counter.h"

void kiln_counter_uniform(const int64_t *seeds, const int64_t *steps, int64_t B, int64_t V,
                          float *out) {
    for (int64_t b = 0; b < B; b++) {
        const uint32_t h = kiln_counter_row(seeds[b], steps[b]);
        float *o = out + b * V;
#pragma omp parallel for schedule(static)
        for (int64_t v = 0; v < V; v += 16) /* ids wrap to uint32 as kiln_counter_u's do */
            vf_store_n(o + v, kiln_counter_u16(h, vi_add(vi_set1((int32_t)(uint32_t)v), vi_iota())),
                       V - v);
    }
}
