/*
 * rwp_parse_rfc3339: RFC 3339 date-times as Anthropic's
 * anthropic-ratelimit-*-reset headers carry them.
 *
 * Properties: "no value" or a finite number of epoch seconds within what a
 * four-digit year allows (a day wider either way for the offset); the same
 * answer on a second call and with white space around the input; accepted
 * exactly when the input is date-time of RFC 3339 section 5.6 ('T' and 'Z'
 * in either case) with ranges checked (month, day of that month and year,
 * hour <= 23, minute <= 59, second <= 60, offset hour <= 23, minute <= 59);
 * the value is glibc's timegm, plus the fraction (strtod), minus the offset.
 */
#include "fuzz.h"

static int rfc3339_reference(const char *s, size_t len, double *out)
{
    int y, mon, d, h, mi, sec, oh = 0, om = 0, sign = 0;
    size_t i = 19;
    double frac = 0.0;
    fuzz_trim(&s, &len);
    /* YYYY-MM-DDTHH:MM:SS: fixed positions */
    if (len < 20 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't')
        || s[13] != ':' || s[16] != ':')
        return 0;
    y = fuzz_num(s, 4); mon = fuzz_num(s + 5, 2); d = fuzz_num(s + 8, 2);
    h = fuzz_num(s + 11, 2); mi = fuzz_num(s + 14, 2); sec = fuzz_num(s + 17, 2);
    if (y < 0 || mon < 1 || mon > 12 || d < 1 || h < 0 || h > 23 || mi < 0 || mi > 59
        || sec < 0 || sec > 60 || d > fuzz_mdays(y, mon))
        return 0;
    if (s[i] == '.') {
        size_t start = i;
        char *c;
        i++;
        while (i < len && fuzz_is_digit(s[i])) i++;
        if (i == start + 1) return 0;
        c = fuzz_cstring(s + start, i - start);
        frac = strtod(c, NULL); /* ".123" */
        free(c);
    }
    if (i < len && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i < len && (s[i] == '+' || s[i] == '-')) {
        sign = s[i] == '+' ? 1 : -1;
        if (len - i < 6 || s[i + 3] != ':') return 0;
        oh = fuzz_num(s + i + 1, 2);
        om = fuzz_num(s + i + 4, 2);
        if (oh < 0 || oh > 23 || om < 0 || om > 59) return 0;
        i += 6;
    } else {
        return 0;
    }
    if (i != len) return 0;
    *out = fuzz_timegm(y, mon, d, h, mi, sec) + frac - sign * (oh * 3600.0 + om * 60.0);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_exact_copy(data, size), *padded;
    size_t plen;
    double v1 = -1, v2 = -1, v3 = -1, want = -1;
    int ok1 = rwp_parse_rfc3339(s, size, &v1);
    int ok2 = rwp_parse_rfc3339(s, size, &v2);
    int ok3, ref = rfc3339_reference(s, size, &want);

    FUZZ_CHECK(ok1 == 0 || ok1 == 1);
    FUZZ_CHECK(fuzz_same_result(ok1, v1, ok2, v2));
    FUZZ_CHECK(ok1 == ref);
    if (ok1) {
        FUZZ_CHECK(isfinite(v1));
        FUZZ_CHECK(v1 >= FUZZ_EPOCH_YEAR_0 - FUZZ_DAY && v1 <= FUZZ_EPOCH_YEAR_10000 + FUZZ_DAY);
        /* A millisecond: epoch seconds near year 9999 carry about 5e-5 s
         * of double precision, and the two sums round differently. */
        FUZZ_CHECK(fuzz_close(v1, want, 0, 1e-3));
    }

    padded = fuzz_padded_copy(data, size, &plen);
    ok3 = rwp_parse_rfc3339(padded, plen, &v3);
    FUZZ_CHECK(fuzz_same_result(ok1, v1, ok3, v3));

    free(padded);
    free(s);
    return 0;
}
