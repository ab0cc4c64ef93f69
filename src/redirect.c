/*
 * The engine's own redirect following. Not libcurl's: libcurl would send
 * every header the caller gave (x-api-key, say) to any host a redirect
 * names, knowing only Authorization and Cookie for secrets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine.h"

/* A copy of s, or NULL (out of memory). */
static char *redirect_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *copy = (char *)malloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

/* "scheme://host:port" of a URL, lower-case, the port filled in (malloc'd),
 * or NULL when it does not parse. */
static char *redirect_origin(const char *url)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *out = NULL;
    if (!u) return NULL;
    if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK
        && curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK
        && curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK
        && curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        size_t n = strlen(scheme) + strlen(host) + strlen(port) + 5;
        out = (char *)malloc(n);
        if (out) {
            size_t i;
            (void)snprintf(out, n, "%s://%s:%s", scheme, host, port);
            for (i = 0; out[i]; i++) out[i] = (char)transfer_lower((unsigned char)out[i]);
        }
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return out;
}

/* A transfer libcurl completed with a redirect the request follows: puts
 * it back on the multi handle for the next URL and answers 1. Answers 0
 * when the response is the final one, or when the redirect cannot be
 * followed, with *code and the error text saying why. As a browser, curl
 * and Go do: a 303 (and a 301 or 302 to a POST) becomes a GET without a
 * body; 307 and 308 keep the method and body; the secret header lines go
 * only to the first URL's origin; the per-attempt timeout spans every hop. */
int rw_redirect_follow(engine *e, transfer *t, CURLcode *code)
{
    long status = 0;
    char *location = NULL, *next_url, *next_origin;
    double left = 0;
    int same_origin;
    CURLMcode mc;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 301 && status != 302 && status != 303 && status != 307 && status != 308) return 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_REDIRECT_URL, &location) != CURLE_OK || !location) return 0;
    if (t->redirects >= ENGINE_MAX_REDIRECTS) {
        *code = CURLE_TOO_MANY_REDIRECTS;
        rw_transfer_why(t, "Maximum (%ld) redirects followed", ENGINE_MAX_REDIRECTS);
        return 0;
    }
    if (strncasecmp(location, "http://", 7) != 0 && strncasecmp(location, "https://", 8) != 0) {
        size_t scheme = strspn(location, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.");
        *code = CURLE_UNSUPPORTED_PROTOCOL;
        rw_transfer_why(t, "a redirect to a \"%.*s\" URL was refused (only http and https are followed)",
                        (int)(scheme < 32 ? scheme : 32), location);
        return 0;
    }
    if (t->timeout > 0) {
        left = t->timeout - (rw_core_monotonic() - t->started);
        if (left <= 0) {
            *code = CURLE_OPERATION_TIMEDOUT;
            rw_transfer_why(t, "Operation timed out after %.0f milliseconds", t->timeout * 1000);
            return 0;
        }
    }
    if (!t->origin) { /* the first hop: the URL the request named */
        char *first = NULL;
        if (curl_easy_getinfo(t->easy, CURLINFO_EFFECTIVE_URL, &first) == CURLE_OK && first)
            t->origin = redirect_origin(first);
    }
    next_origin = redirect_origin(location);
    same_origin = t->origin && next_origin && strcmp(t->origin, next_origin) == 0;
    free(next_origin);
    next_url = redirect_strdup(location); /* location is the handle's, gone once it is removed */
    if (!next_url) {
        *code = CURLE_OUT_OF_MEMORY;
        rw_response_no_memory(t);
        return 0;
    }
    rw_transfer_hop_ended(t);
    curl_multi_remove_handle(e->multi, t->easy); /* a completed transfer: its connection is kept */
    rw_request_next_hop(t, next_url,
                        (status == 303 && t->method != METHOD_HEAD)
                            || ((status == 301 || status == 302) && t->method == METHOD_POST),
                        same_origin, left);
    free(t->effective_url);
    t->effective_url = next_url;
    rw_response_drop_body(t); /* the redirect's own body is not the answer */
    if (strncasecmp(next_url, "https://", 8) == 0 && !(t->dirty & DIRTY_HTTP1)) rw_transfer_may_multiplex(t);
    t->redirects++;
    mc = curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        *code = CURLE_OUT_OF_MEMORY;
        rw_transfer_why(t, "libcurl could not follow the redirect (%s)", curl_multi_strerror(mc));
        return 0;
    }
    return 1;
}

void rw_redirect_clear(transfer *t)
{
    free(t->effective_url);
    free(t->origin);
    t->effective_url = t->origin = NULL;
    t->redirects = 0;
}
