/*
 * Fuzz target: the Redis reply framer (shared block resp: resp_parse, with
 * resp_format and parse_integer).
 *
 * The input is the bytes a Redis connection delivers. It is framed three
 * times: in one call, in random-sized pieces as recv() hands them over, and
 * byte by byte. The framer
 * only ever advances over whole elements, so both must end with the same
 * result and the same recorded strings. Every recorded string lies inside
 * the framed reply; a finished reply has a known type and no array open.
 *
 * Two round trips use the same input: its NUL-separated parts, formatted as
 * a command by resp_format, must frame back to the same strings; and
 * parse_integer accepts exactly an optional '-' and 1..19 digits whose
 * value fits a long long (-LLONG_MAX..LLONG_MAX).
 */
#define main zerohttpd_main
#ifndef ZEROHTTPD_SRC
#define ZEROHTTPD_SRC "../01_iterative/main.c"
#endif
#include ZEROHTTPD_SRC
#undef main
#include "common.h"

#define MAX_ARGS 8 /* command arguments in the round trip */

static void check_reply(const struct resp_reply *r, enum parse_result pr,
                        size_t len)
{
    CHECK(r->pos <= len);
    CHECK(r->depth >= 0 && r->depth <= RESP_MAX_DEPTH);
    CHECK(r->nitems <= RESP_MAX_ITEMS);
    for (size_t i = 0; i < r->nitems; i++)
        CHECK(r->item[i].off + r->item[i].len <= r->pos);
    for (int d = 0; d < r->depth; d++)
        CHECK(r->left[d] > 0);
    if (pr == PARSE_DONE)
        CHECK(r->depth == 0 && r->type != '\0' && strchr("+-:$*", r->type));
}

static void check_same(const struct resp_reply *a, const struct resp_reply *b)
{
    CHECK(a->pos == b->pos && a->depth == b->depth && a->type == b->type &&
          a->integer == b->integer && a->nitems == b->nitems);
    for (int d = 0; d < a->depth; d++)
        CHECK(a->left[d] == b->left[d]);
    for (size_t i = 0; i < a->nitems; i++)
        CHECK(a->item[i].off == b->item[i].off &&
              a->item[i].len == b->item[i].len);
}

/* The input in pieces: the same ending and strings as in one call. */
static void check_pieces(const uint8_t *data, size_t size, bool bytewise,
                         const struct resp_reply *once, enum parse_result pr)
{
    struct resp_reply r = {0};
    struct feed f;
    feed_init(&f, data, size, bytewise);
    enum parse_result pr2 = PARSE_AGAIN;
    while (pr2 == PARSE_AGAIN && feed_more(&f)) {
        pr2 = resp_parse(&r, f.buf, f.len);
        check_reply(&r, pr2, f.len);
    }
    CHECK(pr == pr2);
    check_same(once, &r);
    feed_free(&f);
}

/* resp_format then resp_parse gives back the arguments. */
static void check_command(const uint8_t *data, size_t size)
{
    char *copy = exact_buffer(size + 1);
    const char *argv[MAX_ARGS];
    int argc = 0;
    memcpy(copy, data, size);
    copy[size] = '\0';
    for (size_t i = 0; size > 0 && i <= size && argc < MAX_ARGS;
         i += strlen(copy + i) + 1)
        argv[argc++] = copy + i;

    struct strbuf out = {0};
    struct resp_reply r = {0};
    CHECK(resp_format(&out, argc, argv));
    CHECK(resp_parse(&r, out.data, out.len) == PARSE_DONE);
    CHECK(r.pos == out.len && r.type == '*' && r.integer == argc);
    CHECK(r.nitems == (size_t)argc);
    for (int i = 0; i < argc; i++)
        CHECK(r.item[i].len == strlen(argv[i]) &&
              memcmp(out.data + r.item[i].off, argv[i], r.item[i].len) == 0);
    sb_free(&out);
    free(copy);
}

/* parse_integer accepts exactly -?[0-9]{1,19} within -LLONG_MAX..LLONG_MAX,
 * with strtoll's value. */
static void check_integer(const uint8_t *data, size_t size)
{
    if (size > 24)
        return;
    char s[25];
    memcpy(s, data, size);
    s[size] = '\0';
    size_t sign = size > 0 && s[0] == '-', digits = size - sign;
    errno = 0;
    long long want = strtoll(s, NULL, 10);
    bool valid = digits >= 1 && digits <= 19 &&
                 strspn(s + sign, "0123456789") == digits && errno != ERANGE &&
                 want != LLONG_MIN;
    long long n = 0;
    CHECK(parse_integer(s, s + size, &n) == valid);
    if (valid)
        CHECK(n == want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct resp_reply once = {0};
    enum parse_result pr = resp_parse(&once, (const char *)data, size);
    check_reply(&once, pr, size);
    check_pieces(data, size, false, &once, pr);
    check_pieces(data, size, true, &once, pr);
    check_command(data, size);
    check_integer(data, size);
    return 0;
}
