/*
 * 03_preforked: a fixed pool of worker processes, each blocking in accept().
 *
 * The model. The parent forks ZEROHTTPD_WORKERS workers (default 32), then
 * only supervises: it replaces a worker that dies and stops all on SIGTERM.
 * Each worker loops: accept() on the shared socket, serve that client to the
 * end, accept again. Linux wakes one waiting accept(): no thundering herd.
 *
 * One request's life:
 *   worker: accept() -> serve_connection() (as in 01) -> accept() ...
 *   parent: sigwait() -> SIGCHLD -> waitpid() -> fork() a replacement
 *
 * What it gains: no fork() per connection, one Redis connection per worker.
 * What it costs: the pool size is the concurrency limit. N idle keep-alive
 * clients hold all N workers; the rest wait until the 5 s idle timeout.
 * Where it breaks: when clients outnumber workers (more cost processes).
 *
 * Diff with: 02_forking/main.c and 05_prethreaded/main.c (a pool of threads).
 * Run: ZEROHTTPD_WORKERS=32 ./preforked [port [redis-host [redis-port]]]
 */

/* ===== Includes, constants and limits ===== */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- shared: config ---- */
/* Tunables shared by every server, each with its reason. */
#define DEFAULT_PORT       8000
#define DEFAULT_REDIS_HOST "127.0.0.1"
#define DEFAULT_REDIS_PORT 6379
#define LISTEN_BACKLOG     16384 /* the kernel caps it at somaxconn */
#define MAX_HEAD           8192  /* request line + headers, else 431 */
#define MAX_URI            4096  /* request target, else 414 */
#define MAX_METHOD         16    /* longer than any method we know */
/* The form rule (docs/DESIGN.md §3): what the form accepts, we accept.
 * The template's maxlength counts UTF-16 units, never fewer than code
 * points, so the limits count code points of valid UTF-8 (a line break,
 * sent as CR LF, is one). The worst form a browser sends spends 9 bytes on
 * a unit: a 3-byte character percent-encoded, "%E4%B8%80". */
#define MAX_REMARK       2000 /* code points: the textarea's maxlength */
#define MAX_NAME         100  /* code points: the name input's maxlength */
#define FORM_UNIT_BYTES  9    /* on the wire, per UTF-16 unit at worst */
#define FORM_NAMES_BYTES 32   /* "guest-name=&guest-remarks=", and room */
#define MAX_BODY              /* POST body, else 413: 18,932 bytes */          \
    (FORM_UNIT_BYTES * (MAX_REMARK + MAX_NAME) + FORM_NAMES_BYTES)
#define CONN_BUF_SIZE      (MAX_HEAD + MAX_BODY) /* one whole request fits */
#define IDLE_TIMEOUT_MS    5000        /* keep-alive wait between requests */
#define REQUEST_TIMEOUT_MS 10000       /* first byte to last byte of one */
#define LINGER_MS          500         /* drain unread input before close */
#define LINGER_MAX_BYTES   (64 * 1024) /* ...but no more than this */
#define REDIS_TIMEOUT_MS   1000        /* connect or reply: 503 after this */
#define REDIS_READ_SIZE    16384     /* room made for each recv() of replies */
#define DRAIN_CHUNK        4096      /* lingering: bytes dropped per recv() */
#define STRBUF_MAX         (4 << 20) /* largest page or Redis reply */
#define RESP_MAX_LINE      64        /* a RESP type line: type + number */
#define RESP_MAX_DEPTH     4         /* nested arrays we follow */
#define RESP_MAX_ITEMS     128       /* strings in one reply */
#define GUESTBOOK_SHOWN    "100"     /* newest remarks on the page */
#define PUBLIC_DIR         "public"
#define TEMPLATE_PATH      "templates/guestbook/index.html"
#define TEMPLATE_MAX       (256 * 1024) /* refuse a runaway template */
#define STATUS_CLASSES     6            /* 1xx..5xx, index by status / 100 */
#define HTTP_DATE_SIZE     40  /* "Sun, 06 Nov 1994 08:49:37 GMT" and room */
#define ETAG_SIZE          64  /* three 64-bit numbers in hex, quoted */
#define HEAD_ROOM          512 /* bytes reserved for a response head */
/* The interim answer to Expect: 100-continue (RFC 9110 §10.1.1). */
#define CONTINUE_LINE "HTTP/1.1 100 Continue\r\n\r\n"
/* The guestbook changes with every visit: no cache may keep it. */
#define PAGE_HEADERS   "Cache-Control: no-store\r\n"
#define POSTED_HEADERS "Location: /guestbook\r\nCache-Control: no-store\r\n"
/* ---- end shared: config ---- */

/* This model's own settings. */
#define SERVER_NAME     "preforked"
#define KEEP_ALIVE      true  /* the worker awaits its client's next request */
#define ACCEPT_WAKE_MS  1000  /* how late a stop request may be noticed */
#define SEND_TIMEOUT_MS 10000 /* a reader that stops reading is dropped */
#define EMFILE_PAUSE_MS 10    /* out of descriptors: wait, then retry */
#define DEFAULT_WORKERS 32    /* ZEROHTTPD_WORKERS overrides */
#define MAX_WORKERS     4096  /* a sanity bound, well under pid_max */

/* ===== Types ===== */

/* ---- shared: types ---- */
/* PARSE_AGAIN: call the parser again with more bytes. PARSE_CLOSED, from
 * read_request() (01-05, 10) alone: no request to answer (the client left
 * or was too slow): just close. */
enum parse_result { PARSE_AGAIN, PARSE_DONE, PARSE_ERROR, PARSE_CLOSED };

enum method { METHOD_GET, METHOD_HEAD, METHOD_POST, METHOD_OTHER };

enum parse_state {
    S_METHOD,     /* reading the method token */
    S_URI,        /* reading the request target */
    S_VERSION,    /* reading "HTTP/x.y" */
    S_REQUEST_LF, /* saw CR after the version */
    S_HEADER,     /* at the start of a header line (or the blank line) */
    S_NAME,       /* reading a header name */
    S_VALUE,      /* reading a header value */
    S_HEADER_LF,  /* saw CR after a header value */
    S_BLANK_LF,   /* saw CR on the blank line */
    S_DONE        /* the head is complete: more bytes are body */
};

/* A header's value in the connection's buffer; len 0: the header is absent. */
struct span {
    size_t off, len;
};

/* One request as the parser sees it. Positions are offsets into the
 * connection's buffer, which stays put until the request is answered. */
struct http_request {
    enum parse_state state; /* where the parser stopped, to resume there */
    size_t pos;             /* next byte to look at */
    size_t tok;             /* start of the token being read */
    size_t name, name_len;  /* the header whose value is being read */
    size_t value_end;       /* end of that value (before CR) */
    enum method method;
    size_t uri, uri_len;
    int minor;                /* HTTP/1.<minor> */
    long long content_length; /* -1 when absent */
    bool has_host, form_type;
    bool close, keep_alive_asked; /* Connection: close / keep-alive */
    bool keep_alive;              /* decided once the head is parsed */
    bool expect_continue;         /* Expect: 100-continue, not yet answered */
    struct span if_none_match, if_modified_since; /* conditions on a file */
    struct span range, if_range;                  /* part of a file */
    size_t body;                                  /* the first body byte */
    int status; /* the error when PARSE_ERROR */
};

/* A growable byte buffer, bounded by STRBUF_MAX. */
struct strbuf {
    char *data;
    size_t len, cap;
};

/* A Redis reply being framed; see resp_parse(). */
struct resp_reply {
    size_t pos;                       /* start of the next unparsed element */
    int depth;                        /* arrays still open */
    long long left[RESP_MAX_DEPTH];   /* elements each open array still owes */
    char type;                        /* top-level type: + - : $ * */
    long long integer;                /* ':' value, or '$'/'*' length */
    size_t nitems;                    /* strings found, in reply order */
    struct span item[RESP_MAX_ITEMS]; /* where they are in the buffer */
};

/* Requests served, for the summary: a MAP_SHARED page updated with atomics,
 * so the count is right whatever serves the requests: this process, its
 * threads or its child processes. */
struct stats {
    unsigned long served;
    unsigned long by_class[STATUS_CLASSES];
};

/* What the whole server knows, set up once in main(). */
struct server {
    int port;
    struct sockaddr_storage redis_addr; /* resolved once at start */
    socklen_t redis_addr_len;
    int listen_fd;
    int public_fd;  /* O_PATH handle on public/, root for openat2 */
    char *template; /* the guestbook page, NULL if unreadable */
    size_t template_len;
    bool log; /* ZEROHTTPD_LOG=1 */
    struct stats *stats;
};

enum route { ROUTE_STATIC, ROUTE_PAGE, ROUTE_POST, ROUTE_ERROR };
/* ---- end shared: types ---- */

/* A Redis connection and its buffers; one per worker in blocking models. */
struct redis {
    int fd;            /* -1 while disconnected */
    struct strbuf out; /* the command being sent */
    struct strbuf in;  /* reply bytes as they arrive */
    struct resp_reply reply;
};

/* One client connection, from accept() to close(). */
struct conn {
    int fd;
    char *buf;  /* CONN_BUF_SIZE bytes: the request(s) read so far */
    size_t len; /* bytes in buf */
    struct http_request req;
    struct strbuf out;  /* the response head (and body, unless a file) */
    struct strbuf work; /* scratch: the rendered guestbook entries */
    struct redis *redis;
};

static struct server server;
static volatile sig_atomic_t stop_requested; /* set by SIGINT/SIGTERM */

/* ===== What the model uses from the app below ===== */

/* ---- shared: app_api ---- */
/* The app, defined after main(), the same in every file: all a model calls. */

/* Start-up (arguments, signals, public/, template, listener); the summary. */
static void server_init(int argc, char **argv);
static int env_number(const char *var, int fallback, int min, int max);
static void print_summary(void);
static void die(const char *what);

/* A request: the resumable parser, its size, what it is for, its Expect. */
static void http_request_init(struct http_request *r);
static enum parse_result http_parse(struct http_request *r, const char *buf,
                                    size_t len);
static size_t request_size(const struct http_request *r);
static enum route route_request(struct http_request *r, const char *buf,
                                char *path, size_t size);
static int expect_answer(struct http_request *r, const char *buf);

/* A response: the head, a whole error page (for a refused form, the
 * guestbook page again) or redirect, the count. */
static bool format_head(struct strbuf *out, const struct http_request *r,
                        int status, const char *type, size_t length,
                        const char *extra);
static bool format_error(struct strbuf *out, const struct http_request *r,
                         int status, const char *extra);
static bool format_refusal(struct strbuf *out, const struct http_request *r,
                           const char *buf, int status, const char *extra);
static void slash_location(const struct http_request *r, const char *buf,
                           char *out, size_t size);
static void record_response(const struct http_request *r, const char *buf,
                            int status, size_t bytes);

/* A static file beneath public/, its type, and what to send of it. */
static int open_public(char *path, size_t size, struct stat *st, int *status);
static const char *mime_type(const char *path);
static int static_response(struct strbuf *out, const struct http_request *r,
                           const char *buf, const char *type,
                           const struct stat *st, off_t *offset, off_t *length);

/* The guestbook: Redis commands out and replies in (RESP), the page. */
static bool resp_format(struct strbuf *out, int argc, const char *const argv[]);
static enum parse_result resp_parse(struct resp_reply *r, const char *buf,
                                    size_t len);
static bool parse_integer(const char *s, const char *end, long long *out);
static int guest_entry(const char *body, size_t len, struct strbuf *entry);
static bool render_remarks(struct strbuf *out, const char *buf,
                           const struct resp_reply *r);
static bool render_page(struct strbuf *out, const struct strbuf *remarks,
                        long long visitors);

/* Growable byte buffers, and the clock every timeout reads. */
static bool sb_reserve(struct strbuf *b, size_t extra);
static bool sb_append(struct strbuf *b, const void *data, size_t n);
static void sb_free(struct strbuf *b);
static int64_t now_ms(void);
/* ---- end shared: app_api ---- */

/* ===== The concurrency model: a pool of processes ===== */

/* ---- shared: blocking_decls ---- */
/* Serving one connection in blocking style: declared here, defined below,
 * after the model's own functions (01-05 block a thread; 10 runs the same
 * code on fibers). The model calls the first four. */
static int accept_client(void);
static void serve_connection(int fd, struct redis *rd);
static void redis_free(struct redis *rd);
static void set_timeout(int fd, int option, int ms);

/* One client: read a request, answer it, repeat. */
static enum parse_result read_request(struct conn *c);
static bool answer_expect(struct conn *c);
static bool handle_request(struct conn *c);
static bool serve_static(struct conn *c, char *path, size_t size);
static bool serve_guestbook(struct conn *c);
static bool post_guestbook(struct conn *c);
static bool respond_status(struct conn *c, int status, const char *extra);
static bool send_response(struct conn *c, int status, int file, off_t offset,
                          off_t length);

/* Redis: a command, then its reply, waited for (by the thread, or in 10 by
 * the fiber while the others run). */
enum redis_outcome { REDIS_OK, REDIS_FAILED, REDIS_GONE };
static bool redis_command(struct redis *rd, int argc, const char *const argv[]);
static enum redis_outcome redis_try(struct redis *rd, int argc,
                                    const char *const argv[]);
static bool redis_connect(struct redis *rd);
static void redis_disconnect(struct redis *rd);

/* Socket I/O that waits, each wait bounded by a deadline or a timeout. */
static bool wait_readable(int fd, int64_t deadline);
static bool send_all(int fd, const char *data, size_t len, int flags);
static bool send_file(int fd, int file, off_t offset, off_t length);
static void close_lingering(int fd);
/* ---- end shared: blocking_decls ---- */

static pid_t spawn_worker(const sigset_t *mask, pid_t parent);
static void replace_workers(int n, const sigset_t *mask, pid_t parent);

static pid_t workers[MAX_WORKERS]; /* the pool, 0 for an empty slot */

/* The parent blocks SIGCHLD, SIGINT and SIGTERM and takes them one at a
 * time in sigwait(): no handler runs, nothing slips in between a check and
 * the wait (a stop before the mask set the flag). Workers get the old mask. */
static void serve_forever(void)
{
    int n = env_number("ZEROHTTPD_WORKERS", DEFAULT_WORKERS, 1, MAX_WORKERS);
    int sig = SIGCHLD;
    sigset_t wait_for, old;
    pid_t parent = getpid();
    sigemptyset(&wait_for);
    sigaddset(&wait_for, SIGCHLD);
    sigaddset(&wait_for, SIGINT);
    sigaddset(&wait_for, SIGTERM);
    if (sigprocmask(SIG_BLOCK, &wait_for, &old) < 0)
        die("sigprocmask");
    for (int i = 0; i < n; i++) {
        workers[i] = spawn_worker(&old, parent);
        if (workers[i] < 0)
            die("fork");
    }
    while (sig == SIGCHLD && !stop_requested)
        if (sigwait(&wait_for, &sig) == 0 && sig == SIGCHLD)
            replace_workers(n, &old, parent);
    for (int i = 0; i < n; i++)
        if (workers[i] > 0) {
            kill(workers[i], SIGTERM);
            kill(workers[i], SIGCONT); /* one an operator stopped must act */
        }
    while (wait(NULL) > 0) /* every worker, so that none outlives us */
        ;
}

/* A worker: accept, serve, repeat, with one Redis connection for life. */
static pid_t spawn_worker(const sigset_t *mask, pid_t parent)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    sigprocmask(SIG_SETMASK, mask, NULL);
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
        _exit(1);
    struct redis rd = {.fd = -1};
    while (!stop_requested) {
        int fd = accept_client();
        if (fd >= 0)
            serve_connection(fd, &rd);
    }
    redis_free(&rd);
    _exit(0);
}

/* Refills the slot of every worker that has exited. (LAB supervisor) */
static void replace_workers(int n, const sigset_t *mask, pid_t parent)
{
    /* Reap first, fork after: forking inside the waitpid() loop never ends
     * while each new worker dies before the next waitpid() (a bad setting,
     * a slow fork), and the supervisor never hears SIGTERM. A slot that a
     * failed fork() left empty is tried again at the next death. */
    for (pid_t pid = waitpid(-1, NULL, WNOHANG); pid > 0;
         pid = waitpid(-1, NULL, WNOHANG))
        for (int i = 0; i < n; i++)
            if (workers[i] == pid) {
                if (server.log)
                    fprintf(stderr, "worker %d exited; replacing it\n", pid);
                workers[i] = 0;
            }
    for (int i = 0; i < n; i++)
        if (workers[i] <= 0)
            workers[i] = spawn_worker(mask, parent);
}

/* ===== Serving one connection, blocking: the same in 01-05 ===== */

/* ---- shared: blocking_accept ---- */
/* accept() that survives everything a client or the kernel can throw at it.
 * Out of descriptors: pause and retry later, never exit. */
static int accept_client(void)
{
    int fd = accept4(server.listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        struct timespec pause = {0, EMFILE_PAUSE_MS * 1000000L};
        nanosleep(&pause, NULL);
    }
    return fd;
}
/* ---- end shared: blocking_accept ---- */

/* ---- shared: blocking_conn ---- */
/* The whole life of one client: requests in order until either side is
 * done. Blocks only on this client (and Redis), never on another. */
static void serve_connection(int fd, struct redis *rd)
{
    struct conn c = {.fd = fd, .redis = rd, .buf = malloc(CONN_BUF_SIZE)};
    set_timeout(fd, SO_SNDTIMEO, SEND_TIMEOUT_MS);
    bool keep = c.buf != NULL;
    while (keep) {
        http_request_init(&c.req);
        enum parse_result pr = read_request(&c);
        if (pr == PARSE_ERROR) {
            respond_status(&c, c.req.status, NULL);
            close_lingering(fd);
            fd = -1;
        }
        if (pr != PARSE_DONE)
            break;
        keep = handle_request(&c);
        size_t used = request_size(&c.req); /* pipelined bytes move up */
        memmove(c.buf, c.buf + used, c.len - used);
        c.len -= used;
        if (!keep && c.len > 0) { /* pipelined requests left unanswered: */
            close_lingering(fd);  /* a plain close() would reset the reply */
            fd = -1;
        }
    }
    if (fd >= 0)
        close(fd);
    free(c.buf);
    sb_free(&c.out);
    sb_free(&c.work);
}

/* Reads until c->buf holds one whole request (head and body), or the client
 * is done, idle too long, or too slow. Returns PARSE_DONE, PARSE_ERROR (answer
 * r->status, then close) or PARSE_CLOSED (just close). (LAB slowloris) */
static enum parse_result read_request(struct conn *c)
{
    int64_t deadline =
        now_ms() + (c->len ? REQUEST_TIMEOUT_MS : IDLE_TIMEOUT_MS);
    for (;;) {
        enum parse_result pr = http_parse(&c->req, c->buf, c->len);
        if (pr == PARSE_ERROR ||
            (pr == PARSE_DONE && c->len >= request_size(&c->req)))
            return pr;
        if (pr == PARSE_DONE && !answer_expect(c))
            return c->req.status ? PARSE_ERROR : PARSE_CLOSED;
        if (!wait_readable(c->fd, deadline))
            return PARSE_CLOSED;
        ssize_t n = recv(c->fd, c->buf + c->len, CONN_BUF_SIZE - c->len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return PARSE_CLOSED;
        if (c->len == 0) /* the first byte starts the request's clock */
            deadline = now_ms() + REQUEST_TIMEOUT_MS;
        c->len += (size_t)n;
    }
}

/* The head is in, the body is not: answer an Expect: 100-continue (see
 * expect_answer). False when the body will not be read: the request fails
 * at once (c->req.status), or the 100 could not be sent. */
static bool answer_expect(struct conn *c)
{
    int status = expect_answer(&c->req, c->buf);
    if (status == 100)
        return send_all(c->fd, CONTINUE_LINE, sizeof CONTINUE_LINE - 1, 0);
    return status < 400;
}

/* Answers one complete request. False when the connection must close. */
static bool handle_request(struct conn *c)
{
    char path[MAX_URI + sizeof "index.html"];
    bool ok;
    switch (route_request(&c->req, c->buf, path, sizeof path)) {
    case ROUTE_STATIC: ok = serve_static(c, path, sizeof path); break;
    case ROUTE_PAGE: ok = serve_guestbook(c); break;
    case ROUTE_POST: ok = post_guestbook(c); break;
    default: ok = respond_status(c, c->req.status, NULL); break;
    }
    return ok && c->req.keep_alive;
}

static bool serve_static(struct conn *c, char *path, size_t size)
{
    struct stat st;
    int status, file = open_public(path, size, &st, &status);
    if (file < 0 && status != 301)
        return respond_status(c, status, NULL);
    if (file < 0) {
        char location[MAX_URI + 64];
        slash_location(&c->req, c->buf, location, sizeof location);
        return respond_status(c, status, location);
    }
    off_t offset, length;
    c->out.len = 0;
    status = static_response(&c->out, &c->req, c->buf, mime_type(path), &st,
                             &offset, &length);
    bool ok = status > 0 && send_response(c, status, file, offset, length);
    close(file);
    return ok;
}

/* GET: three Redis round trips, each awaited, then the page. */
static bool serve_guestbook(struct conn *c)
{
    static const char *const lrange[] = {"LRANGE", "guestbook:remarks",
                                         ("-" GUESTBOOK_SHOWN), "-1"};
    static const char *const incr[] = {"INCR", "guestbook:visitors"};
    static const char *const get[] = {"GET", "guestbook:visitors"};
    struct redis *rd = c->redis;
    long long visitors = 0;
    c->work.len = c->out.len = 0;
    if (!server.template)
        return respond_status(c, 500, NULL);
    if (!redis_command(rd, 4, lrange) || rd->reply.type != '*' ||
        !render_remarks(&c->work, rd->in.data, &rd->reply) ||
        !redis_command(rd, 2, incr) || rd->reply.type != ':' ||
        !redis_command(rd, 2, get) || rd->reply.type != '$' ||
        rd->reply.nitems != 1 ||
        !parse_integer(rd->in.data + rd->reply.item[0].off,
                       rd->in.data + rd->reply.item[0].off +
                           rd->reply.item[0].len,
                       &visitors))
        return respond_status(c, 503, NULL);
    struct strbuf page = {0};
    bool ok = render_page(&page, &c->work, visitors) &&
              format_head(&c->out, &c->req, 200, "text/html; charset=utf-8",
                          page.len, PAGE_HEADERS) &&
              (c->req.method == METHOD_HEAD ||
               sb_append(&c->out, page.data, page.len));
    sb_free(&page);
    return ok ? send_response(c, 200, -1, 0, 0) : respond_status(c, 500, NULL);
}

/* POST: store the remark, then send the browser back to the page. */
static bool post_guestbook(struct conn *c)
{
    struct strbuf entry = {0};
    int status = guest_entry(c->buf + c->req.body,
                             (size_t)c->req.content_length, &entry);
    const char *rpush[] = {"RPUSH", "guestbook:remarks", entry.data};
    if (status == 0 &&
        (!redis_command(c->redis, 3, rpush) || c->redis->reply.type != ':'))
        status = 503;
    sb_free(&entry);
    return respond_status(c, status ? status : 303,
                          status ? NULL : POSTED_HEADERS);
}

/* An error page (a refused form: the guestbook page again) or a redirect. */
static bool respond_status(struct conn *c, int status, const char *extra)
{
    c->out.len = 0;
    return format_refusal(&c->out, &c->req, c->buf, status, extra) &&
           send_response(c, status, -1, 0, 0);
}

/* Sends c->out, then `length` bytes of the file from `offset` if there is
 * one (MSG_MORE lets the head and the file's first bytes share a packet).
 * Counted before it leaves: in 02-05 the summary may be printed while
 * another process or thread is still answering, and a response the client
 * has seen must be in it. */
static bool send_response(struct conn *c, int status, int file, off_t offset,
                          off_t length)
{
    bool body = file >= 0 && length > 0 && c->req.method != METHOD_HEAD;
    record_response(&c->req, c->buf, status,
                    c->out.len + (body ? (size_t)length : 0));
    bool ok = send_all(c->fd, c->out.data, c->out.len, body ? MSG_MORE : 0);
    if (ok && body)
        ok = send_file(c->fd, file, offset, length);
    return ok;
}
/* ---- end shared: blocking_conn ---- */

/* ---- shared: blocking_redis ---- */
/* A command and its reply. A kept connection may have died since its last
 * use (Redis restarted): that shows as a close before any reply, so Redis
 * never ran the command and one retry on a fresh connection is safe. */
static bool redis_command(struct redis *rd, int argc, const char *const argv[])
{
    bool reused = rd->fd >= 0;
    enum redis_outcome outcome = redis_try(rd, argc, argv);
    if (outcome == REDIS_GONE && reused)
        outcome = redis_try(rd, argc, argv);
    return outcome == REDIS_OK;
}

/* One round trip: send a command, wait for its whole reply in rd->reply.
 * REDIS_GONE: the peer had closed the connection before replying at all. On
 * any failure but a clean error reply the connection is dropped. */
static enum redis_outcome redis_try(struct redis *rd, int argc,
                                    const char *const argv[])
{
    int64_t deadline = now_ms() + REDIS_TIMEOUT_MS;
    rd->out.len = rd->in.len = 0;
    rd->reply = (struct resp_reply){0};
    if ((rd->fd < 0 && !redis_connect(rd)) ||
        !resp_format(&rd->out, argc, argv))
        return REDIS_FAILED;
    enum redis_outcome fail = REDIS_GONE;
    if (!send_all(rd->fd, rd->out.data, rd->out.len, 0))
        goto fail;
    for (;;) {
        enum parse_result pr = resp_parse(&rd->reply, rd->in.data, rd->in.len);
        if (pr == PARSE_DONE)
            return rd->reply.type == '-' ? REDIS_FAILED : REDIS_OK;
        fail = REDIS_FAILED;
        if (pr == PARSE_ERROR || !sb_reserve(&rd->in, REDIS_READ_SIZE) ||
            !wait_readable(rd->fd, deadline))
            goto fail;
        ssize_t n =
            recv(rd->fd, rd->in.data + rd->in.len, rd->in.cap - rd->in.len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (rd->in.len == 0 && (n == 0 || errno == ECONNRESET))
                fail = REDIS_GONE;
            goto fail;
        }
        rd->in.len += (size_t)n;
    }
fail:
    redis_disconnect(rd);
    return fail;
}

/* Connects with a bounded wait (non-blocking connect, then poll), so a
 * Redis that is down costs a request about REDIS_TIMEOUT_MS at most. */
static bool redis_connect(struct redis *rd)
{
    rd->fd = socket(server.redis_addr.ss_family,
                    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (rd->fd < 0)
        return false;
    int err = 0, one = 1;
    socklen_t errlen = sizeof err;
    if (connect(rd->fd, (struct sockaddr *)&server.redis_addr,
                server.redis_addr_len) < 0) {
        struct pollfd p = {.fd = rd->fd, .events = POLLOUT};
        if (errno != EINPROGRESS || poll(&p, 1, REDIS_TIMEOUT_MS) != 1 ||
            getsockopt(rd->fd, SOL_SOCKET, SO_ERROR, &err, &errlen) < 0 ||
            err != 0) {
            redis_disconnect(rd);
            return false;
        }
    }
    setsockopt(rd->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_timeout(rd->fd, SO_SNDTIMEO, REDIS_TIMEOUT_MS);
    if (fcntl(rd->fd, F_SETFL, 0) < 0) { /* blocking from here on */
        redis_disconnect(rd);
        return false;
    }
    return true;
}

static void redis_disconnect(struct redis *rd)
{
    if (rd->fd >= 0)
        close(rd->fd);
    rd->fd = -1;
}

static void redis_free(struct redis *rd)
{
    redis_disconnect(rd);
    sb_free(&rd->out);
    sb_free(&rd->in);
}
/* ---- end shared: blocking_redis ---- */

/* ---- shared: blocking_io ---- */
/* Waits until fd is readable or the deadline passes: poll() on one fd is
 * just a wait with a timeout here, not an event loop (that is 06_poll). A
 * stop request (EINTR with the flag set) counts as a timeout. */
static bool wait_readable(int fd, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0 || stop_requested)
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return true;
        if (n < 0 && errno != EINTR)
            return false;
    }
}

/* send() until done. SO_SNDTIMEO bounds each wait for a stalled reader. */
static bool send_all(int fd, const char *data, size_t len, int flags)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, flags | MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR && !stop_requested)
            continue;
        if (n <= 0)
            return false;
        data += n;
        len -= (size_t)n;
    }
    return true;
}

/* `length` bytes of the file from `offset`: sendfile() takes the offset
 * and advances it, so a range costs nothing more than a whole file. */
static bool send_file(int fd, int file, off_t offset, off_t length)
{
    off_t end = offset + length;
    while (offset < end) {
        ssize_t n = sendfile(fd, file, &offset, (size_t)(end - offset));
        if (n < 0 && errno == EINTR && !stop_requested)
            continue;
        if (n <= 0)
            return false; /* file shrank, or the peer went away */
    }
    return true;
}

static void set_timeout(int fd, int option, int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = ms % 1000 * 1000};
    setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv); /* best effort */
}

/* ---- end shared: blocking_io ---- */

/* ---- shared: lingering ---- */
/* Closes after an error without losing the response: a close() with unread
 * input makes the kernel send RST, which can destroy the reply in flight. So
 * half-close, then read and drop what the client still sends, briefly. */
static void close_lingering(int fd)
{
    char sink[DRAIN_CHUNK];
    size_t drained = 0;
    int64_t deadline = now_ms() + LINGER_MS;
    shutdown(fd, SHUT_WR);
    while (drained < LINGER_MAX_BYTES && wait_readable(fd, deadline)) {
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        if (n <= 0)
            break;
        drained += (size_t)n;
    }
    close(fd);
}
/* ---- end shared: lingering ---- */

/* ===== main ===== */

int main(int argc, char **argv)
{
    server_init(argc, argv);
    set_timeout(server.listen_fd, SO_RCVTIMEO, ACCEPT_WAKE_MS);
    serve_forever();
    print_summary();
    return 0;
}

/* ===== The app: identical in every server (make check-sync) ===== */

/* ----- The app: small utilities ----- */

/* ---- shared: util ---- */
/* Start-up failures only: per-connection trouble never ends the server. */
static void die(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", SERVER_NAME, what, strerror(errno));
    exit(1);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool sb_reserve(struct strbuf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return true;
    if (b->len + extra > STRBUF_MAX)
        return false;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data)
        return false;
    b->data = data;
    b->cap = cap;
    return true;
}

static bool sb_append(struct strbuf *b, const void *data, size_t n)
{
    if (n == 0) /* data may be NULL: an empty strbuf never allocated */
        return true;
    if (!sb_reserve(b, n))
        return false;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    return true;
}

static bool sb_puts(struct strbuf *b, const char *s)
{
    return sb_append(b, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static bool
sb_printf(struct strbuf *b, const char *fmt, ...)
{
    va_list ap;
    size_t room = b->cap - b->len;
    va_start(ap, fmt); /* into the room there is; again only if too small */
    int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        return false;
    if ((size_t)n >= room) {
        if (!sb_reserve(b, (size_t)n + 1))
            return false;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
    return true;
}

static void sb_free(struct strbuf *b)
{
    free(b->data);
    *b = (struct strbuf){0};
}

/* Does the counted string a equal b: exactly, or ignoring case. */
static bool eq(const char *a, size_t alen, const char *b)
{
    return alen == strlen(b) && memcmp(a, b, alen) == 0;
}

static bool ieq(const char *a, size_t alen, const char *b)
{
    return alen == strlen(b) && strncasecmp(a, b, alen) == 0;
}
/* ---- end shared: util ---- */

/* ----- The app: HTTP, parsing requests ----- */

/* ---- shared: http_parser ---- */
/* RFC 9110 token characters: what a method or header name may contain. */
static bool is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static enum parse_result parse_fail(struct http_request *r, int status)
{
    r->status = status;
    r->keep_alive = false;
    return PARSE_ERROR;
}

static int parse_method(struct http_request *r, const char *m, size_t len)
{
    if (len == 0)
        return 400;
    r->method = eq(m, len, "GET")    ? METHOD_GET
                : eq(m, len, "HEAD") ? METHOD_HEAD
                : eq(m, len, "POST")
                    ? METHOD_POST
                    : METHOD_OTHER; /* methods are case-sensitive */
    return 0;
}

/* "HTTP/1.0" and "HTTP/1.1" are served, and a later HTTP/1.x as 1.1 (RFC
 * 9110 §6.2: a minor version promises to be understood by 1.1); any other
 * major version gets 505. */
static int parse_version(struct http_request *r, const char *v, size_t len)
{
    if (len != 8 || memcmp(v, "HTTP/", 5) != 0 || v[6] != '.' || v[5] < '0' ||
        v[5] > '9' || v[7] < '0' || v[7] > '9')
        return 400;
    if (v[5] != '1')
        return 505;
    r->minor = v[7] == '0' ? 0 : 1;
    return 0;
}

/* Content-Length: digits only, once; anything else is a smuggling risk. */
static int parse_length(struct http_request *r, const char *v, size_t len)
{
    if (r->content_length >= 0 || len == 0 || len > 9)
        return 400;
    long long n = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return 400;
        n = n * 10 + (v[i] - '0');
    }
    r->content_length = n;
    return 0;
}

/* Connection: a comma-separated list; we care about two tokens. */
static void parse_connection(struct http_request *r, const char *v, size_t len)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < len && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
            i++;
        if (ieq(v + start, i - start, "close"))
            r->close = true;
        else if (ieq(v + start, i - start, "keep-alive"))
            r->keep_alive_asked = true;
    }
}

/* Expect and the headers that ask for part of a file, or only a newer one:
 * their values are kept where they are, and read when a file is served.
 * HTTP/1.0 knows no 100 Continue: its Expect is ignored (RFC 9110 §10.1.1). */
static int header_conditions(struct http_request *r, const char *buf,
                             const char *v, size_t len)
{
    const char *name = buf + r->name;
    struct span *keep = NULL, value = {(size_t)(v - buf), len};
    if (ieq(name, r->name_len, "Expect") && r->minor == 1) {
        if (!ieq(v, len, "100-continue"))
            return 417; /* an expectation we cannot meet */
        r->expect_continue = true;
    } else if (ieq(name, r->name_len, "If-None-Match"))
        keep = &r->if_none_match;
    else if (ieq(name, r->name_len, "If-Modified-Since"))
        keep = &r->if_modified_since;
    else if (ieq(name, r->name_len, "Range"))
        keep = &r->range;
    else if (ieq(name, r->name_len, "If-Range"))
        keep = &r->if_range;
    if (keep)
        *keep = value;
    return 0;
}

/* One complete header line: trim the value and note what we need. */
static int header_done(struct http_request *r, const char *buf)
{
    const char *name = buf + r->name, *v = buf + r->tok;
    size_t len = r->value_end - r->tok;
    while (len && (*v == ' ' || *v == '\t')) {
        v++;
        len--;
    }
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    if (ieq(name, r->name_len, "Content-Length"))
        return parse_length(r, v, len);
    if (ieq(name, r->name_len, "Transfer-Encoding"))
        return 501; /* no chunked bodies: refuse rather than misframe */
    if (ieq(name, r->name_len, "Connection"))
        parse_connection(r, v, len);
    if (ieq(name, r->name_len, "Host")) {
        if (r->has_host)
            return 400;
        r->has_host = true;
    }
    if (ieq(name, r->name_len, "Content-Type")) {
        static const char form[] = "application/x-www-form-urlencoded";
        size_t n = sizeof form - 1;
        r->form_type = len >= n && strncasecmp(v, form, n) == 0 &&
                       (len == n || v[n] == ';' || v[n] == ' ');
    }
    return header_conditions(r, buf, v, len);
}

/* The head is complete: the checks that need all of it. */
static enum parse_result head_done(struct http_request *r)
{
    if (r->minor == 1 && !r->has_host)
        return parse_fail(r, 400);
    if (r->method == METHOD_POST && r->content_length < 0)
        return parse_fail(r, 411);
    if (r->content_length > MAX_BODY)
        return parse_fail(r, 413);
    r->keep_alive =
        KEEP_ALIVE && !r->close && (r->minor == 1 || r->keep_alive_asked);
    r->state = S_DONE;
    return PARSE_DONE;
}

/* Resumable request-head parser (the shape of nginx's and sehttpd's): it
 * consumes buf[r->pos..len), saves its state and position, and returns
 * PARSE_AGAIN to be called again with more bytes. PARSE_DONE leaves r->body
 * at the first body byte; PARSE_ERROR leaves the status in r->status. */
static enum parse_result http_parse(struct http_request *r, const char *buf,
                                    size_t len)
{
    if (r->state == S_DONE)
        return PARSE_DONE; /* called again while the body arrives */
    for (; r->pos < len; r->pos++) {
        unsigned char c = (unsigned char)buf[r->pos];
        size_t n = r->pos - r->tok; /* length of the token so far */
        int status = 0;
        if (r->pos >= MAX_HEAD)
            return parse_fail(r, r->state == S_URI ? 414 : 431);
        switch (r->state) {
        case S_METHOD:
            if ((c == '\r' || c == '\n') && n == 0)
                r->tok = r->pos + 1; /* stray blank line before a request */
            else if (c == ' ') {
                status = parse_method(r, buf + r->tok, n);
                r->state = S_URI;
                r->tok = r->pos + 1;
            } else if (!is_tchar(c) || n >= MAX_METHOD)
                status = 400;
            break;
        case S_URI:
            if (c == ' ' && n > 0) {
                r->uri = r->tok;
                r->uri_len = n;
                r->state = S_VERSION;
                r->tok = r->pos + 1;
            } else if (c <= ' ' || c == 0x7f)
                status = 400;
            else if (n >= MAX_URI)
                status = 414;
            break;
        case S_VERSION:
            if (c == '\r' || c == '\n') {
                status = parse_version(r, buf + r->tok, n);
                r->state = c == '\r' ? S_REQUEST_LF : S_HEADER;
            } else if (n >= 8)
                status = 400;
            break;
        case S_REQUEST_LF:
        case S_HEADER_LF:
            if (c != '\n')
                status = 400;
            else if (r->state == S_HEADER_LF)
                status = header_done(r, buf);
            r->state = S_HEADER;
            break;
        case S_HEADER:
            r->tok = r->pos;
            if (c == '\r')
                r->state = S_BLANK_LF;
            else if (c == '\n') {
                r->body = ++r->pos;
                return head_done(r);
            } else if (is_tchar(c))
                r->state = S_NAME;
            else
                status = 400; /* includes obsolete line folding */
            break;
        case S_NAME:
            if (c == ':' && n > 0) {
                r->name = r->tok;
                r->name_len = n;
                r->tok = r->pos + 1;
                r->state = S_VALUE;
            } else if (!is_tchar(c))
                status = 400;
            break;
        case S_VALUE:
            if (c == '\r' || c == '\n') {
                r->value_end = r->pos;
                if (c == '\n')
                    status = header_done(r, buf);
                r->state = c == '\r' ? S_HEADER_LF : S_HEADER;
            } else if ((c < ' ' && c != '\t') || c == 0x7f)
                status = 400;
            break;
        case S_BLANK_LF:
            if (c != '\n')
                return parse_fail(r, 400);
            r->body = ++r->pos;
            return head_done(r);
        case S_DONE: break; /* returned above, before the loop */
        }
        if (status)
            return parse_fail(r, status);
    }
    return PARSE_AGAIN;
}

static void http_request_init(struct http_request *r)
{
    *r = (struct http_request){.content_length = -1, .minor = 1};
}

/* Bytes the whole request (head and body) occupies in the buffer. */
static size_t request_size(const struct http_request *r)
{
    return r->body + (size_t)(r->content_length > 0 ? r->content_length : 0);
}
/* ---- end shared: http_parser ---- */

/* ----- The app: HTTP, building responses ----- */

/* ---- shared: http_response ---- */
static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Internal Server Error";
    }
}

/* A time as an IMF-fixdate, the one date format HTTP sends (RFC 9110 §5.6.7);
 * the C locale's day and month names are the English ones it needs. */
static void http_date(time_t t, char *out, size_t size)
{
    struct tm tm;
    if (!gmtime_r(&t, &tm) ||
        strftime(out, size, "%a, %d %b %Y %H:%M:%S GMT", &tm) == 0)
        out[0] = '\0';
}

/* A date formatted once and kept while the same second is asked for
 * again: strftime() costs more than the rest of a small head. */
struct date_text {
    time_t t; /* what `text` says; -1: nothing yet */
    char text[HTTP_DATE_SIZE];
};

static const char *date_cached(struct date_text *d, time_t t)
{
    if (t != d->t) {
        http_date(t, d->text, sizeof d->text);
        d->t = t;
    }
    return d->text;
}

/* Now, for the Date header: formatted once a second (per thread, so that
 * 04's and 05's threads share nothing), not once per response. */
static const char *date_now(void)
{
    static __thread struct date_text now = {.t = -1};
    return date_cached(&now, time(NULL));
}

/* Status line and headers. `Connection` where it differs from the version's
 * default (HTTP/1.1 keeps, HTTP/1.0 closes) or refuses what the client asked.
 * type NULL: a 304, which has no body and so no Content-Length or -Type.
 */
static bool format_head(struct strbuf *out, const struct http_request *r,
                        int status, const char *type, size_t length,
                        const char *extra)
{
    const char *conn = "";
    if (!r->keep_alive && (r->minor == 1 || r->keep_alive_asked))
        conn = "Connection: close\r\n";
    else if (r->minor == 0 && r->keep_alive)
        conn = "Connection: keep-alive\r\n";
    if (!extra)
        extra = "";
    if (!sb_reserve(out, HEAD_ROOM)) /* so sb_printf formats only once */
        return false;
    if (!type)
        return sb_printf(out,
                         "HTTP/1.1 %d %s\r\nDate: %s\r\nServer: zerohttpd/%s"
                         "\r\n%s%s\r\n",
                         status, reason_phrase(status), date_now(), SERVER_NAME,
                         conn, extra);
    return sb_printf(out,
                     "HTTP/1.1 %d %s\r\nDate: %s\r\nServer: zerohttpd/%s\r\n"
                     "Content-Length: %zu\r\nContent-Type: %s\r\n%s%s\r\n",
                     status, reason_phrase(status), date_now(), SERVER_NAME,
                     length, type, conn, extra);
}

/* A complete small response with an HTML body: errors and redirects. */
static bool format_error(struct strbuf *out, const struct http_request *r,
                         int status, const char *extra)
{
    char body[512];
    int n = snprintf(
        body, sizeof body,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, "
        "initial-scale=1\"><title>%d %s</title>"
        "<link rel=\"stylesheet\" href=\"/style.css\"></head><body>"
        "<main class=\"error\"><h1>%d %s</h1>"
        "<p><a href=\"/\">Back to the home page</a></p></main></body></html>\n",
        status, reason_phrase(status), status, reason_phrase(status));
    if (n < 0 || (size_t)n >= sizeof body)
        return false;
    if (status == 405 && !extra)
        extra = "Allow: GET, HEAD\r\n";
    return format_head(out, r, status, "text/html; charset=utf-8", (size_t)n,
                       extra) &&
           (r->method == METHOD_HEAD || sb_append(out, body, (size_t)n));
}

/* The Location that sends a directory named without its slash to the same
 * target with one: the raw path (query dropped), plus "/". */
static void slash_location(const struct http_request *r, const char *buf,
                           char *out, size_t size)
{
    const char *uri = buf + r->uri;
    const char *query = memchr(uri, '?', r->uri_len);
    int len = (int)(query ? (size_t)(query - uri) : r->uri_len);
    int n = snprintf(out, size, "Location: %.*s/\r\n", len, uri);
    if (n < 0 || (size_t)n >= size)
        out[0] = '\0';
}

/* Every answered request passes here once: counters, then the access log. */
static void record_response(const struct http_request *r, const char *buf,
                            int status, size_t bytes)
{
    __atomic_fetch_add(&server.stats->served, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&server.stats->by_class[status / 100 % STATUS_CLASSES],
                       1, __ATOMIC_RELAXED);
    if (server.log)
        fprintf(stderr, "%s %.*s %d %zu\n",
                r->method == METHOD_GET    ? "GET"
                : r->method == METHOD_HEAD ? "HEAD"
                : r->method == METHOD_POST ? "POST"
                                           : "-",
                (int)r->uri_len, buf + r->uri, status, bytes);
}
/* ---- end shared: http_response ---- */

/* ----- The app: static files ----- */

/* ---- shared: static_files ---- */
static const char *mime_type(const char *path)
{
    static const char *const table[][2] = {
        {"html", "text/html; charset=utf-8"},
        {"htm", "text/html; charset=utf-8"},
        {"css", "text/css; charset=utf-8"},
        {"js", "text/javascript; charset=utf-8"},
        {"json", "application/json"},
        {"txt", "text/plain; charset=utf-8"},
        {"png", "image/png"},
        {"jpg", "image/jpeg"},
        {"jpeg", "image/jpeg"},
        {"gif", "image/gif"},
        {"svg", "image/svg+xml"},
        {"ico", "image/x-icon"},
        {"webp", "image/webp"},
        {"woff2", "font/woff2"},
        {"pdf", "application/pdf"},
    };
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (dot && (!slash || dot > slash))
        for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
            if (strcasecmp(dot + 1, table[i][0]) == 0)
                return table[i][1];
    return "application/octet-stream";
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes in[0..len) into out (NUL-terminated). Returns the decoded
 * length, -1 for a bad escape or a NUL byte, -2 if it does not fit in size. */
static long url_decode(const char *in, size_t len, char *out, size_t size,
                       bool plus_is_space)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        if (c == '%') {
            int hi = i + 2 < len ? hex_value(in[i + 1]) : -1;
            int lo = hi >= 0 ? hex_value(in[i + 2]) : -1;
            if (lo < 0)
                return -1;
            c = (char)(hi * 16 + lo);
            i += 2;
        } else if (c == '+' && plus_is_space)
            c = ' ';
        if (c == '\0')
            return -1;
        if (n + 1 >= size)
            return -2;
        out[n++] = c;
    }
    out[n] = '\0';
    return (long)n;
}

/* The absolute form of a target, "http://host[:port]/path" (what a client
 * sends to a proxy; a server must accept it, RFC 9112 §3.2.2), reduced to
 * its path: we are the only host here. No path at all means "/". Any other
 * target is returned as it is. */
static const char *origin_form(const char *uri, size_t *len)
{
    static const char scheme[] = "http://";
    size_t n = sizeof scheme - 1;
    if (*len < n || strncasecmp(uri, scheme, n) != 0)
        return uri;
    const char *end = uri + *len, *path = memchr(uri + n, '/', *len - n);
    if (!path || memchr(uri + n, '?', (size_t)(path - uri) - n)) {
        *len = 1;
        return "/";
    }
    *len = (size_t)(end - path);
    return path;
}

/* Decodes the request target's path once and refuses what could escape
 * public/ lexically: `..` segments, backslashes, control bytes. Symlinks are
 * openat2's job. Returns 0 or an HTTP status. */
static int decode_path(const char *uri, size_t len, char *path, size_t size)
{
    uri = origin_form(uri, &len);
    const char *query = memchr(uri, '?', len);
    if (query)
        len = (size_t)(query - uri);
    if (len == 0 || uri[0] != '/')
        return 400;
    long n = url_decode(uri, len, path, size, false);
    if (n < 0)
        return n == -2 ? 414 : 400;
    for (long i = 0; i < n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c < ' ' || c == 0x7f || c == '\\')
            return 400;
        if (c == '/' && path[i + 1] == '.' && path[i + 2] == '.' &&
            (path[i + 3] == '/' || path[i + 3] == '\0'))
            return 400;
    }
    return 0;
}

/* Opens a file beneath public/ for reading: the kernel refuses any path,
 * symlink included, that would leave the directory. Returns the fd, or -1
 * with *status set (301 for a directory named without its slash). */
static int open_public(char *path, size_t size, struct stat *st, int *status)
{
    size_t len = strlen(path);
    if (path[len - 1] == '/') {
        if (len + sizeof "index.html" > size) {
            *status = 414;
            return -1;
        }
        memcpy(path + len, "index.html", sizeof "index.html");
    }
    /* O_NONBLOCK: a FIFO dropped into public/ must not hang the open. */
    struct open_how how = {.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    int fd =
        (int)syscall(SYS_openat2, server.public_fd, path + 1, &how, sizeof how);
    if (fd < 0) {
        *status = errno == EACCES                      ? 403
                  : errno == EMFILE || errno == ENFILE ? 503
                                                       : 404;
        return -1;
    }
    bool known = fstat(fd, st) == 0;
    if (known && S_ISREG(st->st_mode))
        return fd;
    *status = known && S_ISDIR(st->st_mode) ? 301 : 404;
    close(fd);
    return -1;
}
/* Validators (RFC 9110 §8.8). The ETag is strong: inode, size and mtime in
 * nanoseconds, so a file replaced, rewritten or touched gets a new one at
 * once; Last-Modified is the mtime, for clients that only keep dates. */
static void file_etag(const struct stat *st, char out[ETAG_SIZE])
{
    unsigned long long part[3] = {
        (unsigned long long)st->st_ino, (unsigned long long)st->st_size,
        (unsigned long long)st->st_mtim.tv_sec * 1000000000ull +
            (unsigned long long)st->st_mtim.tv_nsec};
    char *p = out;
    *p++ = '"';
    for (int i = 0; i < 3; i++) { /* by hand: snprintf costs more here */
        char digits[16];
        int n = 0;
        do {
            digits[n++] = "0123456789abcdef"[part[i] & 15];
            part[i] >>= 4;
        } while (part[i]);
        while (n > 0)
            *p++ = digits[--n];
        *p++ = i < 2 ? '-' : '"';
    }
    *p = '\0'; /* at most 1 + 3 * 17 + 1 bytes: ETAG_SIZE is room enough */
}

/* An HTTP date in any of the three forms a recipient must accept (RFC 9110
 * §5.6.7): IMF-fixdate, RFC 850 and asctime. False when it is none. */
static bool parse_http_date(const char *s, size_t len, time_t *out)
{
    static const char *const forms[] = {"%a, %d %b %Y %H:%M:%S GMT",
                                        "%A, %d-%b-%y %H:%M:%S GMT",
                                        "%a %b %e %H:%M:%S %Y"};
    char text[HTTP_DATE_SIZE];
    if (len == 0 || len >= sizeof text)
        return false;
    memcpy(text, s, len);
    text[len] = '\0';
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        struct tm tm = {0};
        const char *end = strptime(text, forms[i], &tm);
        if (end && *end == '\0') {
            *out = timegm(&tm);
            return *out != (time_t)-1;
        }
    }
    return false;
}

/* If-None-Match: does the comma-separated list name our ETag, or is it
 * "*"? The weak comparison (§8.8.3.2): a W/ prefix is ignored. */
static bool etag_listed(const char *v, size_t len, const char *etag)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < len && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
            i++;
        const char *tag = v + start;
        size_t n = i - start;
        if (n >= 2 && memcmp(tag, "W/", 2) == 0) {
            tag += 2;
            n -= 2;
        }
        if (eq(tag, n, "*") || eq(tag, n, etag))
            return true;
    }
    return false;
}

/* Is the client's copy current (RFC 9110 §13.2.2, steps 3 and 4)?
 * If-None-Match decides when present; otherwise a valid If-Modified-Since
 * not older than the file's mtime. */
static bool not_modified(const struct http_request *r, const char *buf,
                         const struct stat *st, const char *etag)
{
    time_t since;
    if (r->if_none_match.len)
        return etag_listed(buf + r->if_none_match.off, r->if_none_match.len,
                           etag);
    return r->if_modified_since.len &&
           parse_http_date(buf + r->if_modified_since.off,
                           r->if_modified_since.len, &since) &&
           st->st_mtime <= since;
}

/* If-Range (§13.1.5): the range only if the client holds this very file:
 * the same strong ETag (a weak one never matches), or exactly its
 * Last-Modified date. Otherwise the whole file. */
static bool range_allowed(const struct http_request *r, const char *buf,
                          const struct stat *st, const char *etag)
{
    const char *v = buf + r->if_range.off;
    size_t len = r->if_range.len;
    time_t date;
    if (len == 0)
        return true;
    if (v[0] == '"' || (len > 2 && memcmp(v, "W/", 2) == 0))
        return eq(v, len, etag);
    return parse_http_date(v, len, &date) && date == st->st_mtime;
}

/* Up to 18 decimal digits from s[*i], advancing *i. False when none. */
static bool range_number(const char *s, size_t len, size_t *i, off_t *out)
{
    size_t start = *i;
    long long n = 0;
    while (*i < len && *i - start < 18 && s[*i] >= '0' && s[*i] <= '9')
        n = n * 10 + (s[(*i)++] - '0');
    *out = (off_t)n;
    return *i > start;
}

/* One byte range of a file of `size` bytes (RFC 9110 §14.1.2): "bytes=a-b",
 * "bytes=a-" or "bytes=-n". Returns 206 with the range, 416 when no byte of
 * it exists, 200 to ignore it (malformed, or several ranges: the whole file
 * is a valid answer to those). */
static int byte_range(const char *v, size_t len, off_t size, off_t *offset,
                      off_t *length)
{
    size_t i = sizeof "bytes=" - 1;
    off_t first = 0, last = 0;
    if (len < i || strncasecmp(v, "bytes=", i) != 0)
        return 200;
    bool has_first = range_number(v, len, &i, &first);
    if (i == len || v[i++] != '-')
        return 200;
    bool has_last = range_number(v, len, &i, &last);
    if (i != len || (!has_first && !has_last) ||
        (has_first && has_last && last < first))
        return 200;
    if (!has_first) { /* a suffix: the last `last` bytes */
        if (last == 0)
            return 416;
        first = last < size ? size - last : 0;
        last = size - 1;
    } else if (!has_last || last >= size)
        last = size - 1;
    if (first >= size)
        return 416;
    *offset = first;
    *length = last - first + 1;
    return 206;
}

/* The header lines every file answer carries: validators, and no-cache
 * (a cache may keep the file but asks each time: a 304 is cheap, and a
 * student editing public/ sees the change at the next reload). */
static bool file_headers(char *out, size_t size, const struct stat *st,
                         const char *etag, int status, off_t offset,
                         off_t length)
{
    static __thread struct date_text last = {.t = -1}; /* a hot file's */
    const char *modified = date_cached(&last, st->st_mtime);
    int n = snprintf(out, size,
                     "ETag: %s\r\nLast-Modified: %s\r\nAccept-Ranges: bytes\r\n"
                     "Cache-Control: no-cache\r\n",
                     etag, modified);
    if (n < 0 || (size_t)n >= size)
        return false;
    int m = 0;
    if (status == 206)
        m = snprintf(out + n, size - (size_t)n,
                     "Content-Range: bytes %lld-%lld/%lld\r\n",
                     (long long)offset, (long long)(offset + length - 1),
                     (long long)st->st_size);
    else if (status == 416)
        m = snprintf(out + n, size - (size_t)n,
                     "Content-Range: bytes */%lld\r\n", (long long)st->st_size);
    return m >= 0 && (size_t)m < size - (size_t)n;
}

/* The answer to a GET or HEAD of an open file, from its validators and the
 * request's conditions: 304 (the client's copy is current), else 206 or
 * 416 for a Range on a GET that If-Range allows, else 200. For 200 and 206
 * `out` gets the head, and *offset and *length the bytes the model sends
 * after it; 304 and 416 are whole in `out` (*length 0). -1: no memory. */
static int static_response(struct strbuf *out, const struct http_request *r,
                           const char *buf, const char *type,
                           const struct stat *st, off_t *offset, off_t *length)
{
    char etag[ETAG_SIZE], extra[320];
    int status = 200;
    file_etag(st, etag);
    *offset = 0;
    *length = st->st_size;
    if (not_modified(r, buf, st, etag))
        status = 304;
    else if (r->range.len && r->method == METHOD_GET &&
             range_allowed(r, buf, st, etag))
        status = byte_range(buf + r->range.off, r->range.len, st->st_size,
                            offset, length);
    if (status == 304 || status == 416)
        *length = 0;
    if (!file_headers(extra, sizeof extra, st, etag, status, *offset, *length))
        return -1;
    if (status == 416)
        return format_error(out, r, status, extra) ? status : -1;
    return format_head(out, r, status, status == 304 ? NULL : type,
                       (size_t)*length, extra)
               ? status
               : -1;
}
/* ---- end shared: static_files ---- */

/* ----- The app: the Redis RESP client ----- */

/* ---- shared: resp ---- */
/* A command as a RESP array of bulk strings, each sent with its length. */
static bool resp_format(struct strbuf *out, int argc, const char *const argv[])
{
    if (!sb_printf(out, "*%d\r\n", argc))
        return false;
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(argv[i]);
        if (!sb_printf(out, "$%zu\r\n", n) || !sb_append(out, argv[i], n) ||
            !sb_append(out, "\r\n", 2))
            return false;
    }
    return true;
}

static bool parse_integer(const char *s, const char *end, long long *out)
{
    bool neg = s < end && *s == '-';
    s += neg;
    if (s == end || end - s > 19)
        return false;
    long long n = 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9' || n > (LLONG_MAX - (*s - '0')) / 10)
            return false; /* not a number, or past LLONG_MAX */
        n = n * 10 + (*s - '0');
    }
    *out = neg ? -n : n;
    return true;
}

/* Frames one RESP2 reply in buf[0..len), resumably: it advances r->pos over
 * whole elements only, so a reply arriving in pieces is never parsed twice
 * past its last complete element. Strings (simple, error, bulk) are recorded
 * in r->item in order; r->pos is the reply's size when PARSE_DONE. */
static enum parse_result resp_parse(struct resp_reply *r, const char *buf,
                                    size_t len)
{
    while (r->pos < len) {
        const char *line = buf + r->pos;
        const char *crlf = memmem(line, len - r->pos, "\r\n", 2);
        bool text = line[0] == '+' || line[0] == '-'; /* any length */
        if (!crlf)
            return len - r->pos > RESP_MAX_LINE && !text ? PARSE_ERROR
                                                         : PARSE_AGAIN;
        size_t head = (size_t)(crlf - line) + 2, size = head;
        long long n = 0;
        char type = line[0];
        if (strchr(":$*", type) && !parse_integer(line + 1, crlf, &n))
            return PARSE_ERROR;
        if (!type || !strchr("+-:$*", type) || (type != ':' && n > STRBUF_MAX))
            return PARSE_ERROR; /* a length no reply of ours can have */
        if (type == '$' && n >= 0) {
            size += (size_t)n + 2;
            if (len - r->pos < size)
                return PARSE_AGAIN; /* the bulk string is not all here yet */
            if (memcmp(line + head + n, "\r\n", 2) != 0)
                return PARSE_ERROR;
        }
        if (r->depth == 0) {
            r->type = type;
            r->integer = n;
        }
        if (type == '+' || type == '-' || (type == '$' && n >= 0)) {
            if (r->nitems == RESP_MAX_ITEMS)
                return PARSE_ERROR;
            r->item[r->nitems].off = r->pos + (type == '$' ? head : 1);
            r->item[r->nitems++].len = type == '$' ? (size_t)n : head - 3;
        }
        r->pos += size;
        if (type == '*' && n > 0) {
            if (r->depth == RESP_MAX_DEPTH)
                return PARSE_ERROR;
            r->left[r->depth++] = n;
            continue;
        }
        while (r->depth > 0 && --r->left[r->depth - 1] == 0)
            r->depth--; /* this element completed its array */
        if (r->depth == 0)
            return PARSE_DONE;
    }
    return PARSE_AGAIN;
}
/* ---- end shared: resp ---- */

/* ----- The app: the guestbook page ----- */

/* ---- shared: guestbook ---- */
static bool html_escape(struct strbuf *out, const char *s, size_t len)
{
    size_t plain = 0; /* start of the bytes copied as they are */
    for (size_t i = 0; i < len; i++) {
        const char *e = s[i] == '&'    ? "&amp;"
                        : s[i] == '<'  ? "&lt;"
                        : s[i] == '>'  ? "&gt;"
                        : s[i] == '"'  ? "&quot;"
                        : s[i] == '\'' ? "&#39;"
                                       : NULL;
        if (!e)
            continue;
        if (!sb_append(out, s + plain, i - plain) || !sb_puts(out, e))
            return false;
        plain = i + 1;
    }
    return sb_append(out, s + plain, len - plain);
}

/* Code points in s, counted as the form's maxlength counts them: a line
 * break, which the browser sends as CR LF, is one. -1 when s is not valid
 * UTF-8: a stray continuation byte, a sequence cut short or overlong, a
 * surrogate, or a value past U+10FFFF. */
static long utf8_chars(const char *s, size_t len)
{
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    long chars = 0;
    for (size_t i = 0; i < len; chars++) {
        unsigned char c = (unsigned char)s[i];
        size_t n = c < 0x80   ? 1
                   : c < 0xc2 ? 0
                   : c < 0xe0 ? 2
                   : c < 0xf0 ? 3
                   : c < 0xf5 ? 4
                              : 0;
        if (n == 0 || n > len - i)
            return -1;
        uint32_t cp = n == 1 ? c : c & (0x7fu >> n);
        for (size_t k = 1; k < n; k++) {
            if (((unsigned char)s[i + k] & 0xc0) != 0x80)
                return -1;
            cp = cp << 6 | ((unsigned char)s[i + k] & 0x3f);
        }
        if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return -1;
        i += c == '\r' && i + 1 < len && s[i + 1] == '\n' ? 2 : n;
    }
    return chars;
}

/* Finds `name` in an x-www-form-urlencoded body: its value, still encoded,
 * in *value and *vlen (empty when the field is missing). */
static void form_value(const char *body, size_t len, const char *name,
                       const char **value, size_t *vlen)
{
    size_t name_len = strlen(name);
    *value = body;
    *vlen = 0;
    for (size_t i = 0; i < len;) {
        const char *pair = body + i, *amp = memchr(pair, '&', len - i);
        size_t pair_len = amp ? (size_t)(amp - pair) : len - i;
        if (pair_len > name_len && pair[name_len] == '=' &&
            memcmp(pair, name, name_len) == 0) {
            *value = pair + name_len + 1;
            *vlen = pair_len - name_len - 1;
            return;
        }
        i += pair_len + 1;
    }
}

/* Why a form is refused; form_message() says it to the visitor. */
enum form_fault {
    FORM_OK,
    FORM_NO_MEMORY,
    FORM_ENCODING, /* a bad %-escape, a %00, or not UTF-8 */
    FORM_EMPTY,
    FORM_LONG_NAME,
    FORM_LONG_REMARK
};

/* Field `name` of the body, decoded into out (NUL-terminated). Decoding
 * never lengthens, so the encoded length bounds the room it needs. */
static enum form_fault form_field(const char *body, size_t len,
                                  const char *name, struct strbuf *out)
{
    const char *value;
    size_t vlen;
    form_value(body, len, name, &value, &vlen);
    out->len = 0;
    if (!sb_reserve(out, vlen + 1))
        return FORM_NO_MEMORY;
    long n = url_decode(value, vlen, out->data, vlen + 1, true);
    if (n < 0)
        return FORM_ENCODING;
    out->len = (size_t)n;
    return FORM_OK;
}

/* The form rule: both fields decode to valid UTF-8 within their limits (in
 * code points, as the template's maxlength), and the remark is not empty.
 * Within its limit a field is at most 4 bytes a code point, decoded. */
static enum form_fault form_check(const char *body, size_t len,
                                  struct strbuf *name, struct strbuf *remark)
{
    enum form_fault f = form_field(body, len, "guest-name", name);
    if (f == FORM_OK)
        f = form_field(body, len, "guest-remarks", remark);
    if (f != FORM_OK)
        return f;
    long nchars = utf8_chars(name->data, name->len);
    long rchars = utf8_chars(remark->data, remark->len);
    return nchars < 0 || rchars < 0 ? FORM_ENCODING
           : rchars == 0            ? FORM_EMPTY
           : nchars > MAX_NAME      ? FORM_LONG_NAME
           : rchars > MAX_REMARK    ? FORM_LONG_REMARK
                                    : FORM_OK;
}

/* A POST body to the one Redis list element it becomes, "<name length>:"
 * then name then remark (NUL-terminated), so neither can be confused with
 * the other. Returns 0 or an HTTP status: 400 when the form rule refuses
 * it (format_refusal then says why). */
static int guest_entry(const char *body, size_t len, struct strbuf *entry)
{
    struct strbuf name = {0}, remark = {0};
    enum form_fault f = form_check(body, len, &name, &remark);
    entry->len = 0;
    bool ok = f == FORM_OK && sb_printf(entry, "%zu:", name.len) &&
              sb_append(entry, name.data, name.len) &&
              sb_append(entry, remark.data, remark.len + 1); /* its NUL */
    sb_free(&name);
    sb_free(&remark);
    if (f != FORM_OK && f != FORM_NO_MEMORY)
        return 400;
    if (!ok)
        return 500;
    entry->len--; /* the NUL stays, past the end */
    return 0;
}

/* One stored entry as a page paragraph, escaped. An element that is not in
 * our format is shown whole, as an anonymous remark. */
static bool render_entry(struct strbuf *out, const char *e, size_t len)
{
    long long nlen = 0;
    const char *colon = memchr(e, ':', len < 4 ? len : 4), *name = e;
    if (colon && parse_integer(e, colon, &nlen) && nlen >= 0 &&
        (size_t)nlen <= len - (size_t)(colon + 1 - e))
        name = colon + 1;
    else
        nlen = 0;
    const char *remark = name + nlen;
    size_t rlen = len - (size_t)(remark - e);
    return sb_puts(out, "<p class=\"guest-entry\">") &&
           html_escape(out, remark, rlen) &&
           sb_puts(out, " <span class=\"guest-name\">&mdash; ") &&
           (nlen > 0 ? html_escape(out, name, (size_t)nlen)
                     : sb_puts(out, "anonymous")) &&
           sb_puts(out, "</span></p>\n");
}

/* The LRANGE reply's entries, in order, as HTML. False unless the reply is
 * an array of bulk strings and nothing else: a nil, an integer or an error
 * among them (a bulk string's text follows its "$n\r\n" line; a simple or
 * error string's follows its type byte) is not a list of ours. */
static bool render_remarks(struct strbuf *out, const char *buf,
                           const struct resp_reply *r)
{
    if (r->type != '*' || r->integer < 0 || r->nitems != (size_t)r->integer)
        return false;
    for (size_t i = 0; i < r->nitems; i++)
        if (buf[r->item[i].off - 1] != '\n' ||
            !render_entry(out, buf + r->item[i].off, r->item[i].len))
            return false;
    return true;
}

/* 1234567 -> "1,234,567". */
static void format_count(long long n, char *out, size_t size)
{
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%lld", n < 0 ? 0 : n);
    size_t o = 0;
    for (int i = 0; i < len && o + 2 < size; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = '\0';
}

/* The template's placeholders, each filled by the text at its index. */
enum fill {
    FILL_REMARKS,
    FILL_COUNT,
    FILL_MESSAGE,
    FILL_NAME,
    FILL_REMARK,
    FILLS
};
static const char *const placeholders[FILLS] = {
    "$GUEST_REMARKS$", "$VISITOR_COUNT$", "$FORM_MESSAGE$", "$FORM_NAME$",
    "$FORM_REMARK$"};

/* The template, left to right, each placeholder replaced by its fill (NULL:
 * by nothing). A '$' that starts no placeholder stays as it is. */
static bool fill_template(struct strbuf *out,
                          const struct strbuf *const fill[FILLS])
{
    const char *t = server.template, *end = t + server.template_len;
    while (t < end) {
        const char *dollar = memchr(t, '$', (size_t)(end - t));
        if (!dollar)
            return sb_append(out, t, (size_t)(end - t));
        if (!sb_append(out, t, (size_t)(dollar - t)))
            return false;
        size_t left = (size_t)(end - dollar), k = 0, n = 0;
        for (; k < FILLS; k++) {
            n = strlen(placeholders[k]);
            if (left >= n && memcmp(dollar, placeholders[k], n) == 0)
                break;
        }
        bool ok = k == FILLS ? sb_append(out, "$", 1)
                  : fill[k]  ? sb_append(out, fill[k]->data, fill[k]->len)
                             : true;
        if (!ok)
            return false;
        t = dollar + (k == FILLS ? 1 : n);
    }
    return true;
}

/* The page: the remarks, the count, and an empty form. */
static bool render_page(struct strbuf *out, const struct strbuf *remarks,
                        long long visitors)
{
    char count[40];
    format_count(visitors, count, sizeof count);
    const struct strbuf shown = {count, strlen(count), sizeof count};
    const struct strbuf *const fill[FILLS] = {remarks, &shown};
    return fill_template(out, fill);
}

/* A field as the visitor sent it, escaped for the page: decoded, or as it
 * came if it does not decode, so that nothing typed is lost. */
static bool form_kept(struct strbuf *out, const char *body, size_t len,
                      const char *name)
{
    struct strbuf text = {0};
    const char *value;
    size_t vlen;
    form_value(body, len, name, &value, &vlen);
    enum form_fault f = form_field(body, len, name, &text);
    bool ok = f != FORM_NO_MEMORY &&
              (f == FORM_OK ? html_escape(out, text.data, text.len)
                            : html_escape(out, value, vlen));
    sb_free(&text);
    return ok;
}

/* What a refused form's page says: what was wrong, and that nothing was
 * saved. f: the form rule's verdict, for a 400. */
static bool form_message(struct strbuf *out, const struct http_request *r,
                         int status, enum form_fault f)
{
    char limit[16];
    format_count(status == 413         ? MAX_BODY
                 : f == FORM_LONG_NAME ? MAX_NAME
                                       : MAX_REMARK,
                 limit, sizeof limit);
    bool ok = sb_puts(out, "<p class=\"form-message\" role=\"alert\">");
    if (status == 503 && r->method != METHOD_POST)
        ok = ok && sb_puts(out, "The guestbook cannot reach its storage just "
                                "now: no remarks to show, and none can be "
                                "saved. Please try again in a moment.");
    else if (status == 503)
        ok = ok && sb_puts(out, "The guestbook cannot reach its storage just "
                                "now, so your remark was not saved. It is "
                                "still below: sign again in a moment.");
    else if (status == 413)
        ok = ok && sb_printf(out,
                             "The form sent was over %s bytes, more than this "
                             "page ever sends, so nothing was saved.",
                             limit);
    else if (f == FORM_LONG_NAME || f == FORM_LONG_REMARK)
        ok = ok && sb_printf(out,
                             "Your %s is longer than %s characters, so it "
                             "was not saved: shorten it, then sign again.",
                             f == FORM_LONG_NAME ? "name" : "remark", limit);
    else if (f == FORM_EMPTY)
        ok = ok && sb_puts(out, "Your remark is empty: write one, then sign.");
    else
        ok = ok && sb_puts(out, "Your form was not valid UTF-8 text, so it "
                                "was not saved.");
    return ok && sb_puts(out, "</p>\n");
}

/* The page for a refused form: its message, the fields as the visitor sent
 * them (body NULL: none came), and no remarks or count. Redis is not asked:
 * it may be why the form was refused. */
static bool format_form_page(struct strbuf *out, const struct http_request *r,
                             const char *body, size_t len, int status)
{
    static char uncounted[] = "not counted on this page";
    struct strbuf name = {0}, remark = {0}, message = {0}, page = {0};
    enum form_fault f = FORM_OK;
    if (body) /* why: the rule again, on the same bytes as guest_entry */
        f = form_check(body, len, &name, &remark);
    name.len = remark.len = 0;
    const struct strbuf count = {uncounted, sizeof uncounted - 1, 0};
    const struct strbuf *const fill[FILLS] = {NULL, &count, &message, &name,
                                              &remark};
    bool ok = form_message(&message, r, status, f) &&
              (!body || (form_kept(&name, body, len, "guest-name") &&
                         form_kept(&remark, body, len, "guest-remarks"))) &&
              fill_template(&page, fill) &&
              format_head(out, r, status, "text/html; charset=utf-8", page.len,
                          PAGE_HEADERS) &&
              (r->method == METHOD_HEAD || sb_append(out, page.data, page.len));
    sb_free(&name);
    sb_free(&remark);
    sb_free(&message);
    sb_free(&page);
    return ok;
}

/* An error's answer. A form POST to /guestbook refused by the form rule
 * (400 once its body is in), as too large (413) or for want of Redis (503),
 * and a page Redis cannot fill (503), answer the guestbook page again with
 * a message and the visitor's text (the form rule: typed text is never
 * lost); anything else gets format_error's small page. */
static bool format_refusal(struct strbuf *out, const struct http_request *r,
                           const char *buf, int status, const char *extra)
{
    struct http_request probe = *r; /* route_request notes its errors */
    char path[MAX_URI + sizeof "index.html"];
    enum route route = ROUTE_ERROR;
    if (buf && server.template && r->uri_len > 0 &&
        (status == 413 || status == 503 ||
         (status == 400 && r->state == S_DONE)))
        route = route_request(&probe, buf, path, sizeof path);
    if (route == ROUTE_POST)
        return format_form_page(out, r, status == 413 ? NULL : buf + r->body,
                                (size_t)r->content_length, status);
    if (route == ROUTE_PAGE && status == 503)
        return format_form_page(out, r, NULL, 0, status);
    return format_error(out, r, status, extra);
}
/* ---- end shared: guestbook ---- */

/* ----- The app: routing a request ----- */

/* ---- shared: route ---- */
/* Decides what a parsed request is for. The path is decoded into `path`;
 * ROUTE_ERROR leaves the status in r->status. */
static enum route route_request(struct http_request *r, const char *buf,
                                char *path, size_t size)
{
    int status = 501;
    if (r->method != METHOD_OTHER)
        status = decode_path(buf + r->uri, r->uri_len, path, size);
    if (status == 0) {
        if (strcmp(path, "/guestbook") == 0) {
            if (r->method != METHOD_POST)
                return ROUTE_PAGE;
            if (r->form_type)
                return ROUTE_POST;
            status = 415;
        } else if (r->method == METHOD_POST)
            status = 405;
        else
            return ROUTE_STATIC;
    }
    r->status = status;
    return ROUTE_ERROR;
}

/* Expect: 100-continue, once the head is in and the body is not: 100 when
 * the body is wanted (the model sends CONTINUE_LINE, then reads on), or
 * the final status at once, sparing the client a body we would refuse (it
 * is left in r->status; the connection closes after it). 0: nothing to
 * say, or said already. */
static int expect_answer(struct http_request *r, const char *buf)
{
    char path[MAX_URI + sizeof "index.html"];
    if (!r->expect_continue)
        return 0;
    r->expect_continue = false;
    if (route_request(r, buf, path, sizeof path) != ROUTE_ERROR)
        return 100;
    r->keep_alive = false;
    return r->status;
}
/* ---- end shared: route ---- */

/* ----- The app: start-up and shutdown ----- */

/* ---- shared: startup ---- */
static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* No SA_RESTART: a blocked accept() or poll() returns EINTR, so the loops
 * notice the flag. SIGPIPE is ignored: a client leaving is not our death. */
static void install_signals(void)
{
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0 ||
        signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        die("sigaction");
}

static void usage(void)
{
    fprintf(stderr, "usage: %s [port [redis-host [redis-port]]]\n",
            SERVER_NAME);
    exit(2);
}

static int parse_port(const char *s)
{
    long long port = 0;
    if (!parse_integer(s, s + strlen(s), &port) || port < 1 || port > 65535)
        usage();
    return (int)port;
}

static void parse_args(int argc, char **argv)
{
    const char *host = argc > 2 ? argv[2] : DEFAULT_REDIS_HOST;
    const char *rport = argc > 3 ? argv[3] : NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM},
                    *ai;
    char service[8];
    if (argc > 4)
        usage();
    server.port = argc > 1 ? parse_port(argv[1]) : DEFAULT_PORT;
    snprintf(service, sizeof service, "%d",
             rport ? parse_port(rport) : DEFAULT_REDIS_PORT);
    int err = getaddrinfo(host, service, &hints, &ai);
    if (err != 0) {
        fprintf(stderr, "%s: redis host %s: %s\n", SERVER_NAME, host,
                gai_strerror(err));
        usage();
    }
    memcpy(&server.redis_addr, ai->ai_addr, ai->ai_addrlen);
    server.redis_addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);
}

/* The template is read once: every page is rendered from memory, so no
 * model ever blocks on a disk read for it. A missing template is not fatal:
 * /guestbook answers 500 and says why in the log. */
static void load_template(void)
{
    FILE *f = fopen(TEMPLATE_PATH, "rb");
    char *data = f ? malloc(TEMPLATE_MAX) : NULL;
    size_t n = data ? fread(data, 1, TEMPLATE_MAX, f) : 0;
    if (f)
        fclose(f);
    if (!data || n == 0 || n == TEMPLATE_MAX) {
        fprintf(stderr, "%s: warning: cannot read %s; /guestbook will fail\n",
                SERVER_NAME, TEMPLATE_PATH);
        free(data);
        return;
    }
    server.template = data;
    server.template_len = n;
}

/* TCP_NODELAY on the listener is inherited by every accepted socket: a
 * response goes out at once, with no setsockopt() per connection. */
static int open_listener(int port)
{
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_ANY)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ||
        bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        listen(fd, LISTEN_BACKLOG) < 0)
        die("listen");
    return fd;
}

/* A number setting from the environment: unset or empty gives `fallback`;
 * anything but a number in min..max is an error (exit 2), not a guess. */
static int env_number(const char *var, int fallback, int min, int max)
{
    const char *s = getenv(var);
    long long n = fallback;
    if (s && *s &&
        (!parse_integer(s, s + strlen(s), &n) || n < min || n > max)) {
        fprintf(stderr, "%s: %s must be a number from %d to %d\n", SERVER_NAME,
                var, min, max);
        exit(2);
    }
    return (int)n;
}

static void server_init(int argc, char **argv)
{
    parse_args(argc, argv);
    install_signals();
    server.log = env_number("ZEROHTTPD_LOG", 0, 0, 1) == 1;
    server.stats = mmap(NULL, sizeof *server.stats, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (server.stats == MAP_FAILED)
        die("mmap");
    server.public_fd = open(PUBLIC_DIR, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (server.public_fd < 0)
        die("open " PUBLIC_DIR "/ (run from the repo root)");
    load_template();
    server.listen_fd = open_listener(server.port);
    printf("%s listening on port %d\n", SERVER_NAME, server.port);
    fflush(stdout);
}

static void print_summary(void)
{
    const struct stats *s = server.stats;
    printf("%s: served %lu requests (2xx %lu, 3xx %lu, 4xx %lu, 5xx %lu)\n",
           SERVER_NAME, s->served, s->by_class[2], s->by_class[3],
           s->by_class[4], s->by_class[5]);
    fflush(stdout);
}
/* ---- end shared: startup ---- */
