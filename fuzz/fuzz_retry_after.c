/*
 * rwp_parse_retry_after: the Retry-After field, delay-seconds or HTTP-date
 * (RFC 9110 section 10.2.3), read against a "now".
 *
 * For every "now" of fuzz_nows.h: "no value" or a finite number of seconds
 * in [0, RW_MAX_SECONDS]; the same answer on a second call and with white
 * space around the input; when the input is delay-seconds, exactly what
 * rwp_parse_seconds gives; otherwise, when it is an HTTP-date, exactly
 * max(0, date - now) (saturated at RW_MAX_SECONDS) for the date
 * rwp_parse_http_date gives with the same now; otherwise no value. The two
 * parsers it is built on have targets of their own.
 */
#include "fuzz.h"
#include "fuzz_nows.h"

static struct { double now, v, seconds, date; int ok, is_seconds, is_date; } checking;

static void retry_after_describe(void)
{
    fprintf(stderr, "now %.17g: retry-after %d %.17g, seconds %d %.17g, date %d %.17g\n",
            checking.now, checking.ok, checking.v, checking.is_seconds, checking.seconds,
            checking.is_date, checking.date);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_exact_copy(data, size), *padded;
    size_t plen, k;
    double seconds = -1;
    int is_seconds = rwp_parse_seconds(s, size, &seconds);
    padded = fuzz_padded_copy(data, size, &plen);
    fuzz_describe = retry_after_describe;

    for (k = 0; k < FUZZ_NNOWS; k++) {
        double now = fuzz_nows[k], v1 = -1, v2 = -1, v3 = -1, date = -1;
        int ok1 = rwp_parse_retry_after(s, size, now, &v1);
        int ok2 = rwp_parse_retry_after(s, size, now, &v2);
        int ok3 = rwp_parse_retry_after(padded, plen, now, &v3);
        int is_date = rwp_parse_http_date(s, size, now, &date);

        checking.now = now; checking.ok = ok1; checking.v = v1; checking.is_seconds = is_seconds;
        checking.seconds = seconds; checking.is_date = is_date; checking.date = date;
        FUZZ_CHECK(ok1 == 0 || ok1 == 1);
        FUZZ_CHECK(fuzz_same_result(ok1, v1, ok2, v2));
        FUZZ_CHECK(fuzz_same_result(ok1, v1, ok3, v3));
        if (ok1) FUZZ_CHECK(isfinite(v1) && v1 >= 0 && v1 <= RW_MAX_SECONDS);
        if (is_seconds) {
            FUZZ_CHECK(fuzz_same_result(ok1, v1, 1, seconds));
        } else if (is_date) {
            double wait = date - now;
            if (!(wait > 0)) wait = 0.0;
            if (wait > RW_MAX_SECONDS) wait = RW_MAX_SECONDS;
            FUZZ_CHECK(fuzz_same_result(ok1, v1, 1, wait));
        } else {
            FUZZ_CHECK(!ok1);
        }
    }

    free(padded);
    free(s);
    return 0;
}
