/*
 * rwp_parse_http_date: the three HTTP-date forms of RFC 9110 section 5.6.7
 * (Retry-After, Date, and some reset headers).
 *
 * For every "now" of fuzz_nows.h: "no value" or a finite number of epoch
 * seconds within the four-digit years (an RFC 850 date, whose two-digit year
 * is resolved against now, within 50 years of now instead); the same answer
 * on a second call and with white space around the input; accepted exactly
 * when one of the three forms matches (names in any case, as the parser is
 * lenient; day of month checked against month and year; hour <= 23, minute
 * <= 59, second <= 60); the value is glibc's timegm of the fields; an RFC 850
 * year is the one with those two digits that is not more than 50 years
 * after now's year and not 50 or more before it (RFC 9110: "more than 50
 * years in the future" means the most recent past year). An RFC 850 date is
 * refused when now is outside the four-digit years: its century is then
 * not a calendar year the parser can name.
 */
#include "fuzz.h"
#include "fuzz_nows.h"

static const char *const date_months[12] = {
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
};
static const char *const date_days[7] = {
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"
};

static int date_month(const char *s)
{
    int m;
    for (m = 0; m < 12; m++)
        if (fuzz_ieq(s, date_months[m], 3)) return m + 1;
    return 0;
}

static int date_short_day(const char *s)
{
    int d;
    for (d = 0; d < 7; d++)
        if (fuzz_ieq(s, date_days[d], 3)) return 1;
    return 0;
}

/* Length of the long day name s starts with, or 0. */
static size_t date_long_day(const char *s, size_t len)
{
    int d;
    for (d = 0; d < 7; d++) {
        size_t n = strlen(date_days[d]);
        if (len >= n && fuzz_ieq(s, date_days[d], n)) return n;
    }
    return 0;
}

/* "HH:MM:SS" */
static int date_time(const char *s, int *h, int *mi, int *sec)
{
    if (s[2] != ':' || s[5] != ':') return 0;
    *h = fuzz_num(s, 2); *mi = fuzz_num(s + 3, 2); *sec = fuzz_num(s + 6, 2);
    return *h >= 0 && *h <= 23 && *mi >= 0 && *mi <= 59 && *sec >= 0 && *sec <= 60;
}

static int date_finish(long y, int mon, int d, int h, int mi, int sec, double *out)
{
    if (mon == 0 || d < 1 || d > fuzz_mdays(y, mon)) return 0;
    *out = fuzz_timegm(y, mon, d, h, mi, sec);
    return 1;
}

/* The calendar year of now (inside the four-digit years). */
static long date_year_of(double now)
{
    time_t t = (time_t)floor(now);
    struct tm tm;
    if (!gmtime_r(&t, &tm)) abort();
    return tm.tm_year + 1900L;
}

static int date_reference(const char *s, size_t len, double now, double *out)
{
    int d, mon, h, mi, sec, y;
    size_t n;
    fuzz_trim(&s, &len);
    /* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" */
    if (len == 29 && date_short_day(s) && s[3] == ',' && s[4] == ' ' && s[7] == ' '
        && s[11] == ' ' && s[16] == ' ' && s[25] == ' ' && fuzz_ieq(s + 26, "GMT", 3)
        && (d = fuzz_num(s + 5, 2)) >= 0 && (mon = date_month(s + 8)) > 0
        && (y = fuzz_num(s + 12, 4)) >= 0 && date_time(s + 17, &h, &mi, &sec))
        return date_finish(y, mon, d, h, mi, sec, out);
    /* rfc850-date: "Sunday, 06-Nov-94 08:49:37 GMT" */
    n = date_long_day(s, len);
    if (n > 0 && len == n + 24) {
        const char *r = s + n;
        int yy;
        if (r[0] == ',' && r[1] == ' ' && r[4] == '-' && r[8] == '-' && r[11] == ' '
            && r[20] == ' ' && fuzz_ieq(r + 21, "GMT", 3) && (d = fuzz_num(r + 2, 2)) >= 0
            && (mon = date_month(r + 5)) > 0 && (yy = fuzz_num(r + 9, 2)) >= 0
            && date_time(r + 12, &h, &mi, &sec)) {
            long this_year, year;
            if (!(now >= FUZZ_EPOCH_YEAR_0 && now < FUZZ_EPOCH_YEAR_10000)) return 0;
            this_year = date_year_of(now);
            year = this_year - this_year % 100 + yy;
            while (year > this_year + 50) year -= 100;
            while (year <= this_year - 50) year += 100;
            return date_finish(year, mon, d, h, mi, sec, out);
        }
    }
    /* asctime-date: "Sun Nov  6 08:49:37 1994" */
    if (len == 24 && date_short_day(s) && s[3] == ' ' && s[7] == ' ' && s[10] == ' '
        && s[19] == ' ' && (mon = date_month(s + 4)) > 0
        && (y = fuzz_num(s + 20, 4)) >= 0 && date_time(s + 11, &h, &mi, &sec)) {
        d = s[8] == ' ' ? fuzz_num(s + 9, 1) : fuzz_num(s + 8, 2);
        if (d >= 0) return date_finish(y, mon, d, h, mi, sec, out);
    }
    return 0;
}

static struct { double now, v, want; int ok, ref; } checking;

static void date_describe(void)
{
    fprintf(stderr, "now %.17g: parser %d %.17g, reference %d %.17g\n",
            checking.now, checking.ok, checking.v, checking.ref, checking.want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_exact_copy(data, size), *padded;
    size_t plen, k;
    padded = fuzz_padded_copy(data, size, &plen);
    fuzz_describe = date_describe;

    for (k = 0; k < FUZZ_NNOWS; k++) {
        double now = fuzz_nows[k], v1 = -1, v2 = -1, v3 = -1, want = -1;
        int ok1 = rwp_parse_http_date(s, size, now, &v1);
        int ok2 = rwp_parse_http_date(s, size, now, &v2);
        int ok3 = rwp_parse_http_date(padded, plen, now, &v3);
        int ref = date_reference(s, size, now, &want);

        checking.now = now; checking.ok = ok1; checking.v = v1; checking.ref = ref; checking.want = want;
        FUZZ_CHECK(ok1 == 0 || ok1 == 1);
        FUZZ_CHECK(fuzz_same_result(ok1, v1, ok2, v2));
        FUZZ_CHECK(fuzz_same_result(ok1, v1, ok3, v3));
        FUZZ_CHECK(ok1 == ref);
        if (ok1) {
            FUZZ_CHECK(isfinite(v1));
            /* The four-digit years, and the 50 an RFC 850 year may reach past them. */
            FUZZ_CHECK(v1 >= FUZZ_EPOCH_YEAR_0 - 51 * 366 * FUZZ_DAY
                       && v1 <= FUZZ_EPOCH_YEAR_10000 + 51 * 366 * FUZZ_DAY);
            FUZZ_CHECK(v1 == want); /* whole seconds: exact */
        }
    }

    free(padded);
    free(s);
    return 0;
}
