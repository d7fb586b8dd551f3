# zerohttpd-suite: `make` builds every server whose NN_name/main.c exists;
# `make test` and `make sweep` install what they need first (see tools/deps.sh).

SERVERS := iterative forking preforked threaded prethreaded poll epoll io_uring \
           reuseport fibers
SRCS    := $(wildcard [0-9][0-9]_*/main.c)
# A server is built when its source exists: [0-9][0-9]_NAME/main.c.
src_of   = $(wildcard [0-9][0-9]_$(1)/main.c)
BINS    := $(foreach s,$(SERVERS),$(if $(call src_of,$(s)),$(s)))
ASAN    := $(addprefix asan/,$(BINS))

WARNINGS    := -Wall -Wextra -Wshadow -Wformat=2 -Wstrict-prototypes \
               -Wmissing-prototypes -Werror
CFLAGS      := -std=gnu11 -O2 -g $(WARNINGS)
ASAN_CFLAGS := -std=gnu11 -O1 -g -fno-omit-frame-pointer \
               -fsanitize=address,undefined -fno-sanitize-recover=undefined \
               $(WARNINGS)
LDLIBS          := -pthread
LDLIBS_io_uring := -luring
PORT        ?= 8000
comma       := ,

.PHONY: all asan check-sync sync-shared format format-check deps test test-quick demo sweep \
        sweep-full sweep-table sweep-costs results results-check fuzz soak lab grade \
        handout lab-bin trace mutate clean
all: $(BINS)
asan: $(ASAN)

# Secondary expansion lets a binary name find its numbered directory.
.SECONDEXPANSION:
$(BINS): $$(call src_of,$$@)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS) $(LDLIBS_$@)
$(ASAN): $$(call src_of,$$(notdir $$@))
	@mkdir -p $(@D)
	$(CC) $(ASAN_CFLAGS) -o $@ $< $(LDLIBS) $(LDLIBS_$(notdir $@))

check-sync:
	tools/check-sync
# After editing a shared block in one file: make sync-shared FROM=NN_x/main.c
sync-shared:
	$(if $(FROM),,$(error usage: make sync-shared FROM=NN_x/main.c))
	tools/check-sync --from $(FROM)

format:
	$(if $(SRCS),clang-format -i $(SRCS),@echo "no NN_*/main.c to format")
format-check:
	$(if $(SRCS),clang-format --dry-run --Werror $(SRCS),@echo "no NN_*/main.c to check")

deps:
	tools/deps.sh

# The interpreter is picked inside each recipe, after deps has installed it.
# The tests that measure nothing against time run TEST_JOBS at a time (they
# mostly wait on sockets and timeouts), and beside them the labs are graded
# (tools/lab check, LAB_JOBS gradings at once, any lab's: a verdict that
# differs is graded again alone; up to LAB_MOST while the CPUs idle; and
# LAB_ASLEEP lanes of their own for slowloris, whose gradings sleep 99% of
# their 1,500 s: in the shared lanes they made the labs lane-bound); the
# labs start first, as soon as the servers are built; the tests marked
# serial run alone after. From a fresh clone on 2026-11-29 (2 cores), at
# e864204: 792 s in all, the parallel tests 418 s beside the labs' 697 s
# (735 wrong and 127 right answers, 35 right ones the same program as
# another and graded once; their gradings 755 CPU-s, 210 of them builds at
# -O0: labs/work/check-times.tsv), serial 85 s (642 s user + 622 s sys);
# at 063fc37, with builds at -O1, 868 s (builds 349 CPU-s), and 898 s at
# cd398bb. The CI machine ran session 17's commit 2.5% slower than this
# one (914 s, here 892 s).
TEST_JOBS  ?= 8
LAB_JOBS   ?= 8
LAB_MOST   ?= 16
LAB_ASLEEP ?= 4
PYTEST = "$$(tools/python pytest httplint xdist)" -m pytest tests/
LAB_LOG := labs/work/check.log
# The parallel tests' output is kept too: their failures are printed again
# at the very end, after the labs' long log, where a CI log's tail shows them,
# and those tests run again alone (as a lab verdict that differs is graded
# again alone): the last verdict counts, the first stays in the log.
TEST_LOG := labs/work/tests.log

test: deps
	$(MAKE) check-sync format-check
	$(MAKE) -j 2 all
	@mkdir -p $(dir $(LAB_LOG)); rm -f $(TEST_LOG).rc
	tools/lab check -j $(LAB_JOBS) --most $(LAB_MOST) \
	    --asleep $(LAB_ASLEEP) --times $(LAB_LOG:.log=-times.tsv) \
	    > $(LAB_LOG) 2>&1 & labs=$$!; \
	trap 'kill $$labs 2>/dev/null' INT TERM; \
	$(MAKE) -j 2 asan && fuzz/run --check && \
	{ $(PYTEST) -rs -n $(TEST_JOBS) --dist loadgroup -m "not serial" \
	    --durations=25 $(PYTEST_ARGS); echo $$? > $(TEST_LOG).rc; } \
	    | tee $(TEST_LOG); \
	tests=$$(cat $(TEST_LOG).rc 2>/dev/null || echo 1); \
	echo "waiting for tools/lab check ($(LAB_LOG))"; \
	wait $$labs; graded=$$?; cat $(LAB_LOG); \
	if [ "$$tests" != 0 ]; then echo "the parallel tests failed:"; \
	    grep -E '^(FAILED|ERROR) |^=+ .* in [0-9.]+s' $(TEST_LOG); \
	    echo "those tests again, alone (the last verdict counts):"; \
	    $(PYTEST) -rs --lf --lfnf=none -m "not serial" $(PYTEST_ARGS); \
	    tests=$$?; fi; \
	test "$$tests" = 0 && test $$graded = 0
	$(PYTEST) -rs -m serial --durations=10 $(PYTEST_ARGS)

# The edit loop: build, check-sync, and one server's own tests (SERVER=epoll
# and its ASan build), none of the labs, handouts, traces or sweeps.
SERVER ?= epoll
test-quick: deps
	$(MAKE) all asan/$(SERVER) check-sync
	ZEROHTTPD_BINARIES="./$(SERVER) asan/$(SERVER)" $(PYTEST) -q \
	    -n $(TEST_JOBS) -m "not serial" --ignore=tests/test_handouts.py \
	    --ignore=tests/test_lab_pack.py --ignore=tests/test_trace.py \
	    --ignore=tests/test_sweep_placement.py \
	    --ignore=tests/test_loadtest_smoke.py $(PYTEST_ARGS)

demo: deps
	$(MAKE) all
	tools/demo.sh $(PORT)

sweep: deps
	$(MAKE) all
	py=$$(tools/python matplotlib) && "$$py" loadtest/sweep --quick --no-build
sweep-full: deps
	$(MAKE) all
	py=$$(tools/python matplotlib) && "$$py" loadtest/sweep --no-build

# What each model costs (loadtest/README.md): the cost table (all ten and a
# one-worker nginx at c=1000, then beside 10,000 idle keep-alive clients),
# then latency under a fixed offered rate (httperf, open loop) for six
# models, with the knee where each falls over. About 1.5 + 4-6 minutes here
# (the first run took 1.5 + 21: httperf --hog stalled 48-64 s in 18 runs).
SWEEP_COSTS_ARGS ?= --requests 5000 --timeout 5
SWEEP_RATES      ?= 500,1000,1500,2000,3000,4000,6000,8000
KNEE_SERVERS     := iterative,forking,threaded,prethreaded,epoll,io_uring
sweep-costs: deps
	$(MAKE) all
	py=$$(tools/python matplotlib) && \
	"$$py" loadtest/sweep --no-build --costs $(SWEEP_COSTS_ARGS) && \
	"$$py" loadtest/sweep --no-build --servers $(KNEE_SERVERS) \
	    --rate $(SWEEP_RATES) --duration 2 --timeout 2

# The full sweep twice, unpinned and then pinned in the article's shape (the
# server alone on CPU 1; ab, Redis and nginx on CPU 0), each into a folder of
# stable name that replaces the last one, then `make results`. Every ab run is
# bounded by the sweep; each sweep as a whole by SWEEP_TABLE_LIMIT (on expiry
# it stops what it started and keeps what it measured). To try the plumbing:
# make sweep-table SWEEP_TABLE_ARGS="--quick --servers epoll,iterative"
SWEEP_TABLE_ARGS  ?=
SWEEP_TABLE_LIMIT ?= 90m
PINNED_CPUS       := server=1,client=0,redis=0,nginx=0
sweep-table: deps
	$(MAKE) all
	py=$$(tools/python matplotlib) && \
	for placement in unpinned pinned; do \
	    out=loadtest/results/classic-$$placement; \
	    cpus=; [ $$placement = pinned ] && cpus="--cpus $(PINNED_CPUS)"; \
	    rm -rf "$$out" && \
	    timeout --signal=TERM --kill-after=60 $(SWEEP_TABLE_LIMIT) \
	        "$$py" loadtest/sweep --no-build --out "$$out" $$cpus \
	        $(SWEEP_TABLE_ARGS) || exit 1; \
	done
	$(MAKE) results

# README.md's measured tables, chart links and environment lines, rewritten
# from the kept result folders (seconds; nothing is measured). `make
# results-check` only compares (tests/test_results_readme.py does too).
results:
	python3 loadtest/results-readme
	python3 tools/anatomy --write
results-check:
	python3 loadtest/results-readme --check
	python3 tools/anatomy --check

# Fuzz the shared parsers with libFuzzer (fuzz/README.md): each target
# FUZZ_SECONDS, as many at once as there are CPUs. Not part of `make test`
# (which only builds them and replays their seeds: fuzz/run --check).
FUZZ_SECONDS ?= 60
fuzz: deps
	fuzz/run -t $(FUZZ_SECONDS)

# Mutation score (tools/mutate --help): each mutant of tests/mutants/*.txt
# (a small bug written into one main.c) is built with the flags above and
# the parallel tests run against it; a failing test kills it. Fails below
# 95% killed, or if a mutant does not apply or build. Not part of `make
# test`. A full run on 2026-11-27 (72 mutants, MUTATE_JOBS=2, 2 cores shared
# with another test run): 2,348 s, about 30 s a mutant; 71 killed.
# make mutate MUTANTS="name ..." runs only those; MUTATE_ARGS="--file 07_epoll";
# MUTATE_ARGS=--asan tests each mutant's ASan build too (the one survivor
# above, a poll hash entry left after its connection is freed, is killed
# so: 52 s).
MUTANTS     ?=
MUTATE_JOBS ?= 4
MUTATE_ARGS ?=
mutate: deps
	tools/mutate -n $(MUTATE_JOBS) $(if $(MUTANTS),--only $(MUTANTS)) \
	    $(MUTATE_ARGS)

# Soak (loadtest/soak --help): a million mixed requests per server with Redis
# killed and restarted in the middle; minutes per server, not part of `make test`.
# make soak SOAK_ARGS=--quick, or SOAK_ARGS="--servers epoll,prethreaded"
SOAK_ARGS ?=
soak: deps
	$(MAKE) all
	py=$$(tools/python) && "$$py" loadtest/soak --no-build $(SOAK_ARGS)

# See the model (tools/trace, README "Seeing the models"): one fixed scenario
# against a server, recorded by strace and perf, drawn as a timeline:
# make trace SERVER=epoll (or SERVER=all) writes TRACE_OUT/NAME.png, .svg,
# .txt and .json. As root: perf record -a and tracefs need it.
# SCENARIO=redis-pause, burst or idle (2,000 idle keep-alive clients first):
# another scenario (files NAME-SCENARIO.*). A run where a client got an
# error or the load average passed the CPU count is refused: written as
# NAME[-SCENARIO].degraded.* with why, and make trace fails;
# TRACE_ARGS="--force" keeps it anyway, "--keep DIR" the raw strace and perf.
SCENARIO   ?= basic
TRACE_OUT  ?= docs/trace
TRACE_ARGS ?=
trace: deps
	$(if $(SERVER),,$(error usage: make trace SERVER=name|all))
	$(MAKE) all
	py=$$(tools/python matplotlib) && "$$py" tools/trace --out $(TRACE_OUT) \
	    --scenario $(SCENARIO) $(TRACE_ARGS) $(subst $(comma), ,$(SERVER))

# Labs (labs/README.md): `make lab LAB=zombies` writes the starter into
# labs/work/zombies/; `make grade LAB=zombies [SRC=path/main.c]` builds it and
# prints the score, and nothing else once the Debian packages are in (no
# recipe echoed, nothing from PyPI). `make handout LAB=zombies [OUT=f.tar.gz]`
# writes the instructor pack. lab-bin is how tools/lab builds: the flags
# above at -O0 and without -g. `tools/lab check` builds some 900 answers
# (at -O2 -g they were 40% of its CPU: 531 of 1,354 CPU-s on 2026-11-29;
# at -O1 347-380 CPU-s of make test's 885-1,055); -O0 compiles in two
# fifths of -O1's CPU (07: 0.12 s, not 0.32; the builds of a whole check
# 196 CPU-s), and every verdict holds (the graders compare with the
# reference built the same way; slowloris' fortified build, which needs
# optimization, asks for -O1 itself). A sanitizer build
# (LAB_DEFINES=-fsanitize=...) keeps -g for its reports' file:line. Except
# fibers, at -O2 as make all builds it: its lab's misaligned stack kills the
# -O2 build on the first request (SSE moves to aligned stack slots), where
# lower levels' code can run on it for a while; and the stacks lab's
# threaded, at -O1: its checks measure how deep a request touches the
# stack, which -O0's frames deepen.
LAB_CFLAGS := -std=gnu11 -O0 $(WARNINGS)
LAB_OPT_fibers := -O2
LAB_OPT_threaded := -O1
lab:
	$(if $(LAB),,$(error usage: make lab LAB=name (tools/lab list)))
	@tools/lab starter $(LAB)
grade:
	$(if $(LAB),,$(error usage: make grade LAB=name [SRC=path/main.c]))
	@tools/deps.sh --labs
	@tools/lab grade $(LAB) $(if $(SRC),--src $(SRC))
handout:
	$(if $(LAB),,$(error usage: make handout LAB=name [OUT=file.tar.gz]))
	@tools/lab handout $(LAB) $(if $(OUT),--out $(OUT))
lab-bin:
	$(CC) $(LAB_CFLAGS) $(LAB_OPT_$(LAB_MODEL)) \
	    $(if $(findstring -fsanitize,$(LAB_DEFINES)),-g) \
	    $(LAB_DEFINES) -o $(LAB_BIN) $(LAB_SRC) $(LDLIBS) \
	    $(LDLIBS_$(LAB_MODEL))

# Only the servers built from a source here: an instructor pack's prebuilt
# reference has none, and stays.
clean:
	rm -f $(BINS)
	rm -rf asan fuzz/build labs/work .pytest_cache tests/__pycache__ \
	       loadtest/__pycache__ labs/__pycache__
