/* rng.h — small deterministic RNG (xoshiro256**, seeded by splitmix64) for tests, synthetic
 * checkpoints and benchmarks. Not cryptographic. Same seed -> same stream on every platform. */
#ifndef NIB_RNG_H
#define NIB_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nib_rng {
    uint64_t s[4];
    int has_spare;
    double spare;
} nib_rng;

void nib_rng_seed(nib_rng *r, uint64_t seed);
uint64_t nib_rng_u64(nib_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double nib_rng_uniform(nib_rng *r);
/* Uniform integer in [0, n) (n > 0), unbiased. */
uint64_t nib_rng_below(nib_rng *r, uint64_t n);
/* Standard normal (Box-Muller, fp64). */
double nib_rng_normal(nib_rng *r);
/* Student-t with nu degrees of freedom (nu > 0): heavy-tailed test data. */
double nib_rng_student_t(nib_rng *r, double nu);
/* Fill helpers: x[i] = mean + std * N(0,1), as float. */
void nib_rng_fill_normal(nib_rng *r, float *x, uint64_t n, float mean, float std);

#ifdef __cplusplus
}
#endif
#endif
