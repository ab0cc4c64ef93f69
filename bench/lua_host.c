/*
 * lua_host SCRIPT [ARGS...]: a minimal stand-in for lua5.4, linked against
 * Debian's static liblua5.4.a, whose internal functions keep their names.
 * Debian's lua5.4 binary is stripped, so under callgrind or perf the
 * interpreter's time shows up as bare addresses; under lua_host it shows up
 * as luaV_execute, luaH_resize, str_find_aux, match and so on.
 * Exports its symbols (-Wl,-E) so that C modules such as ratewise.core load.
 */
#include <stdio.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

int main(int argc, char **argv)
{
    lua_State *L;
    int i, rc;
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRIPT [ARGS...]\n", argv[0]);
        return 2;
    }
    L = luaL_newstate();
    if (!L) return 1;
    luaL_openlibs(L);
    lua_createtable(L, argc, 1);
    for (i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - 1);
    }
    lua_setglobal(L, "arg");
    rc = luaL_loadfile(L, argv[1]);
    if (rc == LUA_OK) {
        for (i = 2; i < argc; i++) lua_pushstring(L, argv[i]);
        rc = lua_pcall(L, argc - 2, 0, 0);
    }
    if (rc != LUA_OK) fprintf(stderr, "lua_host: %s\n", lua_tostring(L, -1));
    lua_close(L);
    return rc == LUA_OK ? 0 : 1;
}
