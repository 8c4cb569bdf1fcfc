/* The sampler's counter hash for every (row, token id) (counter.h): exactly the torch
 * reference's bits. */
#include <stdint.h>

#include "counter.h"

void kiln_counter_uniform(const int64_t *seeds, const int64_t *steps, int64_t B, int64_t V,
                          float *out) {
    for (int64_t b = 0; b < B; b++) {
        const uint32_t h = kiln_counter_row(seeds[b], steps[b]);
        float *o = out + b * V;
#pragma omp parallel for schedule(static)
        for (int64_t v = 0; v < V; v++) o[v] = kiln_counter_u(h, v);
    }
}
