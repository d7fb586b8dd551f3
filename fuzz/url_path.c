/*
 * Fuzz target: percent-decoding and path checks (shared block static_files:
 * url_decode, decode_path).
 *
 * Input: one selector byte, then the string to decode. The selector picks
 * the output buffer's size (small sizes, and sizes around an exact fit) and
 * whether '+' means space. The output buffer is a heap block of exactly that
 * size, so any write past it is an AddressSanitizer report.
 *
 * Both functions are checked against a plain reference decoder: same return
 * value, same bytes. A path that decode_path accepts holds no NUL, no
 * backslash, no control byte and no `..` segment (no "/../", no final "/..").
 */
#define main zerohttpd_main
#ifndef ZEROHTTPD_SRC
#define ZEROHTTPD_SRC "../01_iterative/main.c"
#endif
#include ZEROHTTPD_SRC
#undef main
#include "common.h"

/* The size of the output buffer, from the selector: 1..96, or within 31
 * bytes below the length an exact fit needs (len + 1). */
static size_t pick_size(unsigned sel, size_t len)
{
    sel %= 128;
    if (sel < 96)
        return 1 + sel;
    size_t under = sel - 96;
    return len + 1 > under ? len + 1 - under : 1;
}

static void check_url_decode(const char *in, size_t len, size_t size, bool plus)
{
    char *out = exact_buffer(size), *ref = exact_buffer(len + 1);
    size_t at;
    long want = expected_decode(ref_decode(in, len, ref, plus, &at), at, size);
    long got = url_decode(in, len, out, size, plus);
    CHECK(got == want);
    if (got >= 0) {
        CHECK((size_t)got < size && out[got] == '\0');
        CHECK(memcmp(out, ref, (size_t)got) == 0);
        CHECK(strlen(out) == (size_t)got); /* no NUL inside */
    }
    free(out);
    free(ref);
}

/* Is any '/'-separated segment of path exactly ".."? */
static bool has_dotdot_segment(const char *path)
{
    for (const char *s = path;; s++) {
        const char *slash = strchr(s, '/');
        size_t n = slash ? (size_t)(slash - s) : strlen(s);
        if (n == 2 && s[0] == '.' && s[1] == '.')
            return true;
        if (!slash)
            return false;
        s = slash;
    }
}

/* The absolute form "http://authority[/path]", computed independently:
 * the path from the first '/' after the authority, or "/" when the
 * authority runs to the end or to a '?'. */
static const char *ref_origin(const char *uri, size_t *len)
{
    if (*len < 7 || strncasecmp(uri, "http://", 7) != 0)
        return uri;
    size_t i = 7;
    while (i < *len && uri[i] != '/' && uri[i] != '?')
        i++;
    if (i == *len || uri[i] == '?') {
        *len = 1;
        return "/";
    }
    *len -= i;
    return uri + i;
}

/* decode_path's contract, computed independently: 0, 400 or 414. */
static int ref_path_status(const char *uri, size_t len, size_t size, char *ref)
{
    uri = ref_origin(uri, &len);
    const char *query = memchr(uri, '?', len);
    if (query)
        len = (size_t)(query - uri);
    if (len == 0 || uri[0] != '/')
        return 400;
    size_t at;
    long n = expected_decode(ref_decode(uri, len, ref, false, &at), at, size);
    if (n == -2)
        return 414;
    if (n < 0)
        return 400;
    for (long i = 0; i < n; i++) {
        unsigned char c = (unsigned char)ref[i];
        if (c < ' ' || c == 0x7f || c == '\\')
            return 400;
    }
    return has_dotdot_segment(ref) ? 400 : 0;
}

static void check_decode_path(const char *uri, size_t len, size_t size)
{
    char *path = exact_buffer(size), *ref = exact_buffer(len + 1);
    int want = ref_path_status(uri, len, size, ref);
    int got = decode_path(uri, len, path, size);
    CHECK(got == want);
    if (got == 0) {
        size_t n = strlen(path);
        CHECK(n < size && path[0] == '/' && strcmp(path, ref) == 0);
        CHECK(!strstr(path, "/../") && !strchr(path, '\\'));
        CHECK(!(n >= 3 && strcmp(path + n - 3, "/..") == 0));
        for (size_t i = 0; i < n; i++)
            CHECK((unsigned char)path[i] >= ' ' && path[i] != 0x7f);
    }
    free(path);
    free(ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const char *in = (const char *)data + 1;
    size_t len = size - 1, out_size = pick_size(data[0], len);
    check_url_decode(in, len, out_size, data[0] & 128);
    check_decode_path(in, len, out_size);
    check_decode_path(in, len, MAX_URI + sizeof "index.html"); /* as served */
    return 0;
}
