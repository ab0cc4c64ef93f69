/*
 * ratewise.Bucket: a token bucket on the monotonic clock.
 *
 * Waiters are served first come, first served, in a queue kept as two
 * running totals: `queued` counts every token ever reserved, `served` every
 * token taken or given up from the queue. A reservation's ticket is the
 * value of `queued` once its tokens are counted in, so it is served once
 * the tokens in the bucket cover everything queued up to its ticket and
 * not yet served. A waiter is told how long that will take if every waiter
 * before it takes its tokens on time, sleeps, and claims; a claim that
 * comes too early (because one before it woke late) is told how much
 * longer to wait. Tokens are counted when they are taken, not when they are
 * reserved, and a full bucket stops filling: a waiter that wakes late
 * pushes the ones after it back, exactly as the server's own bucket sees
 * the requests. (Reserving tokens ahead of time, as Go's rate.Limiter does,
 * lets a late waiter and an on-time one after it send two requests less
 * than a token apart: a server whose bucket holds one token answers the
 * second 429.)
 * The core only answers "how long"; the Lua layer does the waiting.
 *
 * Every wait it reports is finite: a rate so small that one token would
 * take longer than RW_MAX_SECONDS to refill is refused, and a wait that
 * reservations pile up past RW_MAX_SECONDS is reported as RW_MAX_SECONDS
 * (a caller that sleeps it then blocks; one that got inf or NaN would spin).
 * What a server says (sync) is believed only up to the bucket's
 * sync_horizon: one hostile or broken response cannot put the bucket, and
 * every caller sharing it, years into debt.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compat.h"
#include "ratewise.h"

#define BUCKET_MT "ratewise.Bucket"
#define PLACE_MT "ratewise.BucketPlace"

/* How far one sync may push the next token, unless the bucket says
 * otherwise: a day, longer than any quota window APIs document (GitHub's
 * and OpenAI's reset within the hour, daily quotas within the day). */
#define BUCKET_DEFAULT_SYNC_HORIZON 86400.0
/* The fastest rate accepted: with it, rate * sync_horizon and every other
 * product of the arithmetic stay finite. */
#define BUCKET_MAX_RATE 1e18

typedef struct bucket {
    double capacity;  /* burst size */
    double rate;      /* tokens per second */
    double tokens;    /* in the bucket, at most capacity (below 0 after a sync) */
    double updated;   /* monotonic time of the last refill */
    double queued;    /* tokens ever reserved by waiters (see above) */
    double served;    /* of those, taken or given up */
    double horizon;   /* sync never puts the next token further off than this */
    double held_until; /* monotonic time a sync put the next token off to (0: none) */
    int slow_down;    /* slows down after a throttle (bucket.lua's observe) */
    int closed;
} bucket;

/* A waiter's place in the queue (what b:reserve hands out). It holds its
 * bucket in its user value, and gives its place up when it is collected
 * unclaimed: a waiter whose coroutine was dropped (a plain coroutine host,
 * a game that abandons a scene) must not hold the queue forever. */
typedef struct place {
    double ticket;    /* the value of `queued` once its tokens were counted in */
    double n;         /* the tokens it waits for */
    bucket *b;
    int done;         /* claimed or given up */
} place;

static void bucket_refill(bucket *b)
{
    double now = rw_core_monotonic();
    if (now > b->updated) {
        b->tokens += (now - b->updated) * b->rate;
        if (b->tokens > b->capacity) b->tokens = b->capacity;
        b->updated = now;
    }
}

/* Seconds until n tokens are there at the balance now (0: now). */
static double bucket_wait(const bucket *b, double n)
{
    double wait;
    if (b->tokens >= n) return 0.0;
    wait = (n - b->tokens) / b->rate;
    return wait < RW_MAX_SECONDS ? wait : RW_MAX_SECONDS;
}

/* Tokens reserved by waiters and not yet taken. */
static double bucket_pending(const bucket *b)
{
    double pending = b->queued - b->served;
    return pending > 0 ? pending : 0.0;
}

/* What must be in the bucket before the holder of `ticket`, reserving n,
 * may take its tokens: everything queued up to it and not yet served. */
static double bucket_needed(const bucket *b, double ticket, double n)
{
    double ahead = ticket - b->served;
    return ahead > n ? ahead : n;
}

/* Some tokens left the queue (each place leaves it once). Once it is
 * empty, both totals start again from zero, so that they never grow past a
 * double's precision. */
static void bucket_dequeue(bucket *b, double n)
{
    b->served += n;
    if (b->served >= b->queued) b->queued = b->served = 0.0;
}

/* The longest string a misuse error shows whole (errors.lua's MAX_SHOWN). */
#define BUCKET_SHOWN_MAX 40

/* Pushes what a misuse error says it got, as errors.shown does on the Lua
 * side: a number as itself, a string quoted and named (so that "8" is not
 * read as the number 8), cut short past BUCKET_SHOWN_MAX bytes; anything
 * else by its type. */
static const char *bucket_shown(lua_State *L, int idx)
{
    luaL_Buffer buf;
    const char *s;
    size_t len, i;
    int t = lua_type(L, idx);
    if (t == LUA_TNUMBER && isnan(lua_tonumber(L, idx))) return lua_pushliteral(L, "nan");
    if (t == LUA_TNUMBER || t == LUA_TBOOLEAN || t == LUA_TNIL) return luaL_tolstring(L, idx, NULL);
    if (t != LUA_TSTRING) return lua_pushstring(L, lua_typename(L, t));
    s = lua_tolstring(L, idx, &len);
    luaL_buffinit(L, &buf);
    luaL_addstring(&buf, "string \"");
    for (i = 0; i < len && i < BUCKET_SHOWN_MAX; i++) {
        unsigned char c = (unsigned char)s[i];
        char escaped[8];
        if (c == '"' || c == '\\') {
            luaL_addchar(&buf, '\\');
            luaL_addchar(&buf, (char)c);
        } else if (c < 0x20 || c == 0x7f) {
            (void)snprintf(escaped, sizeof escaped, "\\%u", (unsigned)c);
            luaL_addstring(&buf, escaped);
        } else {
            luaL_addchar(&buf, (char)c);
        }
    }
    luaL_addchar(&buf, '"');
    if (len > BUCKET_SHOWN_MAX) {
        char more[40];
        (void)snprintf(more, sizeof more, "... (%lu bytes)", (unsigned long)len);
        luaL_addstring(&buf, more);
    }
    luaL_pushresult(&buf);
    return lua_tostring(L, -1);
}

/* Number argument arg (a string Lua would convert, "8", is refused, as the
 * Lua side's checkers do), or dflt when it is absent and dflt is not NAN. */
static lua_Number bucket_number(lua_State *L, int arg, lua_Number dflt, const char *what)
{
    if (lua_isnoneornil(L, arg) && !isnan(dflt)) return dflt;
    if (lua_type(L, arg) != LUA_TNUMBER)
        luaL_argerror(L, arg, lua_pushfstring(L, "%s, got %s", what, bucket_shown(L, arg)));
    return lua_tonumber(L, arg);
}

static bucket *bucket_check(lua_State *L)
{
    bucket *b = (bucket *)luaL_checkudata(L, 1, BUCKET_MT);
    if (b->closed) luaL_argerror(L, 1, "bucket is closed");
    return b;
}

/* Token count argument of a refund or a debit: positive and finite (dflt
 * when absent; NAN: required), and possibly more than the bucket holds. */
static double bucket_check_amount(lua_State *L, int arg, lua_Number dflt)
{
    lua_Number n = bucket_number(L, arg, dflt, "token count must be a positive number");
    if (!(n > 0) || !isfinite(n))
        luaL_argerror(L, arg,
                      lua_pushfstring(L, "token count must be a positive number, got %s", bucket_shown(L, arg)));
    return n;
}

/* Token count argument: positive, at most the capacity (a larger request
 * could never be served and would wait forever). */
static double bucket_check_count(lua_State *L, bucket *b, int arg)
{
    double n = bucket_check_amount(L, arg, 1);
    if (n > b->capacity)
        luaL_argerror(L, arg, lua_pushfstring(L,
            "%f tokens asked of a bucket whose capacity is %f: it could never be served",
            n, b->capacity));
    return n;
}

/* A positive, finite number option; nil gives dflt (or raises when dflt < 0:
 * the option is required). */
static double bucket_field(lua_State *L, const char *name, double dflt)
{
    lua_Number v;
    int isnum;
    lua_getfield(L, 1, name);
    if (lua_isnil(L, -1)) {
        if (dflt < 0) luaL_error(L, "bucket: option '%s' is required", name);
        lua_pop(L, 1);
        return dflt;
    }
    isnum = lua_type(L, -1) == LUA_TNUMBER; /* not lua_tonumberx: it takes "8" */
    v = lua_tonumber(L, -1);
    if (!isnum || !(v > 0) || !isfinite(v))
        luaL_error(L, "bucket: option '%s' must be a positive number (got %s)", name, bucket_shown(L, -1));
    lua_pop(L, 1);
    return v;
}

/* The options core.bucket takes. */
static const char *const bucket_options[] = { "capacity", "rate", "sync_horizon", "slow_down", NULL };

/* core.bucket{capacity = C, rate = R [, sync_horizon = seconds] [, slow_down = false]} */
static int bucket_l_new(lua_State *L)
{
    bucket *b;
    double capacity, rate, horizon;
    int slow_down;
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        if (rw_options_key(L, -2, bucket_options) < 0)
            return rw_options_unknown(L, "bucket", -2, bucket_options, NULL);
        lua_pop(L, 1);
    }
    capacity = bucket_field(L, "capacity", -1);
    rate = bucket_field(L, "rate", -1);
    horizon = bucket_field(L, "sync_horizon", BUCKET_DEFAULT_SYNC_HORIZON);
    lua_getfield(L, 1, "slow_down");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
        return luaL_error(L, "bucket: option 'slow_down' must be a boolean (got %s)", bucket_shown(L, -1));
    slow_down = !lua_isboolean(L, -1) || lua_toboolean(L, -1);
    lua_pop(L, 1);
    /* Refilling a token (or the whole bucket, when it holds more than one)
     * must take a finite time, or every wait on the bucket would be inf. */
    if ((capacity > 1 ? capacity : 1) / rate > RW_MAX_SECONDS)
        return luaL_error(L, "bucket: option 'rate' is too small (got %f): refilling %s would take "
                          "more than %f seconds", rate, capacity > 1 ? "the bucket" : "a token",
                          RW_MAX_SECONDS);
    if (rate > BUCKET_MAX_RATE)
        return luaL_error(L, "bucket: option 'rate' is too large (got %f): at most %f tokens per second",
                          rate, BUCKET_MAX_RATE);
    if (horizon > RW_MAX_SECONDS)
        return luaL_error(L, "bucket: option 'sync_horizon' is too large (got %f): at most %f seconds",
                          horizon, RW_MAX_SECONDS);
    b = (bucket *)lua_newuserdatauv(L, sizeof(bucket), 0);
    b->capacity = capacity;
    b->rate = rate;
    b->tokens = capacity; /* a new bucket starts full */
    b->updated = rw_core_monotonic();
    b->queued = b->served = 0.0;
    b->horizon = horizon;
    b->held_until = 0.0;
    b->slow_down = slow_down;
    b->closed = 0;
    luaL_setmetatable(L, BUCKET_MT);
    return 1;
}

/* b:take([n]) -> true | false, seconds until n tokens could be there.
 * Never ahead of the waiters in the queue. */
static int bucket_l_take(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_count(L, b, 2);
    double needed;
    bucket_refill(b);
    needed = bucket_pending(b) + n;
    if (b->tokens >= needed) {
        b->tokens -= n;
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushboolean(L, 0);
    lua_pushnumber(L, bucket_wait(b, needed));
    return 2;
}

/* b:reserve([n]) -> 0 when the n tokens were taken at once, or seconds to
 * wait and the waiter's place in the queue, to claim (or cancel) when the
 * wait is over. */
static int bucket_l_reserve(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_count(L, b, 2);
    place *p;
    bucket_refill(b);
    if (b->queued <= b->served && b->tokens >= n) {
        b->tokens -= n;
        lua_pushnumber(L, 0.0);
        return 1;
    }
    /* The place is made before the queue grows: a memory error here
     * leaves the queue as it was. */
    p = (place *)lua_newuserdatauv(L, sizeof *p, 1);
    p->n = n;
    p->b = b;
    p->done = 1;
    luaL_setmetatable(L, PLACE_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1); /* the bucket lives as long as the place */
    b->queued += n;
    p->ticket = b->queued;
    p->done = 0;
    lua_pushnumber(L, bucket_wait(b, bucket_needed(b, p->ticket, n)));
    lua_insert(L, -2);
    return 2;
}

/* The place at arg, which must be one of this bucket's. */
static place *bucket_check_place(lua_State *L, const bucket *b, int arg)
{
    place *p = (place *)luaL_checkudata(L, arg, PLACE_MT);
    luaL_argcheck(L, p->b == b, arg, "a place in another bucket's queue");
    return p;
}

/* Gives the place up, once: the ones after it move up. */
static void bucket_give_up(place *p)
{
    if (!p->done) {
        p->done = 1;
        bucket_dequeue(p->b, p->n);
    }
}

static int bucket_l_place_close(lua_State *L)
{
    bucket_give_up((place *)luaL_checkudata(L, 1, PLACE_MT));
    return 0;
}

/* b:claim(place) -> 0 when its tokens were taken, or seconds to wait before
 * claiming again (a waiter before this one has not taken its tokens yet,
 * or a sync emptied the bucket). */
static int bucket_l_claim(lua_State *L)
{
    bucket *b = bucket_check(L);
    place *p = bucket_check_place(L, b, 2);
    double needed;
    luaL_argcheck(L, !p->done, 2, "this place was already claimed or given up");
    bucket_refill(b);
    needed = bucket_needed(b, p->ticket, p->n);
    /* A waiter that finds the bucket full while those ahead of it have not
     * claimed goes first: they are late by a whole bucket, or gone (a
     * place is given up when it is collected, which may be much later). */
    if (b->tokens >= needed || (b->tokens >= b->capacity && b->tokens >= p->n)) {
        b->tokens -= p->n;
        p->done = 1;
        bucket_dequeue(b, p->n);
        lua_pushnumber(L, 0.0);
    } else {
        lua_pushnumber(L, bucket_wait(b, needed));
    }
    return 1;
}

/* b:cancel(place): a waiter gives its place up (it was cancelled, or will
 * not wait that long). Giving up a place twice does nothing. */
static int bucket_l_cancel(lua_State *L)
{
    bucket *b = bucket_check(L);
    bucket_give_up(bucket_check_place(L, b, 2));
    return 0;
}

/* b:refund([n]): gives back tokens that were taken and will not be used.
 * n may be more than the bucket holds: what a limit asked for more than its
 * capacity took (rw.limiters' named limits: a full bucket and debt) comes
 * back whole, up to a full bucket. */
static int bucket_l_refund(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_amount(L, 2, 1);
    bucket_refill(b);
    b->tokens += n;
    if (b->tokens > b->capacity) b->tokens = b->capacity;
    return 0;
}

/* b:debit(n): takes n at once, into debt if need be, never waiting and
 * never refused: what the server has already counted (an answer that used
 * more than was taken for it), for the waiters after it to wait out. The
 * debt is believed only up to the bucket's sync_horizon, as a sync is. */
static int bucket_l_debit(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_amount(L, 2, NAN), floor_at;
    bucket_refill(b);
    floor_at = 1.0 - b->horizon * b->rate;
    b->tokens -= n;
    if (b->tokens < floor_at) b->tokens = floor_at;
    return 0;
}

/* b:wait_time([n]) -> seconds until n tokens are there for a caller
 * behind the queue (0: now), taking nothing: what a caller that needs
 * several buckets at once asks each. */
static int bucket_l_wait_time(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_count(L, b, 2);
    bucket_refill(b);
    lua_pushnumber(L, bucket_wait(b, bucket_pending(b) + n));
    return 1;
}

/* b:sync(remaining [, reset_in]): what the server says of its own quota.
 * The tokens in the bucket are lowered to `remaining` (never raised: the
 * client's view may be stricter), and the waiters in the queue take them
 * first; with nothing remaining, the next token is put off until the
 * server's reset, `reset_in` seconds from now, but never further than the
 * bucket's sync_horizon: a reset years away is a broken or hostile server
 * (or a clock), and believing it would stall every caller of the bucket. */
static int bucket_l_sync(lua_State *L)
{
    bucket *b = bucket_check(L);
    lua_Number remaining = bucket_number(L, 2, NAN, "remaining must be a non-negative number");
    lua_Number reset_in = bucket_number(L, 3, 0, "reset_in must be a non-negative number of seconds");
    luaL_argcheck(L, remaining >= 0 && !isnan(remaining), 2, "remaining must be a non-negative number");
    luaL_argcheck(L, reset_in >= 0 && !isnan(reset_in), 3, "reset_in must be a non-negative number of seconds");
    bucket_refill(b);
    if (remaining >= 1) {
        if (b->tokens > remaining) b->tokens = remaining;
    } else {
        /* The next token comes reset_in from now. */
        double reset = reset_in > b->horizon ? b->horizon : reset_in;
        double held = 1.0 - reset * b->rate;
        if (b->tokens > held) {
            b->tokens = held;
            b->held_until = b->updated + reset;
        }
    }
    return 0;
}

/* b:tokens() -> the balance now: the tokens in the bucket less those the
 * waiters in the queue have reserved (negative while they wait). */
static int bucket_l_tokens(lua_State *L)
{
    bucket *b = bucket_check(L);
    bucket_refill(b);
    lua_pushnumber(L, b->tokens - bucket_pending(b));
    return 1;
}

/* b:set_rate(rate): the rate from now on (what came in at the old rate
 * stays). The adaptive limiters move it; anyone may. A next token that a
 * sync put off until the server's reset still comes then: the server's
 * wait is a time, not a number of tokens, and counted in tokens at a rate
 * that drops it would stretch past the reset and the sync_horizon. */
static int bucket_l_set_rate(lua_State *L)
{
    bucket *b = bucket_check(L);
    lua_Number rate = luaL_checknumber(L, 2);
    luaL_argcheck(L, rate > 0 && isfinite(rate), 2, "rate must be a positive number");
    luaL_argcheck(L, rate <= BUCKET_MAX_RATE, 2, "rate is too large");
    luaL_argcheck(L, (b->capacity > 1 ? b->capacity : 1) / rate <= RW_MAX_SECONDS, 2, "rate is too small");
    bucket_refill(b);
    if (b->held_until > b->updated) {
        b->tokens += (b->held_until - b->updated) * (b->rate - rate);
        if (b->tokens > b->capacity) b->tokens = b->capacity;
    }
    b->rate = rate;
    return 0;
}

static int bucket_l_capacity(lua_State *L)
{
    lua_pushnumber(L, bucket_check(L)->capacity);
    return 1;
}

static int bucket_l_rate(lua_State *L)
{
    lua_pushnumber(L, bucket_check(L)->rate);
    return 1;
}

static int bucket_l_slows_down(lua_State *L)
{
    lua_pushboolean(L, bucket_check(L)->slow_down);
    return 1;
}

static int bucket_l_sync_horizon(lua_State *L)
{
    lua_pushnumber(L, bucket_check(L)->horizon);
    return 1;
}

/* Idempotent; __gc, __close and b:close() all come here. */
static int bucket_l_close(lua_State *L)
{
    bucket *b = (bucket *)luaL_checkudata(L, 1, BUCKET_MT);
    b->closed = 1;
    return 0;
}

static int bucket_l_tostring(lua_State *L)
{
    bucket *b = (bucket *)luaL_checkudata(L, 1, BUCKET_MT);
    if (b->closed) lua_pushliteral(L, "ratewise.Bucket (closed)");
    else lua_pushfstring(L, "ratewise.Bucket (capacity %f, rate %f/s)", b->capacity, b->rate);
    return 1;
}

void rw_bucket_register(lua_State *L)
{
    static const luaL_Reg methods[] = {
        { "take", bucket_l_take },
        { "reserve", bucket_l_reserve },
        { "claim", bucket_l_claim },
        { "cancel", bucket_l_cancel },
        { "refund", bucket_l_refund },
        { "debit", bucket_l_debit },
        { "wait_time", bucket_l_wait_time },
        { "sync", bucket_l_sync },
        { "tokens", bucket_l_tokens },
        { "capacity", bucket_l_capacity },
        { "rate", bucket_l_rate },
        { "set_rate", bucket_l_set_rate },
        { "sync_horizon", bucket_l_sync_horizon },
        { "slows_down", bucket_l_slows_down },
        { "close", bucket_l_close },
        { NULL, NULL }
    };
    static const luaL_Reg metamethods[] = {
        { "__gc", bucket_l_close },
        { "__close", bucket_l_close },
        { "__tostring", bucket_l_tostring },
        { NULL, NULL }
    };
    static const luaL_Reg place_metamethods[] = {
        { "__gc", bucket_l_place_close },
        { "__close", bucket_l_place_close },
        { NULL, NULL }
    };
    luaL_newmetatable(L, PLACE_MT);
    luaL_setfuncs(L, place_metamethods, 0);
    lua_pop(L, 1);
    luaL_newmetatable(L, BUCKET_MT);
    luaL_setfuncs(L, metamethods, 0);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    /* The Lua layer adds the methods that wait (acquire) to this table. */
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, "bucket_methods");
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    lua_pushcfunction(L, bucket_l_new);
    lua_setfield(L, -2, "bucket");
}
