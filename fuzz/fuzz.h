/*
 * Shared helpers of the fuzz targets (libFuzzer; see the Makefile's `fuzz`).
 *
 * Every target checks properties of one parser of src/parse.c, not only that
 * it does not crash: a violation prints what failed and aborts, which
 * libFuzzer reports as a crash and saves the input under build-fuzz/.
 * The references the targets compare against are written from the contract
 * in src/ratewise.h (and the RFCs it cites), not from parse.c, and lean on
 * libc (strtod, timegm) for the arithmetic so that they share no code with
 * the parser under test.
 */
#ifndef RATEWISE_FUZZ_H
#define RATEWISE_FUZZ_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ratewise.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond) \
    do { \
        if (!(cond)) fuzz_fail(#cond, __FILE__, __LINE__); \
    } while (0)

/* Set by a target to print what it was checking (which "now", the values)
 * with a violation; formatted only then, since formatting on every input
 * would cost more than the parsing. */
static void (*fuzz_describe)(void);

static inline void fuzz_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "\nproperty violated: %s (%s:%d)\n", what, file, line);
    if (fuzz_describe) fuzz_describe();
    abort();
}

/* The input in a buffer of exactly its size, with no terminating NUL, so
 * that AddressSanitizer reports a parser that reads one byte too far. */
static inline char *fuzz_exact_copy(const uint8_t *data, size_t size)
{
    /* malloc(0) under ASan is a valid pointer to nothing readable. */
    char *s = (char *)malloc(size);
    if (!s) s = (char *)malloc(1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    return s;
}

/* The same bytes wrapped in optional white space (SP, HTAB): a parser that
 * trims must give the same answer. Exactly sized, too. */
static inline char *fuzz_padded_copy(const uint8_t *data, size_t size, size_t *padded)
{
    static const char pre[] = " \t ", post[] = "\t  ";
    size_t n = size + 3 + 3;
    char *s = (char *)malloc(n);
    if (!s) abort();
    memcpy(s, pre, 3);
    if (size) memcpy(s + 3, data, size);
    memcpy(s + 3 + size, post, 3);
    *padded = n;
    return s;
}

/* A NUL-terminated copy of s[0..len) for the libc references. */
static inline char *fuzz_cstring(const char *s, size_t len)
{
    char *c = (char *)malloc(len + 1);
    if (!c) abort();
    if (len) memcpy(c, s, len);
    c[len] = '\0';
    return c;
}

static inline int fuzz_same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Two results of one parser, ok flag and value bit for bit. */
static inline int fuzz_same_result(int ok1, double v1, int ok2, double v2)
{
    return ok1 == ok2 && (!ok1 || fuzz_same_double(v1, v2));
}

static inline int fuzz_close(double got, double want, double rel, double abs_tol)
{
    double diff = fabs(got - want);
    return diff <= abs_tol || diff <= rel * fmax(fabs(got), fabs(want));
}

static inline int fuzz_is_ows(char c) { return c == ' ' || c == '\t'; }
static inline int fuzz_is_digit(char c) { return c >= '0' && c <= '9'; }

static inline void fuzz_trim(const char **s, size_t *len)
{
    while (*len > 0 && fuzz_is_ows(**s)) { (*s)++; (*len)--; }
    while (*len > 0 && fuzz_is_ows((*s)[*len - 1])) (*len)--;
}

static inline int fuzz_lower(char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static inline int fuzz_ieq(const char *a, const char *b, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (fuzz_lower(a[i]) != fuzz_lower(b[i])) return 0;
    return 1;
}

/* n digits at s, as a number; -1 when one is not a digit. */
static inline int fuzz_num(const char *s, int n)
{
    int v = 0, i;
    for (i = 0; i < n; i++) {
        if (!fuzz_is_digit(s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static inline int fuzz_leap(long y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

static inline int fuzz_mdays(long y, int m)
{
    static const int days[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    return m == 2 && fuzz_leap(y) ? 29 : days[m - 1];
}

/* Epoch seconds of a UTC date-time through glibc's timegm (64-bit time_t,
 * proleptic Gregorian; second 60 rolls over into the next minute). */
static inline double fuzz_timegm(long y, int mon, int d, int h, int mi, int s)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    tm.tm_year = (int)(y - 1900);
    tm.tm_mon = mon - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = s;
    return (double)timegm(&tm);
}

/* What a four-digit year allows: 0000-01-01T00:00:00 to the leap second at
 * the end of 9999, widened by a day either way for RFC 3339 offsets. */
#define FUZZ_EPOCH_YEAR_0 (-62167219200.0)
#define FUZZ_EPOCH_YEAR_10000 (253402300800.0)
#define FUZZ_DAY 86400.0

#endif
