/*
 * rwp_backoff: capped exponential backoff with jitter.
 *
 * The bytes choose the arguments within what the Lua layer lets through
 * (lua/ratewise/retry.lua and the binding in src/lparse.c): attempt a
 * non-negative integer, base positive and finite, max_delay and previous
 * non-negative and finite (none of them subnormal), u in [0, 1), any
 * jitter. Properties:
 *   - the delay is finite, in [0, max_delay], and the same on a second call;
 *   - none: exactly min(base * 2^attempt, max_delay) (by repeated doubling,
 *     which is exact until it passes max_delay);
 *   - full: in [0, cap]; equal: in [cap / 2, cap], cap being that value;
 *   - decorrelated: in [min(base, max_delay), max_delay] and below
 *     max(3 * previous, base), whatever the attempt;
 *   - a larger u never gives a shorter delay, nor (full, equal, none) a
 *     later attempt.
 */
#include <float.h>

#include "fuzz.h"

typedef struct backoff_bytes { const uint8_t *p; size_t left; } backoff_bytes;

static uint64_t backoff_take(backoff_bytes *b, size_t n)
{
    uint64_t v = 0;
    while (n-- > 0) {
        v = v << 8;
        if (b->left > 0) { v |= *b->p++; b->left--; }
    }
    return v;
}

/* Any double the bit pattern gives, or -1 (refused) for NaN, infinities and
 * subnormals: below 2.2e-308 s, halving rounds (equal jitter may then pass
 * its cap by 5e-324 s), and no caller means such a delay. */
static double backoff_double(backoff_bytes *b)
{
    uint64_t bits = backoff_take(b, 8);
    double d;
    memcpy(&d, &bits, sizeof d);
    d = fabs(d);
    return isfinite(d) && (d == 0 || d >= DBL_MIN) ? d : -1.0;
}

/* Uniform in [0, 1), as a 53-bit fraction. */
static double backoff_unit(backoff_bytes *b)
{
    return (double)(backoff_take(b, 8) >> 11) * 0x1p-53;
}

static double backoff_uncapped(double base, double attempt, double max_delay)
{
    double grown = base, i;
    for (i = 0; i < attempt && grown <= max_delay; i++) grown *= 2; /* exact */
    return grown < max_delay ? grown : max_delay;
}

static struct { double attempt, base, max_delay, previous, u, u2; int jitter; } checking;

static void backoff_describe(void)
{
    fprintf(stderr, "attempt %.17g jitter %d base %.17g max_delay %.17g previous %.17g u %.17g u2 %.17g\n",
            checking.attempt, checking.jitter, checking.base, checking.max_delay, checking.previous,
            checking.u, checking.u2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    backoff_bytes b;
    double attempt, base, max_delay, previous, u, u2, lo_u, hi_u, cap, d, again, d_hi, d_next;
    enum rwp_jitter jitter;
    uint64_t a;
    b.p = data; b.left = size;

    a = backoff_take(&b, 2);
    /* Mostly small attempts; one in four spans up to 2^60. */
    attempt = (a & 3) == 0 ? ldexp(1.0, (int)(a >> 10) % 61) + (double)((a >> 2) & 0xff)
                           : (double)(a >> 2);
    jitter = (enum rwp_jitter)(backoff_take(&b, 1) % 4);
    base = backoff_double(&b);
    max_delay = backoff_double(&b);
    previous = backoff_double(&b);
    u = backoff_unit(&b);
    u2 = backoff_unit(&b);
    if (!(base > 0) || max_delay < 0 || previous < 0) return 0; /* refused by the Lua layer */
    lo_u = u < u2 ? u : u2;
    hi_u = u < u2 ? u2 : u;

    checking.attempt = attempt; checking.jitter = (int)jitter; checking.base = base;
    checking.max_delay = max_delay; checking.previous = previous; checking.u = u; checking.u2 = u2;
    fuzz_describe = backoff_describe;

    d = rwp_backoff(attempt, base, max_delay, jitter, lo_u, previous);
    again = rwp_backoff(attempt, base, max_delay, jitter, lo_u, previous);
    d_hi = rwp_backoff(attempt, base, max_delay, jitter, hi_u, previous);
    d_next = rwp_backoff(attempt + 1, base, max_delay, jitter, lo_u, previous);
    cap = backoff_uncapped(base, attempt, max_delay);

    FUZZ_CHECK(fuzz_same_double(d, again));
    FUZZ_CHECK(isfinite(d) && d >= 0 && d <= max_delay);
    FUZZ_CHECK(d <= d_hi);
    switch (jitter) {
    case RWP_JITTER_NONE:
        FUZZ_CHECK(d == cap);
        FUZZ_CHECK(d <= d_next);
        break;
    case RWP_JITTER_FULL:
        FUZZ_CHECK(d <= cap);
        FUZZ_CHECK(d <= d_next);
        break;
    case RWP_JITTER_EQUAL:
        FUZZ_CHECK(d >= cap / 2 && d <= cap);
        FUZZ_CHECK(d <= d_next);
        break;
    case RWP_JITTER_DECORRELATED:
        FUZZ_CHECK(d >= (base < max_delay ? base : max_delay));
        /* 3 * previous may overflow to infinity: no bound then. */
        FUZZ_CHECK(d <= (previous * 3 > base ? previous * 3 : base));
        FUZZ_CHECK(fuzz_same_double(d, d_next));
        break;
    }
    return 0;
}
