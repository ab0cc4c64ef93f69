/*
 * rwp_parse_seconds: the delta-seconds of Retry-After and the reset headers
 * (x-ratelimit-reset: "120", "1.5").
 *
 * Properties: the answer is "no value" or a finite number in
 * [0, RW_MAX_SECONDS]; it is the same on a second call and with optional
 * white space around the input; the input is accepted exactly when it is
 * OWS DIGIT+ ["." DIGIT+] OWS (ratewise.h: no sign, no exponent, no inner
 * space); the value is strtod's, saturated at RW_MAX_SECONDS.
 */
#include "fuzz.h"

/* The grammar of ratewise.h, checked character by character. */
static int seconds_grammar(const char *s, size_t len)
{
    size_t i = 0, digits = 0;
    fuzz_trim(&s, &len);
    while (i < len && fuzz_is_digit(s[i])) { i++; digits++; }
    if (digits == 0) return 0;
    if (i < len && s[i] == '.') {
        size_t frac = 0;
        i++;
        while (i < len && fuzz_is_digit(s[i])) { i++; frac++; }
        if (frac == 0) return 0;
    }
    return i == len;
}

static double seconds_reference(const char *s, size_t len)
{
    char *c;
    double v;
    fuzz_trim(&s, &len);
    c = fuzz_cstring(s, len);
    v = strtod(c, NULL); /* the C locale: '.' is the decimal point */
    free(c);
    return v > RW_MAX_SECONDS ? RW_MAX_SECONDS : v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_exact_copy(data, size), *padded;
    size_t plen;
    double v1 = -1, v2 = -1, v3 = -1;
    int ok1 = rwp_parse_seconds(s, size, &v1);
    int ok2 = rwp_parse_seconds(s, size, &v2);
    int ok3;

    FUZZ_CHECK(ok1 == 0 || ok1 == 1);
    FUZZ_CHECK(fuzz_same_result(ok1, v1, ok2, v2));
    FUZZ_CHECK(ok1 == seconds_grammar(s, size));
    if (ok1) {
        FUZZ_CHECK(isfinite(v1) && v1 >= 0 && v1 <= RW_MAX_SECONDS);
        FUZZ_CHECK(fuzz_close(v1, seconds_reference(s, size), 1e-12, 1e-300));
    }

    padded = fuzz_padded_copy(data, size, &plen);
    ok3 = rwp_parse_seconds(padded, plen, &v3);
    FUZZ_CHECK(fuzz_same_result(ok1, v1, ok3, v3));

    free(padded);
    free(s);
    return 0;
}
