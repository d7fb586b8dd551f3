/*
 * Fuzz target: the HTTP request parser (shared block http_parser) and the
 * router that reads its result (route_request, hence decode_path).
 *
 * The input is one request stream. It is parsed three times: in one call,
 * in random-sized pieces the way a server receives it, and byte by byte. The
 * parser is resumable, so both must end the same way with the same fields. Then
 * the invariants: positions inside the input, a known status on error, a head
 * no longer than MAX_HEAD, and a route that agrees with the parse.
 */
#define main zerohttpd_main
#ifndef ZEROHTTPD_SRC
#define ZEROHTTPD_SRC "../01_iterative/main.c"
#endif
#include ZEROHTTPD_SRC
#undef main
#include "common.h"

static bool known_error(int status)
{
    static const int known[] = {400, 411, 413, 414, 431, 501, 505};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (status == known[i])
            return true;
    return false;
}

static void check_same(const struct http_request *a,
                       const struct http_request *b, enum parse_result pr)
{
    CHECK(a->state == b->state && a->pos == b->pos && a->status == b->status);
    if (pr != PARSE_DONE)
        return; /* the rest is only defined for a complete head */
    CHECK(a->method == b->method && a->uri == b->uri &&
          a->uri_len == b->uri_len && a->minor == b->minor &&
          a->content_length == b->content_length && a->body == b->body);
    CHECK(a->has_host == b->has_host &&
          a->form_type == b->form_type && a->close == b->close &&
          a->keep_alive_asked == b->keep_alive_asked &&
          a->keep_alive == b->keep_alive);
}

static void check_done(struct http_request *r, const char *buf, size_t len)
{
    CHECK(r->body == r->pos && r->body <= len && r->body <= MAX_HEAD);
    CHECK(r->uri_len > 0 && r->uri_len <= MAX_URI &&
          r->uri + r->uri_len < r->body);
    CHECK(r->minor == 0 || r->minor == 1);
    CHECK(r->minor == 0 || r->has_host);
    CHECK(r->content_length >= -1 && r->content_length <= MAX_BODY);
    CHECK(r->method != METHOD_POST || r->content_length >= 0);
    CHECK(!r->keep_alive || KEEP_ALIVE);
    CHECK(request_size(r) >= r->body);
    for (size_t i = r->uri; i < r->uri + r->uri_len; i++)
        CHECK((unsigned char)buf[i] > ' ' && buf[i] != 0x7f);

    char path[MAX_URI + sizeof "index.html"];
    enum route route = route_request(r, buf, path, sizeof path);
    if (route == ROUTE_ERROR)
        CHECK(r->status == 400 || r->status == 405 || r->status == 414 ||
              r->status == 415 || r->status == 501);
    else {
        CHECK(path[0] == '/' && strlen(path) <= MAX_URI);
        CHECK(!strstr(path, "/../") && !strchr(path, '\\'));
        CHECK((route == ROUTE_POST) ==
              (r->method == METHOD_POST && r->form_type));
    }
}

/* The input in pieces: the same ending and fields as in one call. */
static void check_pieces(const uint8_t *data, size_t size, bool bytewise,
                         const struct http_request *once, enum parse_result pr)
{
    struct http_request r;
    struct feed f;
    feed_init(&f, data, size, bytewise);
    http_request_init(&r);
    enum parse_result pr2 = PARSE_AGAIN;
    while (pr2 == PARSE_AGAIN && feed_more(&f)) {
        pr2 = http_parse(&r, f.buf, f.len);
        CHECK(r.pos <= f.len);
    }
    CHECK(pr == pr2);
    check_same(once, &r, pr);
    if (pr == PARSE_DONE)
        check_done(&r, f.buf, size);
    feed_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_request once;
    http_request_init(&once);
    enum parse_result pr = http_parse(&once, (const char *)data, size);
    CHECK(once.pos <= size);
    if (pr == PARSE_ERROR)
        CHECK(known_error(once.status) && !once.keep_alive);
    if (pr == PARSE_AGAIN)
        CHECK(once.pos == size && size <= MAX_HEAD);
    check_pieces(data, size, false, &once, pr);
    check_pieces(data, size, true, &once, pr);
    return 0;
}
