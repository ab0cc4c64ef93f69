/*
 * rwp_link_next, rwp_link_has_rel and rwp_link_find: the Link header field
 * (RFC 8288 section 3), a list of "<URI-Reference>; param=value" items.
 *
 * For any input: the iteration ends, its position only grows and stays
 * within the input; each link's target lies inside the input between a "<"
 * and the first ">" after it; its rel, when it has one, lies inside the
 * input too; rwp_link_has_rel agrees with a reference that unescapes the
 * value and splits it on SP and HTAB; rwp_link_find answers the first link
 * the iteration gives that names the type and has no anchor, whatever the
 * type's case. A well-formed link put in front of the input
 * (<T>; rel="next", input) is found, with its target T exactly.
 */
#include "fuzz.h"

/* Whether rel (unescaped when quoted) holds want among its SP/HTAB
 * separated types, compared without case: written from RFC 8288 section
 * 3.3, not from parse.c. */
static int link_reference_has(const rwp_link *l, const char *want)
{
    size_t n = l->rel_len, i = 0, k = 0, wl = strlen(want);
    char *type;
    int found = 0;
    if (!l->rel) return 0;
    type = (char *)malloc(n + 1);
    if (!type) abort();
    /* one type at a time into type[0..k): an escaped byte is always part
     * of it; a bare SP or HTAB ends it */
    for (;;) {
        int end = i >= n;
        if (!end && fuzz_is_ows(l->rel[i])) end = 1;
        if (end) {
            if (k == wl && fuzz_ieq(type, want, wl)) found = 1;
            k = 0;
            if (i >= n) break;
            i++;
            continue;
        }
        if (l->rel_quoted && l->rel[i] == '\\' && i + 1 < n) i++;
        type[k++] = l->rel[i++];
    }
    free(type);
    return found;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_exact_copy(data, size), *framed;
    size_t pos = 0, last = 0, rounds = 0, tlen, flen, i;
    const char *first = NULL, *found = NULL, *found_upper = NULL;
    size_t first_len = 0, found_len = 0, found_upper_len = 0;
    rwp_link l;
    static const char head[] = "; rel=\"next\", ";

    while (rwp_link_next(s, size, &pos, &l)) {
        FUZZ_CHECK(pos > last && pos <= size);
        FUZZ_CHECK(++rounds <= size);
        last = pos;
        FUZZ_CHECK(l.target > s && l.target + l.target_len < s + size);
        FUZZ_CHECK(l.target[-1] == '<' && l.target[l.target_len] == '>');
        FUZZ_CHECK(memchr(l.target, '>', l.target_len) == NULL);
        if (l.rel) FUZZ_CHECK(l.rel >= s && l.rel + l.rel_len <= s + size);
        FUZZ_CHECK(rwp_link_has_rel(&l, "next", 4) == link_reference_has(&l, "next"));
        if (!first && !l.has_anchor && rwp_link_has_rel(&l, "next", 4)) {
            first = l.target;
            first_len = l.target_len;
        }
    }
    FUZZ_CHECK(pos == size);
    FUZZ_CHECK(rwp_link_find(s, size, "next", 4, &found, &found_len) == (first != NULL));
    FUZZ_CHECK(rwp_link_find(s, size, "NeXt", 4, &found_upper, &found_upper_len) == (first != NULL));
    if (first) FUZZ_CHECK(found == first && found_len == first_len && found_upper == first);

    /* <T>; rel="next", input: T is the input's first bytes, no ">" in it */
    tlen = size < 64 ? size : 64;
    flen = 1 + tlen + 1 + (sizeof head - 1) + size;
    framed = (char *)malloc(flen);
    if (!framed) abort();
    framed[0] = '<';
    for (i = 0; i < tlen; i++) framed[1 + i] = s[i] == '>' ? 'x' : s[i];
    framed[1 + tlen] = '>';
    memcpy(framed + 2 + tlen, head, sizeof head - 1);
    if (size) memcpy(framed + 2 + tlen + sizeof head - 1, s, size);
    FUZZ_CHECK(rwp_link_find(framed, flen, "next", 4, &found, &found_len));
    FUZZ_CHECK(found == framed + 1 && found_len == tlen);

    free(framed);
    free(s);
    return 0;
}
