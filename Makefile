# Two commands do everything on a fresh machine (Python >= 3.10 with venv):
#   make demo   - set up a light venv (perfd and its runtime deps only: no torch), then run the demo
#   make test   - set up, then lint, type-check and run the tests (what CI runs)
#   make test-fast - the tests not marked `slow` only, no lint (the loop while editing: < 2 min)
#   make test-repeat N=10 - the suite as `make test` runs it, N times in a row: which tests failed, how often
#   make mutation-check - one comparison changed in each of three modules must fail their tests
#   make test-e2e - the tests marked e2e only, one at a time: those that start perfd's processes because the
#     process boundary is what they test (signals, kill -9, exit statuses, start-up, a terminal)
VENV ?= .venv
BIN := $(VENV)/bin
# The interpreter the venvs are made from: Debian's python3.11 where it is there and can make a venv,
# else the first python3 on PATH. On this project's machines `python3` is pyenv's 3.11.7, built
# without profile-guided optimisation or LTO and with libpython shared; Debian's is built with both
# and linked statically, and every Python process of the suite (pytest's workers and the perfd
# processes its tests start) runs on less CPU there: importing the aggregator 0.894 -> 0.664 s of CPU
# (5 runs each), two CPU-bound test modules 57.9 -> 46.2 s (2 runs each), the whole suite below. A venv
# made before keeps its interpreter: remove it to remake it. PYTHON=... chooses.
PYTHON ?= $(shell /usr/bin/python3.11 -c 'import ensurepip, venv' >/dev/null 2>&1 && echo /usr/bin/python3.11 || echo python3)
# The demo needs only what `pip install perfd` brings (no torch, no test tools): its own venv.
DEMO_VENV ?= .venv-demo
# pytest workers for `make test`: most slow tests wait on real processes and timeouts, not on the
# CPU, so more workers than cores still shortens the run (the 2-core machine, 1,458 tests: 5 min 09 s
# of pytest with 4 workers, 4 min 44 s with 6, idle; 2026-11-24, 1,748 tests: 10 min 22 s with 6,
# other suites running beside it, load 4-10; 2026-11-26, 2,617 tests, make test from a fresh mypy cache:
# 8 min 22 s with 8 workers, pytest 466 s, idle; pytest alone with one other job beside it: 622 s with
# 6 workers, 533 s with 8 — the workers' tests summed 3,273 s of wall and 705 s of CPU, 57% of 2 cores).
# The xdist groups (conftest.py) matter as much: on pytest 9.2 they were silently ignored, and the
# same tree's pytest took 562 s and 1,045 s of CPU against 484 s and 898 s with them (8 workers, one
# run each, back to back; 2026-11-27). The suite is bound by its CPU on 2 cores (189-191% of them busy):
# the 2026-11-28 cuts of CPU spent twice or for nothing (README: tests.cpu_times) took a run of 2,699 tests in
# the checkout from 803.7 s of pytest and 1,542 s of CPU to 673.2 s and 1,276 s (8 workers, one run
# each, this slower VM). Later that day, with the collector kept off what collection made (conftest.py) and
# off trace reads, and two tests' own load cut (README: tests.cpu_times): 667.1 -> 621.6 s of pytest,
# 1,273 -> 1,181 s of CPU, 2,715 tests, one run each in the checkout.
# The venv made from Debian's python3.11 (PYTHON above): 636.4 -> 563.0 s of pytest, 1,210 -> 1,060 s
# of CPU, same tree, one run each, back to back (2026-11-28, the 2-core AMD EPYC VM).
TEST_WORKERS ?= 8
# pytest workers for `make test-fast`: its tests are short and mostly on the CPU (FAST_WORKERS=2 on
# the 2-core machine).
FAST_WORKERS ?= 2

.PHONY: setup demo test pytest test-repeat test-e2e test-fast mutation-check lint typecheck proto docs clean
setup: $(VENV)/.installed

# --no-compile: pip would compile the bytecode of every module it installs (torch's CPU build among them,
# most of which nothing here imports): 69 s for the install against 25 s without (2026-11-29, the quiet
# 2-core VM; a fresh clone's make test 518 -> 463 s, one run each). A module is compiled instead where it
# is first imported; the tests' runs (which may write bytecode: below) keep it.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	touch $@

$(DEMO_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	@echo "installing perfd into $(DEMO_VENV) (once; pip's output in $(DEMO_VENV)/install.log)"
	@$(DEMO_VENV)/bin/pip install -q --upgrade pip >$(DEMO_VENV)/install.log 2>&1 || \
	  { tail -n 30 $(DEMO_VENV)/install.log; exit 1; }
	@$(DEMO_VENV)/bin/pip install -q -e . >>$(DEMO_VENV)/install.log 2>&1 || \
	  { tail -n 30 $(DEMO_VENV)/install.log; exit 1; }
	@touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/perfd demo

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

# --durations: the slowest tests, printed at the end of every run (a test that grows slow under load
# shows there before it times out). --max-worker-restart 0: a worker that crashes (a segfault in a
# native library, seen once) fails the run with the test it was running named; pytest-xdist 3.8.0
# replacing it under --dist loadgroup can hang the session for good (pytest-xdist issues 1323, 1327).
# PYTHONDONTWRITEBYTECODE unset, as for test-fast below, and for more than the workers' assertion
# rewriting: the suite starts many Python processes (perfd's CLI, agents, aggregators, shards,
# hooked loops), and where none may write bytecode each compiles every perfd module it imports again
# (perfd.app.cli + the aggregator + the agent: 0.84 s of CPU a start, 0.43 s with __pycache__; 2-core
# machine, 2026-11-26).
#
# mypy runs beside the tests, not before them: from a fresh cache (CI's) it takes one core for about a
# minute (62 s on the 2-core machine, 2026-11-27) while the other waited. The run fails if either does;
# each one's output is printed whole when it ends (--output-sync).
test: lint
	@$(MAKE) --no-print-directory -j2 --output-sync=target typecheck pytest

# The suite is collected once, in one process, before the workers start: in a fresh clone no test module
# has its assertion-rewritten bytecode yet, and each of the workers, all starting at once, would rewrite
# every one of them (collection 11.4 s of CPU cold, 2.9 s with that bytecode: 2,715 tests; a fresh
# clone's make test 550 -> 518 s, pytest 479 -> 436 s; one run each, 2026-11-29, the quiet 2-core VM).
# PYTEST_COLLECT and PYTEST_RUN are the suite's run: `make pytest` (so `make test`) and `make test-repeat`
# both use them. PYTEST_ARGS (none: the whole suite) narrows a run, e.g. make test-repeat N=20
# PYTEST_ARGS=tests/hook/test_between_steps.py to see whether one module flakes.
PYTEST_ARGS ?=
PYTEST_COLLECT = PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q --collect-only -p no:cacheprovider $(PYTEST_ARGS) \
	>$(VENV)/collect.log 2>&1 || { tail -n 40 $(VENV)/collect.log; exit 1; }
PYTEST_RUN = PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -n $(TEST_WORKERS) --durations=25 --dist loadgroup \
	--max-worker-restart 0 $(PYTEST_ARGS)
pytest: setup
	@$(PYTEST_COLLECT)
	$(PYTEST_RUN)

# The serial lane: the tests marked e2e (pyproject's markers say which), as `make pytest` runs the suite but
# with no workers (-n 0: one process, one test at a time), so that each one's processes, ports and bounded
# waits have the machine to themselves. PYTEST_ARGS narrows it further.
test-e2e: TEST_WORKERS = 0
test-e2e: PYTEST_ARGS += -m e2e
test-e2e: setup
	@$(PYTEST_COLLECT)
	$(PYTEST_RUN)

# The suite N times in a row, as `make pytest` runs it (no lint or type-check: they do not flake). Each
# run's result line and its FAILED/ERROR lines are appended to REPEAT_LOG as it ends, a failed run's whole
# output kept beside it (build/test-repeat/run-K.log); then the runs, the failed runs and each failing
# test with the number of runs it failed in. Exits non-zero if any run failed.
N ?= 10
REPEAT_LOG ?= build/test-repeat.log
test-repeat: setup
	@$(PYTEST_COLLECT)
	@mkdir -p build/test-repeat && rm -f build/test-repeat/run-*.log && : >$(REPEAT_LOG); \
	bad=0; \
	for i in $$(seq 1 $(N)); do \
	  out=build/test-repeat/run-$$i.log; \
	  $(PYTEST_RUN) >$$out 2>&1; rc=$$?; \
	  res=$$(grep -E ' in [0-9.]+s( \([0-9:]+\))?( =+)?$$' $$out | tail -n 1); \
	  line="run $$i/$(N): exit $$rc: $${res:-no result line}"; \
	  echo "$$line"; echo "$$line" >>$(REPEAT_LOG); \
	  if [ $$rc -ne 0 ]; then \
	    bad=$$((bad + 1)); \
	    grep -E '^(FAILED|ERROR) ' $$out | sed 's/^/  /' >>$(REPEAT_LOG); \
	    echo "  the run's output: $$out" >>$(REPEAT_LOG); \
	  else rm -f $$out; fi; \
	done; \
	{ echo "== $(N) runs, $$bad failed"; \
	  grep -E '^  (FAILED|ERROR) ' $(REPEAT_LOG) | sed -E 's/^  (FAILED|ERROR) //; s/ - .*//' \
	    | sort | uniq -c | sort -rn \
	    | awk '{ n = $$1; sub(/^ *[0-9]+ /, ""); printf "  %d of $(N) runs: %s\n", n, $$0 }'; \
	} | tee -a $(REPEAT_LOG); \
	[ $$bad -eq 0 ]

# The fast loop: every test not marked `slow` (a test of ~2 s or more on the 2-core machine is
# marked; so is each user of a module fixture that costs that), no lint or type-check: 1,844 tests in
# 72 s there, load 5 (2026-11-26). pytest keeps its assertion rewriting in __pycache__ only where
# Python may write bytecode: on a machine that sets PYTHONDONTWRITEBYTECODE each worker rewrites every
# test module again each run (15 s of CPU against 5 s cached), so it is unset here.
test-fast: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -m "not slow" -n $(FAST_WORKERS) --dist loadgroup --max-worker-restart 0 --durations=10

# The mutation spot-check (tools/mutation_check.py; tests/README.md): a comparison changed in each of the
# stall watch (and its limit at the boundary), incident detection and the record codec, each in a
# temporary copy of the checkout, must fail the test files that cover that module. Exits non-zero if a
# mutation survives. About 3 minutes on the 2-core machine.
mutation-check: setup
	$(BIN)/python tools/mutation_check.py

proto: setup
	$(BIN)/python -m perfd.transport.regen
	$(BIN)/python -m perfd.collectors.k8s.regen_podresources

docs: setup
	$(BIN)/perfd catalog --doc > docs/metrics.md

clean:
	rm -rf $(VENV) $(DEMO_VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
