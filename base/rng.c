/* rng.c — xoshiro256** with splitmix64 seeding; Box-Muller normals; Student-t via
 * normal / sqrt(chi2/nu) with chi2 from a Gamma(nu/2, 2) (Marsaglia-Tsang). */
#include <math.h>

#include "rng.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void nib_rng_seed(nib_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
    r->has_spare = 0;
    r->spare = 0.0;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t nib_rng_u64(nib_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double nib_rng_uniform(nib_rng *r) { return (double)(nib_rng_u64(r) >> 11) * 0x1.0p-53; }

uint64_t nib_rng_below(nib_rng *r, uint64_t n) {
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = nib_rng_u64(r);
    while (x >= lim);
    return x % n;
}

double nib_rng_normal(nib_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1, u2;
    do u1 = nib_rng_uniform(r);
    while (u1 <= 0.0);
    u2 = nib_rng_uniform(r);
    double mag = sqrt(-2.0 * log(u1));
    r->spare = mag * sin(2.0 * M_PI * u2);
    r->has_spare = 1;
    return mag * cos(2.0 * M_PI * u2);
}

/* Gamma(shape a, scale 1), a >= 1 (Marsaglia & Tsang 2000); a < 1 by boosting. */
static double gamma_draw(nib_rng *r, double a) {
    if (a < 1.0) {
        double u;
        do u = nib_rng_uniform(r);
        while (u <= 0.0);
        return gamma_draw(r, a + 1.0) * pow(u, 1.0 / a);
    }
    double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = nib_rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        double u = nib_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
        if (u > 0.0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

double nib_rng_student_t(nib_rng *r, double nu) {
    double z = nib_rng_normal(r);
    double chi2 = 2.0 * gamma_draw(r, nu / 2.0);
    return z / sqrt(chi2 / nu);
}

void nib_rng_fill_normal(nib_rng *r, float *x, uint64_t n, float mean, float std) {
    for (uint64_t i = 0; i < n; i++) x[i] = (float)(mean + std * nib_rng_normal(r));
}
