/*
 * rwp_parse_duration: Go durations as OpenAI's x-ratelimit-reset-requests
 * and -tokens carry them ("6m0s", "12ms", "1h2m3.5s", "500\xc2\xb5s").
 *
 * Properties: "no value" or a finite number in [0, RW_MAX_SECONDS]; the same
 * answer on a second call and with white space around the input; accepted
 * exactly when the input follows Go's grammar as ratewise.h describes it;
 * the value is the sum of number * unit over the parts, each number read by
 * strtod, saturated at RW_MAX_SECONDS.
 */
#include "fuzz.h"

static const struct { const char *name; double seconds; } duration_units[] = {
    { "ns", 1e-9 }, { "us", 1e-6 }, { "\xc2\xb5s", 1e-6 }, { "\xce\xbcs", 1e-6 },
    { "ms", 1e-3 }, { "s", 1.0 }, { "m", 60.0 }, { "h", 3600.0 },
};

/* Returns 1 and the reference value, or 0 when Go would refuse the input. */
static int duration_reference(const char *s, size_t len, double *out)
{
    double total = 0.0;
    size_t i = 0;
    fuzz_trim(&s, &len);
    if (len == 1 && s[0] == '0') { *out = 0.0; return 1; }
    if (len == 0) return 0;
    while (i < len) {
        size_t start = i, digits = 0, unit_start, k, n = sizeof duration_units / sizeof duration_units[0];
        double number, scale = -1;
        char *c;
        while (i < len && fuzz_is_digit(s[i])) { i++; digits++; }
        if (i < len && s[i] == '.') {
            i++;
            while (i < len && fuzz_is_digit(s[i])) { i++; digits++; }
        }
        if (digits == 0) return 0;
        c = fuzz_cstring(s + start, i - start);
        number = strtod(c, NULL); /* "1.", ".5" and "1.5" alike */
        free(c);
        unit_start = i;
        while (i < len && s[i] != '.' && !fuzz_is_digit(s[i])) i++;
        for (k = 0; k < n; k++) {
            size_t ulen = strlen(duration_units[k].name);
            if (i - unit_start == ulen && memcmp(s + unit_start, duration_units[k].name, ulen) == 0)
                scale = duration_units[k].seconds;
        }
        if (scale < 0) return 0;
        total += number * scale; /* inf for a number past DBL_MAX */
    }
    *out = total > RW_MAX_SECONDS ? RW_MAX_SECONDS : total;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_exact_copy(data, size), *padded;
    size_t plen;
    double v1 = -1, v2 = -1, v3 = -1, want = -1;
    int ok1 = rwp_parse_duration(s, size, &v1);
    int ok2 = rwp_parse_duration(s, size, &v2);
    int ok3, ref = duration_reference(s, size, &want);

    FUZZ_CHECK(ok1 == 0 || ok1 == 1);
    FUZZ_CHECK(fuzz_same_result(ok1, v1, ok2, v2));
    FUZZ_CHECK(ok1 == ref);
    if (ok1) {
        FUZZ_CHECK(isfinite(v1) && v1 >= 0 && v1 <= RW_MAX_SECONDS);
        /* The parser keeps 15 significant digits and 40 decimals: a part
         * below 1e-36 s may be lost, which no caller can tell apart. */
        FUZZ_CHECK(fuzz_close(v1, want, 1e-9, 1e-30));
    }

    padded = fuzz_padded_copy(data, size, &plen);
    ok3 = rwp_parse_duration(padded, plen, &v3);
    FUZZ_CHECK(fuzz_same_result(ok1, v1, ok3, v3));

    free(padded);
    free(s);
    return 0;
}
