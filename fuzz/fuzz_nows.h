/*
 * The "now"s the date targets read every input against: the HTTP-date and
 * Retry-After parsers take the current time (the Lua bindings accept any
 * finite number), and an RFC 850 date's two-digit year depends on it.
 */
#ifndef RATEWISE_FUZZ_NOWS_H
#define RATEWISE_FUZZ_NOWS_H

static const double fuzz_nows[] = {
    1764489600.0,     /* 2025-11-30T08:00:00Z: a present-day clock */
    1764489600.25,    /* with a fraction, as the wall clock gives it */
    0.0,              /* the epoch */
    -1.0,             /* 1969-12-31T23:59:59Z */
    951825600.0,      /* 2000-02-29T12:00:00Z */
    2524607999.0,     /* 2049-12-31T23:59:59Z: the 50-year window's edge */
    3484425600.0,     /* 2080-06-01: "05" is 2105, 25 years ahead, not 2005 */
    -62167219200.0,   /* 0000-01-01T00:00:00Z, the first four-digit year */
    253402300799.0,   /* 9999-12-31T23:59:59Z, the last */
    -62167219201.0,   /* a second before year 0 */
    253402300800.0,   /* year 10000 */
    RW_MAX_SECONDS,   /* about 31 billion years */
    -RW_MAX_SECONDS,
    1e300,            /* finite, so the bindings let it through */
    -1e300,
};

#define FUZZ_NNOWS (sizeof fuzz_nows / sizeof fuzz_nows[0])

#endif
