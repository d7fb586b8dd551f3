/*
 * What every fuzz target shares. Each target includes a server's main.c first
 * (with main renamed, so its static functions are callable here), then this.
 *
 * Two tools for the checks:
 *  - CHECK(cond): an invariant. When it fails, print it and abort(), which
 *    libFuzzer reports as a crash with the input that caused it.
 *  - struct feed: the input handed to a resumable parser in pieces, as
 *    recv() would: random-sized ones, or one byte at a time. The bytes not
 *    "received" yet are poisoned, so a parser that looks past its `len` is
 *    an AddressSanitizer report.
 */
#include <sanitizer/asan_interface.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* The input, arriving in pieces. `len` bytes of buf have "arrived". */
struct feed {
    char *buf;       /* a heap copy of the whole input */
    size_t len;      /* bytes readable so far */
    size_t total;    /* bytes in the input */
    uint32_t random; /* xorshift32 state: picks the piece sizes */
    bool bytewise;   /* every piece is one byte */
};

/* The split is derived from the input itself (FNV-1a of its bytes), so each
 * input has its own split and a crash reproduces from the input alone. */
static inline void feed_init(struct feed *f, const uint8_t *data, size_t size,
                             bool bytewise)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 16777619u;
    *f = (struct feed){
        .buf = malloc(size ? size : 1), .total = size, .bytewise = bytewise};
    f->random = h ? h : 1;
    CHECK(f->buf != NULL);
    memcpy(f->buf, data, size);
    ASAN_POISON_MEMORY_REGION(f->buf, size);
}

static inline uint32_t feed_random(struct feed *f)
{
    uint32_t x = f->random;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return f->random = x;
}

/* Makes the next piece readable; false once everything has arrived. Piece
 * sizes mix single bytes, a few bytes, a packet's worth and the rest. */
static inline bool feed_more(struct feed *f)
{
    size_t left = f->total - f->len;
    if (left == 0)
        return false;
    uint32_t r = feed_random(f);
    size_t n = f->bytewise || r % 4 == 0 ? 1
               : r % 4 == 1              ? 1 + (r >> 2) % 8
               : r % 4 == 2              ? 1 + (r >> 2) % 256
                                         : left;
    if (n > left)
        n = left;
    ASAN_UNPOISON_MEMORY_REGION(f->buf + f->len, n);
    f->len += n;
    return true;
}

static inline void feed_free(struct feed *f)
{
    ASAN_UNPOISON_MEMORY_REGION(f->buf, f->total);
    free(f->buf);
}

/* A heap buffer of exactly `size` bytes, so a write past it is reported. */
static inline char *exact_buffer(size_t size)
{
    char *p = malloc(size ? size : 1);
    CHECK(p != NULL);
    return p;
}

/* Reference percent-decoder, written plainly to check url_decode against:
 * %XX (two hex digits) and, for forms, '+' as space. Returns the decoded
 * length, or -1 for a bad escape or a NUL, with *at = bytes decoded before
 * the fault. out holds len + 1 bytes. */
static inline long ref_decode(const char *in, size_t len, char *out, bool plus,
                              size_t *at)
{
    static const char hex[] = "0123456789abcdef0123456789ABCDEF";
    size_t n = 0;
    for (size_t i = 0; i < len; i++, n++) {
        *at = n;
        if (in[i] == '%') {
            const char *hi =
                i + 1 < len && in[i + 1] ? strchr(hex, in[i + 1]) : NULL;
            const char *lo =
                i + 2 < len && in[i + 2] ? strchr(hex, in[i + 2]) : NULL;
            if (!hi || !lo)
                return -1;
            out[n] = (char)((hi - hex) % 16 * 16 + (lo - hex) % 16);
            i += 2;
        } else
            out[n] = plus && in[i] == '+' ? ' ' : in[i];
        if (out[n] == '\0')
            return -1;
    }
    *at = n;
    out[n] = '\0';
    return (long)n;
}

/* What url_decode(in, len, out, size, plus) must return, given the
 * reference decoding: it reports "does not fit" (-2) as soon as the output
 * reaches size, so before any fault further on. */
static inline long expected_decode(long ref, size_t at, size_t size)
{
    if (at >= size)
        return -2;
    return ref;
}
