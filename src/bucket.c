/*
 * ratewise.Bucket: a token bucket on the monotonic clock.
 *
 * Waiters are served first come, first served by reservation: acquire takes
 * its tokens at once, letting the balance go negative, and is told how long
 * until that debt is repaid. Each later waiter sees the larger debt and so
 * waits longer, which orders them without a queue (as in Go's rate.Limiter).
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
#include <string.h>

#include "compat.h"
#include "ratewise.h"

#define BUCKET_MT "ratewise.Bucket"

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
    double tokens;    /* balance; negative while reservations are pending */
    double updated;   /* monotonic time of the last refill */
    double horizon;   /* sync never puts the next token further off than this */
    int closed;
} bucket;

static void bucket_refill(bucket *b)
{
    double now = rw_clock_monotonic();
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

static bucket *bucket_check(lua_State *L)
{
    bucket *b = (bucket *)luaL_checkudata(L, 1, BUCKET_MT);
    if (b->closed) luaL_argerror(L, 1, "bucket is closed");
    return b;
}

/* Token count argument: positive, at most the capacity (a larger request
 * could never be served and would wait forever). */
static double bucket_check_count(lua_State *L, bucket *b, int arg)
{
    lua_Number n = luaL_optnumber(L, arg, 1);
    if (!(n > 0) || !isfinite(n))
        luaL_argerror(L, arg, "token count must be a positive number");
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
    v = lua_tonumberx(L, -1, &isnum);
    if (!isnum || !(v > 0) || !isfinite(v))
        luaL_error(L, "bucket: option '%s' must be a positive number (got %s)", name,
                   luaL_tolstring(L, -1, NULL));
    lua_pop(L, 1);
    return v;
}

/* core.bucket{capacity = C, rate = R [, sync_horizon = seconds]} */
static int bucket_l_new(lua_State *L)
{
    bucket *b;
    double capacity, rate, horizon;
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        if (!key || (strcmp(key, "capacity") != 0 && strcmp(key, "rate") != 0
                     && strcmp(key, "sync_horizon") != 0))
            return luaL_error(L, "bucket: unknown option '%s' (expected capacity, rate, sync_horizon)",
                              luaL_tolstring(L, -2, NULL));
        lua_pop(L, 1);
    }
    capacity = bucket_field(L, "capacity", -1);
    rate = bucket_field(L, "rate", -1);
    horizon = bucket_field(L, "sync_horizon", BUCKET_DEFAULT_SYNC_HORIZON);
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
    b->updated = rw_clock_monotonic();
    b->horizon = horizon;
    b->closed = 0;
    luaL_setmetatable(L, BUCKET_MT);
    return 1;
}

/* b:take([n]) -> true | false, seconds until n tokens could be there */
static int bucket_l_take(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_count(L, b, 2);
    bucket_refill(b);
    if (b->tokens >= n) {
        b->tokens -= n;
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushboolean(L, 0);
    lua_pushnumber(L, bucket_wait(b, n));
    return 2;
}

/* b:reserve([n]) -> seconds the caller must wait before using the n tokens
 * it now holds (0: use them at once). */
static int bucket_l_reserve(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_count(L, b, 2);
    bucket_refill(b);
    b->tokens -= n;
    lua_pushnumber(L, bucket_wait(b, 0.0));
    return 1;
}

/* b:refund([n]): give back tokens of a reservation that will not be used
 * (a waiter that was cancelled). */
static int bucket_l_refund(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_count(L, b, 2);
    bucket_refill(b);
    b->tokens += n;
    if (b->tokens > b->capacity) b->tokens = b->capacity;
    return 0;
}

/* b:wait_time([n]) -> seconds until n tokens are there (0: now), taking
 * nothing: what a caller that needs several buckets at once asks each. */
static int bucket_l_wait_time(lua_State *L)
{
    bucket *b = bucket_check(L);
    double n = bucket_check_count(L, b, 2);
    bucket_refill(b);
    lua_pushnumber(L, bucket_wait(b, n));
    return 1;
}

/* b:sync(remaining [, reset_in]): what the server says of its own quota.
 * The balance is lowered to `remaining` (never raised: the client's view may
 * be stricter); with nothing remaining, the next token is put off until the
 * server's reset, `reset_in` seconds from now, but never further than the
 * bucket's sync_horizon: a reset years away is a broken or hostile server
 * (or a clock), and believing it would stall every caller of the bucket. */
static int bucket_l_sync(lua_State *L)
{
    bucket *b = bucket_check(L);
    lua_Number remaining = luaL_checknumber(L, 2);
    lua_Number reset_in = luaL_optnumber(L, 3, 0);
    luaL_argcheck(L, remaining >= 0 && !isnan(remaining), 2, "remaining must be a non-negative number");
    luaL_argcheck(L, reset_in >= 0 && !isnan(reset_in), 3, "reset_in must be a non-negative number of seconds");
    bucket_refill(b);
    if (remaining >= 1) {
        if (b->tokens > remaining) b->tokens = remaining;
    } else {
        /* A reservation of one token made now must wait reset_in. */
        double held = 1.0 - (reset_in > b->horizon ? b->horizon : reset_in) * b->rate;
        if (b->tokens > held) b->tokens = held;
    }
    return 0;
}

/* b:tokens() -> the balance now (negative while waiters hold reservations) */
static int bucket_l_tokens(lua_State *L)
{
    bucket *b = bucket_check(L);
    bucket_refill(b);
    lua_pushnumber(L, b->tokens);
    return 1;
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
        { "refund", bucket_l_refund },
        { "wait_time", bucket_l_wait_time },
        { "sync", bucket_l_sync },
        { "tokens", bucket_l_tokens },
        { "capacity", bucket_l_capacity },
        { "rate", bucket_l_rate },
        { "sync_horizon", bucket_l_sync_horizon },
        { "close", bucket_l_close },
        { NULL, NULL }
    };
    static const luaL_Reg metamethods[] = {
        { "__gc", bucket_l_close },
        { "__close", bucket_l_close },
        { "__tostring", bucket_l_tostring },
        { NULL, NULL }
    };
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
