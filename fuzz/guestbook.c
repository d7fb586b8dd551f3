/*
 * Fuzz target: the guestbook's pure parts (shared block guestbook:
 * html_escape, utf8_chars, form_field, guest_entry, format_form_page,
 * render_entry, format_count, render_page).
 *
 * The input is used whole, six ways:
 *  - as text to escape: the output holds no raw < > " ' and every & starts
 *    one of the five entities; unescaping it gives the input back;
 *  - as a POST body: form_field and guest_entry agree with a reference
 *    decoder and a reference UTF-8 reader (Unicode's Table 3-7) under the
 *    form rule (code points, CR LF as one), and a stored entry renders
 *    back to its escaped name and remark;
 *  - as a refused form's body: the page (format_form_page) keeps both
 *    fields, escaped, decoded or as sent;
 *  - as a stored Redis element: render_entry matches the documented
 *    "<name length>:<name><remark>" reading, escaped;
 *  - as the page template (the global server.template): render_page fills
 *    the placeholders as a plain left-to-right substitution would;
 *  - its first 8 bytes as a visitor count: format_count groups digits by 3.
 */
#define main zerohttpd_main
#ifndef ZEROHTTPD_SRC
#define ZEROHTTPD_SRC "../01_iterative/main.c"
#endif
#include ZEROHTTPD_SRC
#undef main
#include "common.h"

#define ENTRY_OPEN  "<p class=\"guest-entry\">"
#define ENTRY_NAME  " <span class=\"guest-name\">&mdash; "
#define ENTRY_CLOSE "</span></p>\n"

static const char *const entities[][2] = {
    {"&amp;", "&"},   {"&lt;", "<"},  {"&gt;", ">"},
    {"&quot;", "\""}, {"&#39;", "'"},
};

/* A plain escaper to compare against. */
static void ref_escape(struct strbuf *out, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        const char *e = NULL;
        for (size_t k = 0; k < 5; k++)
            if (s[i] == entities[k][1][0])
                e = entities[k][0];
        CHECK(e ? sb_puts(out, e) : sb_append(out, s + i, 1));
    }
}

/* e is safe HTML text and unescapes to s. */
static void check_escaped(const char *e, size_t elen, const char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < elen; i++, o++) {
        CHECK(!strchr("<>\"'", e[i]) || e[i] == '\0');
        char c = e[i];
        if (c == '&') {
            size_t k = 0;
            while (k < 5 && !(elen - i >= strlen(entities[k][0]) &&
                              memcmp(e + i, entities[k][0],
                                     strlen(entities[k][0])) == 0))
                k++;
            CHECK(k < 5); /* a bare & */
            c = entities[k][1][0];
            i += strlen(entities[k][0]) - 1;
        }
        CHECK(o < len && s[o] == c);
    }
    CHECK(o == len);
}

static void check_html_escape(const char *s, size_t len)
{
    struct strbuf out = {0};
    CHECK(html_escape(&out, s, len));
    check_escaped(out.data, out.len, s, len);
    sb_free(&out);
}

/* The raw value of field `name` (the first name=value pair), as sent; an
 * empty value at body when there is none. */
static void raw_field(const char *body, size_t len, const char *name,
                      const char **value, size_t *vlen)
{
    size_t nl = strlen(name);
    *value = body;
    *vlen = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && body[j] != '&')
            j++;
        if (j - i > nl && body[i + nl] == '=' &&
            memcmp(body + i, name, nl) == 0) {
            *value = body + i + nl + 1;
            *vlen = j - i - nl - 1;
            return;
        }
        i = j + 1;
    }
}

/* form_field's contract, computed plainly: the first name=value pair,
 * decoded with '+' as space; -1 for a bad escape or a NUL. out holds
 * len + 1 bytes. */
static long ref_field(const char *body, size_t len, const char *name, char *out)
{
    const char *value;
    size_t vlen, at;
    out[0] = '\0';
    raw_field(body, len, name, &value, &vlen);
    return vlen ? ref_decode(value, vlen, out, true, &at) : 0;
}

static void check_form_field(const char *body, size_t len, const char *name)
{
    char *ref = exact_buffer(len + 1);
    struct strbuf out = {0};
    long want = ref_field(body, len, name, ref);
    enum form_fault got = form_field(body, len, name, &out);
    CHECK(got == (want < 0 ? FORM_ENCODING : FORM_OK));
    if (got == FORM_OK)
        CHECK(out.len == (size_t)want && out.data[out.len] == '\0' &&
              memcmp(out.data, ref, out.len) == 0);
    sb_free(&out);
    free(ref);
}

/* Code points in valid UTF-8 as the form counts them (CR LF is one), -1
 * if not valid: the well-formed sequences of Unicode's Table 3-7, spelled
 * out row by row. */
static long ref_chars(const unsigned char *s, size_t len)
{
    long chars = 0;
    for (size_t i = 0; i < len; chars++) {
        unsigned char b = s[i];
        size_t left = len - i;
#define IN(k, lo, hi) (left > (k) && s[i + (k)] >= (lo) && s[i + (k)] <= (hi))
        size_t n = b <= 0x7f                                             ? 1
                   : b >= 0xc2 && b <= 0xdf && IN(1, 0x80, 0xbf)         ? 2
                   : b == 0xe0 && IN(1, 0xa0, 0xbf) && IN(2, 0x80, 0xbf) ? 3
                   : ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) &&
                           IN(1, 0x80, 0xbf) && IN(2, 0x80, 0xbf)
                       ? 3
                   : b == 0xed && IN(1, 0x80, 0x9f) && IN(2, 0x80, 0xbf) ? 3
                   : b == 0xf0 && IN(1, 0x90, 0xbf) && IN(2, 0x80, 0xbf) &&
                           IN(3, 0x80, 0xbf)
                       ? 4
                   : b >= 0xf1 && b <= 0xf3 && IN(1, 0x80, 0xbf) &&
                           IN(2, 0x80, 0xbf) && IN(3, 0x80, 0xbf)
                       ? 4
                   : b == 0xf4 && IN(1, 0x80, 0x8f) && IN(2, 0x80, 0xbf) &&
                           IN(3, 0x80, 0xbf)
                       ? 4
                       : 0;
#undef IN
        if (n == 0)
            return -1;
        i += b == '\r' && left > 1 && s[i + 1] == '\n' ? 2 : n;
    }
    return chars;
}

/* The paragraph render_entry must produce for a name and a remark. */
static void expected_entry(struct strbuf *out, const char *name, size_t nlen,
                           const char *remark, size_t rlen)
{
    CHECK(sb_puts(out, ENTRY_OPEN));
    ref_escape(out, remark, rlen);
    CHECK(sb_puts(out, ENTRY_NAME));
    if (nlen > 0)
        ref_escape(out, name, nlen);
    else
        CHECK(sb_puts(out, "anonymous"));
    CHECK(sb_puts(out, ENTRY_CLOSE));
}

static void check_rendered(const char *e, size_t len, const char *name,
                           size_t nlen, const char *remark, size_t rlen)
{
    struct strbuf got = {0}, want = {0};
    CHECK(render_entry(&got, e, len));
    expected_entry(&want, name, nlen, remark, rlen);
    CHECK(got.len == want.len &&
          (got.len == 0 || memcmp(got.data, want.data, got.len) == 0));
    sb_free(&got);
    sb_free(&want);
}

/* A POST body becomes an entry under the form rule, and the entry renders
 * its name and remark. */
static void check_guest_entry(const char *body, size_t len)
{
    char *name = exact_buffer(len + 1), *remark = exact_buffer(len + 1);
    struct strbuf entry = {0};
    long nlen = ref_field(body, len, "guest-name", name);
    long rlen = ref_field(body, len, "guest-remarks", remark);
    long nchars =
        nlen < 0 ? -1 : ref_chars((unsigned char *)name, (size_t)nlen);
    long rchars =
        rlen < 0 ? -1 : ref_chars((unsigned char *)remark, (size_t)rlen);
    bool refused =
        nchars < 0 || rchars <= 0 || nchars > MAX_NAME || rchars > MAX_REMARK;
    int status = guest_entry(body, len, &entry);
    CHECK(status == (refused ? 400 : 0));
    if (status == 0) {
        /* the bound the form rule keeps: 4 bytes a code point at most */
        CHECK(nlen <= 4 * MAX_NAME && rlen <= 4 * MAX_REMARK);
        CHECK(strlen(entry.data) == entry.len);
        check_rendered(entry.data, entry.len, name, (size_t)nlen, remark,
                       (size_t)rlen);
    }
    sb_free(&entry);
    free(name);
    free(remark);
}

/* One field of a refused form's page: escaped, and it unescapes to the
 * decoded value, or to the value as sent when that does not decode. */
static void check_kept(const char *shown, size_t slen, const char *body,
                       size_t len, const char *name)
{
    char *ref = exact_buffer(len + 1);
    long n = ref_field(body, len, name, ref);
    const char *value;
    size_t vlen;
    raw_field(body, len, name, &value, &vlen);
    if (n >= 0)
        check_escaped(shown, slen, ref, (size_t)n);
    else
        check_escaped(shown, slen, value, vlen);
    free(ref);
}

/* A refused form (400) with this body: the page keeps both fields. The
 * template ends each form placeholder with "<|", which no escaped field
 * holds (html_escape turns every '<' into "&lt;") and no message either. */
static void check_form_page(const char *body, size_t len)
{
    static char t[] = "$FORM_MESSAGE$<|$FORM_NAME$<|$FORM_REMARK$<|";
    struct http_request r;
    struct strbuf out = {0};
    http_request_init(&r);
    r.method = METHOD_POST;
    server.template = t;
    server.template_len = sizeof t - 1;
    CHECK(format_form_page(&out, &r, body, len, 400));
    server.template = NULL;
    server.template_len = 0;
    char *end = out.data + out.len,
         *page = memmem(out.data, out.len, "\r\n\r\n", 4);
    CHECK(page != NULL);
    page += 4;
    char *name = memmem(page, (size_t)(end - page), "<|", 2);
    CHECK(name && memmem(page, (size_t)(name - page), "\"form-message\"", 14));
    name += 2;
    char *remark = memmem(name, (size_t)(end - name), "<|", 2);
    CHECK(remark != NULL);
    remark += 2;
    char *last = memmem(remark, (size_t)(end - remark), "<|", 2);
    CHECK(last == end - 2);
    check_kept(name, (size_t)(remark - 2 - name), body, len, "guest-name");
    check_kept(remark, (size_t)(last - remark), body, len, "guest-remarks");
    sb_free(&out);
}

/* Any stored element: "<n>:" (n = 0..999, within the element) then n bytes
 * of name, then the remark; otherwise all of it is an anonymous remark. */
static void check_render_entry(const char *e, size_t len)
{
    const char *colon = memchr(e, ':', len < 4 ? len : 4);
    size_t digits = colon ? (size_t)(colon - e) : 0, nlen = 0;
    bool numeric = digits > 0 && strspn(e, "0123456789") >= digits;
    bool negzero = digits > 1 && e[0] == '-' &&
                   strspn(e + 1, "0") >= digits - 1; /* "-0:", "-00:" */
    if (numeric || negzero) {
        for (size_t i = negzero; i < digits; i++)
            nlen = nlen * 10 + (size_t)(e[i] - '0');
        if (nlen <= len - digits - 1) {
            const char *name = colon + 1;
            check_rendered(e, len, name, nlen, name + nlen,
                           len - digits - 1 - nlen);
            return;
        }
    }
    check_rendered(e, len, NULL, 0, e, len);
}

/* 1234567 -> "1,234,567"; a negative count shows as 0. */
static void check_format_count(long long n)
{
    char out[40], digits[32];
    format_count(n, out, sizeof out);
    snprintf(digits, sizeof digits, "%lld", n < 0 ? 0 : n);
    size_t len = strlen(out), first = strcspn(out, ",");
    CHECK(first >= 1 && first <= 3);
    for (size_t i = first; i < len; i += 4)
        CHECK(out[i] == ',' && strspn(out + i + 1, "0123456789") == 3);
    size_t d = 0;
    for (size_t i = 0; i < len; i++)
        if (out[i] != ',')
            CHECK(out[i] == digits[d++]);
    CHECK(digits[d] == '\0');
}

/* render_page against a plain substitution, with t as the template: the
 * remarks and the count in their places, the form's three placeholders
 * (message, name, remark) empty. */
static void check_render_page(const char *t, size_t len,
                              const struct strbuf *remarks, long long visitors)
{
    static const char *const empty[] = {"$FORM_MESSAGE$", "$FORM_NAME$",
                                        "$FORM_REMARK$"};
    static const char rem[] = "$GUEST_REMARKS$", vis[] = "$VISITOR_COUNT$";
    char count[40];
    struct strbuf got = {0}, want = {0};
    format_count(visitors, count, sizeof count);
    for (size_t i = 0; i < len;) {
        size_t k = 0;
        while (k < 3 && !(len - i >= strlen(empty[k]) &&
                          memcmp(t + i, empty[k], strlen(empty[k])) == 0))
            k++;
        if (k < 3)
            i += strlen(empty[k]);
        else if (len - i >= sizeof rem - 1 &&
                 memcmp(t + i, rem, sizeof rem - 1) == 0) {
            CHECK(sb_append(&want, remarks->data, remarks->len));
            i += sizeof rem - 1;
        } else if (len - i >= sizeof vis - 1 &&
                   memcmp(t + i, vis, sizeof vis - 1) == 0) {
            CHECK(sb_puts(&want, count));
            i += sizeof vis - 1;
        } else
            CHECK(sb_append(&want, t + i++, 1));
    }
    server.template = (char *)t;
    server.template_len = len;
    CHECK(render_page(&got, remarks, visitors));
    server.template = NULL;
    server.template_len = 0;
    CHECK(got.len == want.len &&
          (got.len == 0 || memcmp(got.data, want.data, got.len) == 0));
    sb_free(&got);
    sb_free(&want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"guest-name", "guest-remarks", "a", ""};
    const char *s = (const char *)data;
    check_html_escape(s, size);
    if (size > 0)
        check_form_field(s, size, names[data[0] % 4]);
    check_guest_entry(s, size);
    check_form_page(s, size);
    check_render_entry(s, size);

    long long visitors = 0;
    memcpy(&visitors, data, size < sizeof visitors ? size : sizeof visitors);
    check_format_count(visitors);
    /* As the server has them: no remarks at all (an empty buffer that was
     * never allocated), or this input as the one stored remark. */
    struct strbuf remarks = {0};
    if (size % 2 == 0)
        CHECK(render_entry(&remarks, s, size));
    check_render_page(s, size, &remarks, visitors);
    sb_free(&remarks);
    return 0;
}
