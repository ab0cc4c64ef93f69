/*
 * Parsers for the server's rate-limit hints and Link headers, and the
 * retry arithmetic.
 *
 * Hand-written because no maintained C library parses all three HTTP-date
 * forms without going through the process-global locale and time zone
 * (strptime/timegm), and these run on every retried response.
 *
 * Plain C, no Lua (the bindings are in lparse.c), so that the fuzz targets
 * in fuzz/ link this file alone.
 */
#include <math.h>
#include <string.h>

#include "ratewise.h"

#define PARSE_SECONDS_PER_DAY 86400.0
#define PARSE_EPOCH_YEAR_0 (-62167219200.0)     /* 0000-01-01T00:00:00Z */
#define PARSE_EPOCH_YEAR_10000 (253402300800.0) /* 10000-01-01T00:00:00Z */

static int parse_is_ows(char c) { return c == ' ' || c == '\t'; }

static void parse_trim(const char **s, size_t *len)
{
    while (*len > 0 && parse_is_ows(**s)) { (*s)++; (*len)--; }
    while (*len > 0 && parse_is_ows((*s)[*len - 1])) (*len)--;
}

static int parse_lower(int c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* Case-insensitive comparison of n bytes. */
static int parse_ieq(const char *a, const char *b, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (parse_lower((unsigned char)a[i]) != parse_lower((unsigned char)b[i])) return 0;
    return 1;
}

const char *rwp_classify(long status)
{
    if (status >= 200 && status <= 299) return "success";
    switch (status) {
    case 408: case 429: case 500: case 502: case 503: case 504:
        return "retryable";
    default:
        return "terminal";
    }
}

int rwp_parse_seconds(const char *s, size_t len, double *out)
{
    double value = 0.0, scale = 0.1;
    size_t i = 0;
    int digits = 0;

    parse_trim(&s, &len);
    while (i < len && s[i] >= '0' && s[i] <= '9') {
        /* Saturate long before a double could overflow. */
        if (value < RW_MAX_SECONDS) value = value * 10.0 + (s[i] - '0');
        i++; digits++;
    }
    if (digits == 0) return 0;
    if (i < len && s[i] == '.') {
        int frac = 0;
        i++;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            value += (s[i] - '0') * scale;
            scale /= 10.0;
            i++; frac++;
        }
        if (frac == 0) return 0;
    }
    if (i != len) return 0;
    *out = value > RW_MAX_SECONDS ? RW_MAX_SECONDS : value;
    return 1;
}

/* ---- HTTP-date ---- */

static const char *const parse_months[12] = {
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
};
static const char *const parse_days_long[7] = {
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"
};

/* A cursor over the input; every reader checks bounds, so no parser can read
 * past len. */
typedef struct parse_cursor { const char *s; size_t len, pos; } parse_cursor;

static int parse_char(parse_cursor *c, char ch)
{
    if (c->pos < c->len && c->s[c->pos] == ch) { c->pos++; return 1; }
    return 0;
}

/* Exactly n digits. */
static int parse_digits(parse_cursor *c, int n, int *out)
{
    int v = 0, i;
    if (c->len - c->pos < (size_t)n) return 0;
    for (i = 0; i < n; i++) {
        char ch = c->s[c->pos + i];
        if (ch < '0' || ch > '9') return 0;
        v = v * 10 + (ch - '0');
    }
    c->pos += n;
    *out = v;
    return 1;
}

static int parse_month(parse_cursor *c, int *month)
{
    int m;
    if (c->len - c->pos < 3) return 0;
    for (m = 0; m < 12; m++) {
        if (parse_ieq(c->s + c->pos, parse_months[m], 3)) {
            c->pos += 3;
            *month = m + 1;
            return 1;
        }
    }
    return 0;
}

/* The short day name ("Sun"), or with long_names the full one ("Sunday"). */
static int parse_day_name(parse_cursor *c, int long_names)
{
    int d;
    for (d = 0; d < 7; d++) {
        const char *name = parse_days_long[d];
        size_t n = long_names ? strlen(name) : 3;
        if (c->len - c->pos >= n && parse_ieq(c->s + c->pos, name, n)) {
            c->pos += n;
            return 1;
        }
    }
    return 0;
}

static int parse_time_of_day(parse_cursor *c, int *h, int *m, int *s)
{
    return parse_digits(c, 2, h) && parse_char(c, ':') && parse_digits(c, 2, m)
        && parse_char(c, ':') && parse_digits(c, 2, s)
        && *h <= 23 && *m <= 59 && *s <= 60; /* 60: a leap second */
}

static int parse_is_leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

static int parse_days_in_month(int y, int m)
{
    static const int days[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    return (m == 2 && parse_is_leap(y)) ? 29 : days[m - 1];
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
 * days_from_civil), exact for every four-digit year. */
static long parse_days_from_civil(long y, int m, int d)
{
    long era, yoe, doy, doe;
    y -= m <= 2;
    era = (y >= 0 ? y : y - 399) / 400;
    yoe = y - era * 400;
    doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int parse_finish(int y, int mon, int d, int h, int mi, int s, double *out)
{
    if (d < 1 || d > parse_days_in_month(y, mon)) return 0;
    *out = (double)parse_days_from_civil(y, mon, d) * PARSE_SECONDS_PER_DAY
         + h * 3600.0 + mi * 60.0 + s;
    return 1;
}

/* The calendar year of an epoch time, for two-digit years. */
static long parse_year_of(double epoch)
{
    /* civil_from_days, year part only */
    long z = (long)floor(epoch / PARSE_SECONDS_PER_DAY) + 719468;
    long era = (z >= 0 ? z : z - 146096) / 146097;
    long doe = z - era * 146097;
    long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long mp = (5 * doy + 2) / 153;
    return yoe + era * 400 + (mp >= 10);
}

/* "Sun, 06 Nov 1994 08:49:37 GMT" */
static int parse_imf_fixdate(parse_cursor *c, double *out)
{
    int d, mon, y, h, mi, s;
    if (!(parse_day_name(c, 0) && parse_char(c, ',') && parse_char(c, ' ')
          && parse_digits(c, 2, &d) && parse_char(c, ' ') && parse_month(c, &mon)
          && parse_char(c, ' ') && parse_digits(c, 4, &y) && parse_char(c, ' ')
          && parse_time_of_day(c, &h, &mi, &s) && parse_char(c, ' ')))
        return 0;
    if (c->len - c->pos != 3 || !parse_ieq(c->s + c->pos, "GMT", 3)) return 0;
    return parse_finish(y, mon, d, h, mi, s, out);
}

/* "Sunday, 06-Nov-94 08:49:37 GMT" */
static int parse_rfc850(parse_cursor *c, double now, double *out)
{
    int d, mon, yy, h, mi, s;
    long y, this_year;
    if (!(parse_day_name(c, 1) && parse_char(c, ',') && parse_char(c, ' ')
          && parse_digits(c, 2, &d) && parse_char(c, '-') && parse_month(c, &mon)
          && parse_char(c, '-') && parse_digits(c, 2, &yy) && parse_char(c, ' ')
          && parse_time_of_day(c, &h, &mi, &s) && parse_char(c, ' ')))
        return 0;
    if (c->len - c->pos != 3 || !parse_ieq(c->s + c->pos, "GMT", 3)) return 0;
    /* Outside the four-digit years the century is no calendar year we can
     * name (and floor(now / day) may not fit a long). */
    if (!(now >= PARSE_EPOCH_YEAR_0 && now < PARSE_EPOCH_YEAR_10000)) return 0;
    /* RFC 9110 5.6.7: a two-digit year more than 50 years in the future
     * means the most recent past year with the same last two digits; any
     * other means the year within 50 years ahead (in 2080, "05" is 2105). */
    this_year = parse_year_of(now);
    y = this_year - this_year % 100 + yy;
    if (y > this_year + 50) y -= 100;
    else if (y <= this_year - 50) y += 100;
    return parse_finish((int)y, mon, d, h, mi, s, out);
}

/* "Sun Nov  6 08:49:37 1994" */
static int parse_asctime(parse_cursor *c, double *out)
{
    int d, mon, y, h, mi, s;
    if (!(parse_day_name(c, 0) && parse_char(c, ' ') && parse_month(c, &mon)
          && parse_char(c, ' ')))
        return 0;
    if (parse_char(c, ' ')) {
        if (!parse_digits(c, 1, &d)) return 0;
    } else if (!parse_digits(c, 2, &d)) {
        return 0;
    }
    if (!(parse_char(c, ' ') && parse_time_of_day(c, &h, &mi, &s) && parse_char(c, ' ')
          && parse_digits(c, 4, &y) && c->pos == c->len))
        return 0;
    return parse_finish(y, mon, d, h, mi, s, out);
}

int rwp_parse_http_date(const char *s, size_t len, double now, double *out)
{
    parse_cursor c;
    parse_trim(&s, &len);
    c.s = s; c.len = len; c.pos = 0;
    if (parse_imf_fixdate(&c, out)) return 1;
    c.pos = 0;
    if (parse_rfc850(&c, now, out)) return 1;
    c.pos = 0;
    return parse_asctime(&c, out);
}

int rwp_parse_retry_after(const char *s, size_t len, double now, double *out)
{
    double v;
    if (rwp_parse_seconds(s, len, &v)) { *out = v; return 1; }
    if (rwp_parse_http_date(s, len, now, &v)) {
        *out = v > now ? v - now : 0.0;
        if (*out > RW_MAX_SECONDS) *out = RW_MAX_SECONDS;
        return 1;
    }
    return 0;
}

/* ---- Go durations and RFC 3339 date-times (OpenAI's and Anthropic's
 * rate-limit headers) ---- */

/* The powers of ten a double holds exactly: dividing by one of them rounds
 * once, so "12ms" is exactly the double nearest 0.012. */
static const double parse_pow10[23] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22
};

static double parse_div_pow10(double v, int exp)
{
    while (exp > 22) { v /= parse_pow10[22]; exp -= 22; }
    return v / parse_pow10[exp];
}

/* Digits are gathered into an integer mantissa while it stays exact in a
 * double (below 2^53); later digits only scale it (integer part) or are
 * below a double's precision (fraction). */
#define PARSE_MANTISSA_LIMIT 1e14

/* Go's units. A unit of a second or more multiplies; a smaller one is a
 * power of ten to divide by, folded into the fraction's division. */
typedef struct parse_unit { const char *name; size_t len; double mul; int exp10; } parse_unit;

static const parse_unit parse_units[] = {
    { "ns", 2, 1.0, 9 },
    { "us", 2, 1.0, 6 },
    { "\xc2\xb5s", 3, 1.0, 6 }, /* U+00B5 MICRO SIGN, what Go writes */
    { "\xce\xbcs", 3, 1.0, 6 }, /* U+03BC GREEK SMALL LETTER MU */
    { "ms", 2, 1.0, 3 },
    { "s", 1, 1.0, 0 },
    { "m", 1, 60.0, 0 },
    { "h", 1, 3600.0, 0 },
};

static int parse_is_digit(char ch) { return ch >= '0' && ch <= '9'; }

int rwp_parse_duration(const char *s, size_t len, double *out)
{
    double total = 0.0;
    size_t i = 0;

    parse_trim(&s, &len);
    if (len == 1 && s[0] == '0') { *out = 0.0; return 1; }
    if (len == 0) return 0;
    while (i < len) {
        double value = 0.0;
        int digits = 0, kept_frac = 0, scaled = 0;
        size_t unit_start, k;
        const parse_unit *unit = NULL;

        while (i < len && parse_is_digit(s[i])) {
            if (value < PARSE_MANTISSA_LIMIT) value = value * 10.0 + (s[i] - '0');
            else if (scaled < 40) scaled++; /* 10^40 of anything saturates */
            i++; digits++;
        }
        if (i < len && s[i] == '.') {
            i++;
            while (i < len && parse_is_digit(s[i])) {
                if (value < PARSE_MANTISSA_LIMIT && kept_frac < 40) {
                    value = value * 10.0 + (s[i] - '0');
                    kept_frac++;
                }
                i++; digits++;
            }
        }
        if (digits == 0) return 0; /* a sign, a lone '.', a unit alone */
        /* The unit is everything up to the next number, as in Go, so "1sm"
         * or "1 s" is an unknown unit rather than two parts. */
        unit_start = i;
        while (i < len && s[i] != '.' && !parse_is_digit(s[i])) i++;
        for (k = 0; k < sizeof parse_units / sizeof parse_units[0]; k++) {
            if (i - unit_start == parse_units[k].len
                && memcmp(s + unit_start, parse_units[k].name, parse_units[k].len) == 0) {
                unit = &parse_units[k];
                break;
            }
        }
        if (unit == NULL) return 0;
        value *= unit->mul;
        if (scaled > 0) value *= pow(10.0, scaled);
        total += parse_div_pow10(value, kept_frac + unit->exp10);
        if (total > RW_MAX_SECONDS) total = RW_MAX_SECONDS;
    }
    *out = total;
    return 1;
}

int rwp_parse_rfc3339(const char *s, size_t len, double *out)
{
    parse_cursor c;
    int y, mon, d, h, mi, sec, off_h = 0, off_m = 0, sign = 0;
    double frac = 0.0, base;

    parse_trim(&s, &len);
    c.s = s; c.len = len; c.pos = 0;
    if (!(parse_digits(&c, 4, &y) && parse_char(&c, '-') && parse_digits(&c, 2, &mon)
          && parse_char(&c, '-') && parse_digits(&c, 2, &d)
          && (parse_char(&c, 'T') || parse_char(&c, 't'))
          && parse_time_of_day(&c, &h, &mi, &sec)))
        return 0;
    if (parse_char(&c, '.')) {
        double mantissa = 0.0;
        int kept = 0, digits = 0;
        while (c.pos < c.len && parse_is_digit(c.s[c.pos])) {
            if (kept < 15) { mantissa = mantissa * 10.0 + (c.s[c.pos] - '0'); kept++; }
            c.pos++; digits++;
        }
        if (digits == 0) return 0;
        frac = mantissa / parse_pow10[kept];
    }
    if (!(parse_char(&c, 'Z') || parse_char(&c, 'z'))) {
        if (parse_char(&c, '+')) sign = 1;
        else if (parse_char(&c, '-')) sign = -1;
        else return 0;
        if (!(parse_digits(&c, 2, &off_h) && parse_char(&c, ':') && parse_digits(&c, 2, &off_m))
            || off_h > 23 || off_m > 59)
            return 0;
    }
    if (c.pos != c.len || mon < 1 || mon > 12) return 0;
    if (!parse_finish(y, mon, d, h, mi, sec, &base)) return 0;
    /* 12:00+02:00 is 10:00 UTC. */
    *out = base + frac - sign * (off_h * 3600.0 + off_m * 60.0);
    return 1;
}

/* ---- header blocks ---- */

/* The bytes that end a field name: its colon, or one it may not hold. */
static const unsigned char parse_name_stop[256] = {
    ['\0'] = 1, ['\t'] = 1, ['\r'] = 1, [' '] = 1, [':'] = 1,
};

int rwp_header_next(const char *block, size_t len, size_t *pos, rwp_header_field *out)
{
    size_t at = *pos;
    /* Whether the line before is a field this iterator reported, which is
     * what an obs-fold line may continue. A skipped line breaks the chain,
     * so that a dropped field's continuation is dropped with it. */
    int follows_field = at > 0;
    while (at < len) {
        const char *line = block + at, *lend, *name_end, *v, *vend;
        const char *eol = (const char *)memchr(line, '\n', len - at);
        size_t n;
        lend = eol ? eol : block + len;
        at = eol ? (size_t)(eol - block) + 1 : len;
        if (lend > line && lend[-1] == '\r') lend--;
        n = (size_t)(lend - line);
        if (n == 0 || (n >= 5 && memcmp(line, "HTTP/", 5) == 0)) {
            follows_field = 0;
            continue;
        }
        if (parse_is_ows(*line)) { /* obs-fold */
            if (memchr(line, '\r', n) != NULL || memchr(line, '\0', n) != NULL) {
                follows_field = 0;
                continue;
            }
            v = line;
            vend = lend;
            while (v < vend && parse_is_ows(*v)) v++;
            while (vend > v && parse_is_ows(vend[-1])) vend--;
            if (!follows_field || v == vend) continue;
            out->name = NULL;
            out->name_len = 0;
            out->continuation = 1;
        } else {
            /* One pass over the name, which is short: up to the colon, and
             * no SP, HTAB, CR or NUL on the way. */
            for (name_end = line; name_end < lend && !parse_name_stop[(unsigned char)*name_end]; name_end++) {}
            v = name_end + 1;
            if (name_end == lend || *name_end != ':' || name_end == line
                || memchr(v, '\r', (size_t)(lend - v)) != NULL
                || memchr(v, '\0', (size_t)(lend - v)) != NULL) {
                follows_field = 0;
                continue;
            }
            vend = lend;
            while (v < vend && parse_is_ows(*v)) v++;
            while (vend > v && parse_is_ows(vend[-1])) vend--;
            out->name = line;
            out->name_len = (size_t)(name_end - line);
            out->continuation = 0;
        }
        out->value = v;
        out->value_len = (size_t)(vend - v);
        *pos = at;
        return 1;
    }
    *pos = len;
    return 0;
}

/* ---- Link (RFC 8288) ---- */

static int parse_is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
        || (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Past the closing quote of the quoted string that opens at s[at], or 0
 * when it never closes. A backslash escapes the byte after it. */
static size_t parse_quoted_end(const char *s, size_t len, size_t at)
{
    size_t i = at + 1;
    while (i < len) {
        if (s[i] == '\\') {
            i += 2;
        } else if (s[i] == '"') {
            return i + 1;
        } else {
            i++;
        }
    }
    return 0;
}

/* The next comma from s[at] on that is outside a quoted string and
 * "<...>", or len: where a link-value that does not parse ends. */
static size_t parse_link_skip(const char *s, size_t len, size_t at)
{
    while (at < len && s[at] != ',') {
        if (s[at] == '"') {
            at = parse_quoted_end(s, len, at);
            if (at == 0) return len;
        } else if (s[at] == '<') {
            const char *gt = (const char *)memchr(s + at, '>', len - at);
            if (!gt) return len;
            at = (size_t)(gt - s) + 1;
        } else {
            at++;
        }
    }
    return at;
}

static size_t parse_skip_ows(const char *s, size_t len, size_t at)
{
    while (at < len && parse_is_ows(s[at])) at++;
    return at;
}

/* The parameters of a link-value, from s[*at] (just past its ">") to the
 * comma or the end that closes it, into out. 0 when one does not parse. */
static int parse_link_params(const char *s, size_t len, size_t *at, rwp_link *out)
{
    size_t i = *at;
    for (;;) {
        size_t name, name_len, value, value_len = 0;
        int quoted = 0;
        i = parse_skip_ows(s, len, i);
        if (i >= len || s[i] == ',') break;
        if (s[i] != ';') { *at = i; return 0; }
        i = parse_skip_ows(s, len, i + 1);
        name = i;
        while (i < len && parse_is_tchar((unsigned char)s[i])) i++;
        name_len = i - name;
        if (name_len == 0) { *at = i; return 0; }
        i = parse_skip_ows(s, len, i);
        value = i;
        if (i < len && s[i] == '=') {
            i = parse_skip_ows(s, len, i + 1);
            if (i < len && s[i] == '"') {
                size_t end = parse_quoted_end(s, len, i);
                if (end == 0) { *at = len; return 0; }
                value = i + 1;
                value_len = end - i - 2;
                quoted = 1;
                i = end;
            } else {
                value = i;
                while (i < len && parse_is_tchar((unsigned char)s[i])) i++;
                value_len = i - value;
                if (value_len == 0) { *at = i; return 0; }
            }
        }
        /* Only the first rel counts (RFC 8288 section 3.3). */
        if (name_len == 3 && parse_ieq(s + name, "rel", 3) && !out->rel) {
            out->rel = s + value;
            out->rel_len = value_len;
            out->rel_quoted = quoted;
        } else if (name_len == 6 && parse_ieq(s + name, "anchor", 6)) {
            out->has_anchor = 1;
        }
    }
    *at = i;
    return 1;
}

int rwp_link_next(const char *s, size_t len, size_t *pos, rwp_link *out)
{
    size_t at = *pos;
    while (at < len) {
        const char *gt;
        while (at < len && (parse_is_ows(s[at]) || s[at] == ',')) at++;
        if (at >= len) break;
        if (s[at] != '<') {
            at = parse_link_skip(s, len, at);
            continue;
        }
        gt = (const char *)memchr(s + at + 1, '>', len - at - 1);
        if (!gt) break;
        out->target = s + at + 1;
        out->target_len = (size_t)(gt - out->target);
        out->rel = NULL;
        out->rel_len = 0;
        out->rel_quoted = 0;
        out->has_anchor = 0;
        at = (size_t)(gt - s) + 1;
        if (!parse_link_params(s, len, &at, out)) {
            at = parse_link_skip(s, len, at);
            continue;
        }
        *pos = at;
        return 1;
    }
    *pos = len;
    return 0;
}

int rwp_link_has_rel(const rwp_link *link, const char *rel, size_t rel_len)
{
    const char *v = link->rel;
    size_t n = link->rel_len, i = 0;
    if (!v || rel_len == 0) return 0;
    while (i < n) {
        size_t j = 0;
        int same = 1;
        while (i < n && parse_is_ows(v[i])) i++;
        if (i >= n) break;
        while (i < n && !parse_is_ows(v[i])) {
            char c = v[i];
            if (link->rel_quoted && c == '\\' && i + 1 < n) c = v[++i];
            if (j >= rel_len || parse_lower((unsigned char)c) != parse_lower((unsigned char)rel[j])) same = 0;
            j++;
            i++;
        }
        if (same && j == rel_len) return 1;
    }
    return 0;
}

int rwp_link_find(const char *s, size_t len, const char *rel, size_t rel_len,
                  const char **target, size_t *target_len)
{
    size_t pos = 0;
    rwp_link link;
    while (rwp_link_next(s, len, &pos, &link)) {
        if (!link.has_anchor && rwp_link_has_rel(&link, rel, rel_len)) {
            *target = link.target;
            *target_len = link.target_len;
            return 1;
        }
    }
    return 0;
}

double rwp_backoff(double attempt, double base, double max_delay,
                   enum rwp_jitter jitter, double u, double previous)
{
    /* ldexp saturates to +inf for huge attempts; min() then caps it. 2^2100
     * takes even the smallest double (2^-1074) past DBL_MAX. */
    double grown = ldexp(base, attempt > 2100 ? 2100 : (int)attempt);
    double cap = grown < max_delay ? grown : max_delay;
    double hi, d;
    switch (jitter) {
    case RWP_JITTER_NONE:
        return cap;
    case RWP_JITTER_EQUAL:
        return cap / 2 + u * cap / 2;
    case RWP_JITTER_DECORRELATED:
        /* AWS "decorrelated jitter": uniform in [base, 3 * previous). */
        hi = previous * 3 > base ? previous * 3 : base;
        d = base + u * (hi - base);
        return d < max_delay ? d : max_delay;
    case RWP_JITTER_FULL:
    default:
        return u * cap;
    }
}
