/*
 * The C core's tables of options (core.bucket, core.engine, a request's
 * transport list) speak of an unknown option as lua/ratewise/options.lua's
 * options.unknown does, so that a caller meets one wording whichever layer
 * checks the table:
 *
 *   who: unknown option 'name' (did you mean 'nearest'?)
 *
 * The name is shown as options.unknown shows it (cut to 40 bytes, control
 * characters as '?'), and the nearest known name is chosen by its rule: a
 * known name that holds the one given (of 3 bytes or more) first, then the
 * fewest edits, then the first in sorted order. spec/engine_spec.lua and
 * spec/bucket_spec.lua hold the two to the same answers.
 */
#include <string.h>

#include "compat.h"
#include "ratewise.h"

/* How much of an unknown name an error shows (options.lua's 40). */
#define OPTIONS_SHOWN_MAX 40

/* The longest known name the distance is counted against: longer ones (none
 * today) are cut, which only makes them seem further off. */
#define OPTIONS_NAME_MAX 64

/* A control character, as Lua's %c sees one in the C locale. */
static int options_is_control(unsigned char c)
{
    return c < 0x20 || c == 0x7f;
}

/* The name as an error shows it, in out (OPTIONS_SHOWN_MAX + 4 bytes): as
 * it is when short and clean, else its first OPTIONS_SHOWN_MAX bytes with
 * control characters as '?', and "...". Returns its length. */
static size_t options_shown(const char *name, size_t len, char *out)
{
    size_t i, n = len;
    int clean = 1;
    if (n > OPTIONS_SHOWN_MAX) {
        n = OPTIONS_SHOWN_MAX;
        clean = 0;
    }
    for (i = 0; i < n; i++) {
        int control = options_is_control((unsigned char)name[i]);
        if (control) clean = 0;
        out[i] = name[i];
        if (control) out[i] = '?';
    }
    if (!clean) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
    return n;
}

/* The edit distance between a and b, of nb bytes (insertions, deletions,
 * substitutions); b is a shown name: at most OPTIONS_SHOWN_MAX + 3 bytes. */
static size_t options_distance(const char *a, const char *b, size_t nb)
{
    size_t rows[2][OPTIONS_SHOWN_MAX + 4];
    size_t *previous = rows[0], *current = rows[1], *swap;
    size_t i, j, na = strlen(a);
    if (na > OPTIONS_NAME_MAX) na = OPTIONS_NAME_MAX;
    for (j = 0; j <= nb; j++) previous[j] = j;
    for (i = 1; i <= na; i++) {
        current[0] = i;
        for (j = 1; j <= nb; j++) {
            size_t best = previous[j] + 1, insert = current[j - 1] + 1;
            size_t change = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            if (insert < best) best = insert;
            if (change < best) best = change;
            current[j] = best;
        }
        swap = previous, previous = current, current = swap;
    }
    return previous[nb];
}

/* The known name nearest to shown, of len bytes (options.nearest's rule),
 * or NULL when none is near enough to be what was meant: one that holds
 * shown, or within max(2, half its own length) edits of it. */
static const char *options_nearest(const char *shown, size_t len, const char *const *known)
{
    const char *best = NULL;
    long best_score = 0;
    for (; *known; known++) {
        long score = (long)options_distance(*known, shown, len);
        if (len >= 3 && strstr(*known, shown)) score -= 100;
        if (!best || score < best_score || (score == best_score && strcmp(*known, best) < 0))
            best = *known, best_score = score;
    }
    if (best && best_score > (long)(strlen(best) / 2 > 2 ? strlen(best) / 2 : 2)) return NULL;
    return best;
}

int rw_options_key(lua_State *L, int idx, const char *const *known)
{
    size_t len;
    const char *name;
    int i;
    if (lua_type(L, idx) != LUA_TSTRING) return -1;
    name = lua_tolstring(L, idx, &len);
    /* "rate\0x" is not rate: compared as C strings it would pass, and the
     * value meant for it be left unread */
    if (strlen(name) != len) return -1;
    for (i = 0; known[i]; i++)
        if (strcmp(known[i], name) == 0) return i;
    return -1;
}

int rw_options_unknown(lua_State *L, const char *who, int name_idx, const char *const *known, const char *noun)
{
    char shown[OPTIONS_SHOWN_MAX + 4];
    const char *near, *name;
    size_t len, shown_len;
    luaL_tolstring(L, name_idx, NULL); /* a string as it is; any other value as tostring shows it */
    name = lua_tolstring(L, -1, &len);
    shown_len = options_shown(name, len, shown);
    near = options_nearest(shown, shown_len, known);
    return luaL_error(L, "%s: unknown %s '%s'%s%s%s", who, noun ? noun : "option", shown,
                      near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
}
