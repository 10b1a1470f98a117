# cpprb_ray developer entry points. Every target sets up what it needs from a clean clone:
#
#   make demo         the main job: Ape-X on CartPole, examples/apex.py (sets up .venv first)
#   make test         the whole test suite on Python 3.11 (sets up .venv first)
#   make test-isolation  two runs of the segment and CLI tests at once (each touches only its own)
#   make test-debug   tree, mutex, store and buffer tests against a CPPRB_RAY_DEBUG=1 build
#   make test-asan    the same tests against an AddressSanitizer + UBSan build (and LSan)
#   make test37       the whole suite on CPython 3.7 (Cython 3.0, numpy 1.21, ray 2.7.2)
#   make test313      the suite on CPython 3.13, the newest the README names, newest numpy and Ray
#   make wheel-check  sdist -> wheel, installed in a venv without Cython, smoke-tested
#   make lint         ruff, mypy, stubtest and cython-lint
#   make docs         the documentation site, docs/_build/html (sphinx -W: a warning fails it)
#   make bench-peers  .venv-tianshou, .venv-torchrl, .venv-reverb: the benchmarks' peers
#   make compare      benchmarks/compare.py against every peer (COMPARE_FLAGS=--quick: < 7 min)
#   make cpprb-suite  cpprb's own tests on cpprb and on cpprb_ray (CPPRB_TESTS=its test folder)
#   make clean        build outputs;  make distclean: also every .venv*
#
# Virtual environments live in the repository (.venv*/ is gitignored):
#   .venv         Python 3.11 (else python3): editable install, extensions built in place
#   .venv37       CPython 3.7 from pyenv: editable install, its own ABI-tagged .so files in place
#   .venv313      CPython 3.13 from pyenv, the newest pip gives of everything; the same, in place
#   .venv-debug   a debug build made in a copy of the tree (.venv-debug/src), never in place
#   .venv-asan    a sanitizer build, likewise in a copy (.venv-asan/src)
#   .venv-wheel   rebuilt by every wheel-check, without Cython
#   .venv-tianshou, .venv-torchrl, .venv-reverb  Python 3.11: a peer library (their pins
#                 differ), cpprb, and this package editable, so that one process runs all three
# Extension modules carry their ABI tag (cpython-311 / cpython-37m), so the 3.11 and 3.7 in-place
# builds coexist; setup.py keeps generated C under build/cython-<version>/, per Cython version.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)

# $(call find_python,CANDIDATES,X.Y): the first candidate that runs and is Python X.Y.
find_python = $(shell for p in $(1); do \
    if "$$p" -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(2)")' >/dev/null 2>&1; \
    then command -v "$$p"; break; fi; done)

PYTHON ?= $(or $(call find_python,python3.11 $(shell ls -d $(PYENV_ROOT)/versions/3.11.*/bin/python 2>/dev/null | sort -rV),3.11),$(shell command -v python3))
PYTHON37 ?= $(call find_python,python3.7 $(shell ls -d $(PYENV_ROOT)/versions/3.7.*/bin/python 2>/dev/null | sort -rV),3.7)
PYTHON313 ?= $(call find_python,python3.13 $(shell ls -d $(PYENV_ROOT)/versions/3.13.*/bin/python 2>/dev/null | sort -rV),3.13)

PIP_FLAGS ?= -q
PYTEST_ARGS ?=
EXT_SOURCES := $(wildcard cpprb_ray/*.pyx cpprb_ray/*.pxd cpprb_ray/*.pxi)
EXTENSIONS := _segtree _sync _rules _segment _core _columns _lanes _outputs _store _lanestore _image _mapping _sequences _seqstore _digest
comma := ,
space := $(eval) $(eval)
IMPORT_EXTENSIONS := import $(subst $(space),$(comma) ,$(addprefix cpprb_ray.,$(EXTENSIONS)))

# Everything (but Python itself) that CI needs, pinned for CPython 3.7.
PY37_DEPS := "cython>=3.0,<3.1" "numpy>=1.21,<1.22" "ray==2.7.2" pytest hypothesis cloudpickle \
    gymnasium tqdm matplotlib

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_NO_INPUT := 1
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: help venv test test-isolation cpprb-suite test-debug test-asan test37 venv37 test313 venv313 wheel-check demo lint docs bench-peers compare clean distclean

help:
	@sed -n '2,17p' Makefile | sed 's/^# \{0,1\}//'

# ---------------------------------------------------------------------------------------------
# .venv: Python 3.11, editable install with the extensions built in place.
# Dependencies are reinstalled when pyproject.toml / setup.py change; the extensions are rebuilt
# (incrementally, with the venv's own Cython) when a .pyx / .pxd changes or a .so went missing.

.venv/.deps: pyproject.toml setup.py
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 found" >&2; exit 1; }
	@echo "== .venv: $(PYTHON) ($$($(PYTHON) -V 2>&1))"
	test -x .venv/bin/python || $(PYTHON) -m venv .venv
	.venv/bin/python -m pip install $(PIP_FLAGS) -U pip "setuptools>=61" wheel "Cython>=3.1"
	.venv/bin/python -m pip install $(PIP_FLAGS) --no-build-isolation -e '.[test,ray,dev,examples,metrics,tensors]'
	.venv/bin/python -m pip install $(PIP_FLAGS) cpprb \
	    || echo "warning: cpprb did not install; API parity tests and comparisons will skip" >&2
	touch $@

.venv/.built: .venv/.deps $(EXT_SOURCES)
	.venv/bin/python -m pip install $(PIP_FLAGS) --no-build-isolation --no-deps -e .
	touch $@

venv: .venv/.built
	@.venv/bin/python -c '$(IMPORT_EXTENSIONS)' 2>/dev/null || { \
	    echo "== extension modules missing: rebuilding in place"; \
	    .venv/bin/python -m pip install $(PIP_FLAGS) --no-build-isolation --no-deps -e .; \
	    .venv/bin/python -c '$(IMPORT_EXTENSIONS)'; }

test: venv
	.venv/bin/python -m pytest -q $(PYTEST_ARGS)

# Two copies of the tests that make, list and remove segments, run at once: as two checkouts'
# `make test` on one machine, or a user's tests beside a crashed job whose buffer waits to be
# inspected. Each must touch only the segments it made (its sweeps of orphans take its own name
# prefix; its leak check, its own segments): a copy that removed the other's deliberate orphans
# fails the other's assertions. Each run's output is shown, then the status of both.
ISOLATION_TESTS := tests/test_cli.py tests/test_endings.py tests/test_ownership.py

test-isolation: venv
	@logs="$$(mktemp -d)"; status=0; \
	    for copy in a b; do \
	        .venv/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(ISOLATION_TESTS) \
	            >"$$logs/$$copy" 2>&1 & \
	        eval "pid_$$copy=$$!"; \
	    done; \
	    wait "$$pid_a" || status=1; wait "$$pid_b" || status=1; \
	    for copy in a b; do echo "== copy $$copy"; tail -n 40 "$$logs/$$copy"; done; \
	    rm -rf "$$logs"; \
	    if [ "$$status" -ne 0 ]; then echo "error: the two copies interfered (or a test failed)" >&2; fi; \
	    exit $$status

# Ape-X on CartPole (docs/apex.md): 2 actors, up to 90 s, stops once the mean return of the
# last 20 episodes reaches 150; the figure goes to build/apex.png. DEMO_ARGS overrides.
DEMO_ARGS ?= --actors 2 --seconds 90 --seed 0 --stop-when-solved --plot build/apex.png

demo: venv
	@mkdir -p build
	.venv/bin/python examples/apex.py $(DEMO_ARGS)

# ruff and mypy on the Python, stubtest of the .pyi stubs against the built extensions, and
# cython-lint on the Cython sources.
lint: venv
	.venv/bin/ruff check cpprb_ray tests benchmarks examples tools
	.venv/bin/mypy cpprb_ray
	.venv/bin/python -m mypy.stubtest cpprb_ray --allowlist .ci/stubtest-allowlist.txt
	PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/cython-lint --max-line-length 100 \
	    cpprb_ray/*.pyx cpprb_ray/*.pxd cpprb_ray/*.pxi

# The documentation site: Sphinx with MyST (the pages stay Markdown) and autodoc over the
# docstrings, strict (-W: any warning fails the build). Sphinx comes with the "docs" extra,
# installed into .venv once (its own stamp, so `make venv` stays as it was).
.venv/.docs: .venv/.deps pyproject.toml
	.venv/bin/python -m pip install $(PIP_FLAGS) sphinx myst-parser   # pyproject's docs extra
	touch $@

docs: venv .venv/.docs
	rm -rf docs/_build/html
	.venv/bin/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "== docs/_build/html/index.html"

# cpprb's own test files against cpprb and against cpprb_ray through `import cpprb` (a stand-in
# package re-exporting cpprb_ray, on the path of that run only): the per-file table, and every
# test that passes on cpprb only with its documented reason (tools/cpprb_suite/run.py). The tests
# come from CPPRB_TESTS (a checkout's test/ folder), else from cpprb's sdist if it ships them.
cpprb-suite: venv
	.venv/bin/python tools/cpprb_suite/run.py $(if $(CPPRB_TESTS),--tests "$(CPPRB_TESTS)")

# ---------------------------------------------------------------------------------------------
# Debug build: CPPRB_RAY_DEBUG=1 (boundscheck, wraparound, initializedcheck, -O0 -g -UNDEBUG),
# made and tested in a fresh copy of the working tree (tracked plus untracked, not ignored files)
# so that no debug .so can ever land in the main checkout.

DEBUG_SRC := .venv-debug/src

# $(call copy_worktree,DIR): a fresh copy of the working tree (tracked plus untracked, not ignored
# files) in DIR, so that no debug or sanitizer .so can ever land in the main checkout. Build output
# is then removed from the copy whatever git made of the tree: one CI run's copy held the in-place
# release .so files and build/ (how, its log does not show), setuptools found them up to date and
# compiled nothing, and only the ASan check of test-asan stopped a release build passing as checked.
define copy_worktree
	rm -rf $(1) && mkdir -p $(1)
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	    git ls-files -z --cached --others --exclude-standard \
	        | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null \
	        | tar -xf - -C $(1); \
	else \
	    tar --exclude='./.venv*' --exclude=./build --exclude=./dist --exclude='*.so' \
	        --exclude='*.c' --exclude=./.git -cf - . | tar -xf - -C $(1); \
	fi
	cd $(1) && rm -rf build dist ./*.egg-info && find . -type f \( -name '*.so' -o -name '*.c' \) -delete
endef
# (cpprb_ray.metrics' docstring example needs Ray, which a checking venv leaves out: -k "not
# metrics"; the 3.11 leg runs it.)
# Everything that drives the extensions in this process: the tree, the mutex, the store (through
# the buffer), bad input, the defects, and the docstring examples.
DEBUG_TESTS := tests/test_segtree.py tests/test_sync.py tests/test_doctests.py tests/test_buffer.py \
    tests/test_bad_input.py tests/test_defects.py tests/test_mapping.py

# $(call checking_venv,DIR): a fresh venv in DIR with what a checking build (debug, sanitizer)
# needs to build and run the extension tests (gymnasium: the docstring examples of cpprb_ray.util
# build their spaces); nothing else.
define checking_venv
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 found" >&2; exit 1; }
	rm -rf $(1)
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install $(PIP_FLAGS) -U pip "setuptools>=61" wheel "Cython>=3.1"
	$(1)/bin/python -m pip install $(PIP_FLAGS) numpy pytest hypothesis cloudpickle gymnasium
	touch $(1)/.deps
endef

.venv-debug/.deps: pyproject.toml setup.py
	$(call checking_venv,.venv-debug)

test-debug: .venv-debug/.deps
	$(call copy_worktree,$(DEBUG_SRC))
	cd $(DEBUG_SRC) && CPPRB_RAY_DEBUG=1 ../bin/python -m pip install $(PIP_FLAGS) \
	    --no-build-isolation --no-deps -e .
	@cd $(DEBUG_SRC) && tests="$$(ls $(DEBUG_TESTS) 2>/dev/null || true)"; \
	    if [ ! -f tests/test_sync.py ]; then \
	        echo "warning: tests/test_sync.py does not exist (yet)" >&2; fi; \
	    if [ -z "$$tests" ]; then tests="$$(ls tests/test_segtree*.py 2>/dev/null || true)"; fi; \
	    if [ -z "$$tests" ]; then \
	        echo "error: test-debug found no tests/test_segtree*.py or tests/test_sync.py" >&2; \
	        exit 1; fi; \
	    ls build/debug/cython-*/cpprb_ray/_segtree.c >/dev/null \
	        || { echo "error: no debug build under $(DEBUG_SRC)/build/debug" >&2; exit 1; }; \
	    echo "== debug build; running:" $$tests; \
	    ../bin/python -m pytest -q $(PYTEST_ARGS) -k "not metrics" $$tests

# ---------------------------------------------------------------------------------------------
# Sanitizer build: the release directives (no Cython bounds checks: what ships is what is checked)
# compiled with -fsanitize=address,undefined, in a copy of the tree like test-debug. Python is not
# instrumented, so libasan is preloaded; PYTHONMALLOC=malloc lets ASan see every Python object's
# bounds. Any invalid access or undefined behaviour fails the run, and so does a leak whose
# allocation stack has a cpprb_ray frame (.ci/asan_report.py; interpreter-lifetime allocations of
# CPython and numpy alone are counted, not failed). Left out: test_crash_points.py (it ptraces and
# single-steps the kernels: ASan's shadow memory and its own SIGSEGV handling are in the way) and
# the process-heavy suites (their children are the same kernels, many times slower under ASan).

ASAN_SRC := .venv-asan/src
ASAN_TESTS := tests/test_segtree.py tests/test_sync.py tests/test_buffer.py tests/test_bad_input.py \
    tests/test_defects.py tests/test_fuzz.py tests/test_nstep.py \
    $(addprefix tests/test_frames.py::test_,two_streams_wrap_around_and_come_back_exact \
        next_of_alone_and_stack_compress_alone lanes_without_frames_and_too_many_writers \
        priorities_generations_and_eviction bad_input_leaves_the_buffer_unchanged \
        nstep_rows_equal_those_of_a_buffer_without_frames)
ASAN_CFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g
ASAN_FUZZ_SECONDS ?= 15
# An RLIMIT_AS of 4 GiB cannot hold ASan's shadow memory (terabytes of address space reserved):
# that test's child fails in ASan's own allocations, not in the check it makes (3.11 runs it).
ASAN_DESELECT := --deselect \
    tests/test_defects.py::test_a_sample_past_the_memory_limit_is_refused_before_it_allocates

.venv-asan/.deps: pyproject.toml setup.py
	$(call checking_venv,.venv-asan)

test-asan: .venv-asan/.deps
	$(call copy_worktree,$(ASAN_SRC))
	cd $(ASAN_SRC) && CPPRB_RAY_OPT=1 CFLAGS="$(ASAN_CFLAGS)" LDFLAGS="-fsanitize=address,undefined" \
	    ../bin/python -m pip install $(PIP_FLAGS) --no-build-isolation --no-deps -e .
	@# Instrumented, whether or not linked against libasan (it is preloaded for the run anyway):
	@# a stale release .so has no __asan_report_* calls, whatever its links. nm's output is read
	@# whole before it is searched: piped into grep -q under pipefail, nm died of SIGPIPE once grep
	@# had its match (in 230 of 1600 checks here) and an instrumented build was failed.
	@cd $(ASAN_SRC) && for so in cpprb_ray/_*.so; do \
	    symbols="$$(nm -D --undefined-only "$$so")"; \
	    grep -q __asan_report_ <<<"$$symbols" || { \
	        echo "error: $$so is not instrumented by ASan (no __asan_report_* calls); ldd:" >&2; \
	        ldd "$$so" >&2; ls -l --time-style=full-iso cpprb_ray/_*.so build >&2; exit 1; }; \
	    done
	@cd $(ASAN_SRC) && logs="$$(mktemp -d)" && echo "== sanitizer logs in $$logs" && \
	    status=0 && \
	    LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" PYTHONMALLOC=malloc \
	    ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:allocator_may_return_null=1:log_path=$$logs/asan:detect_stack_use_after_return=0" \
	    LSAN_OPTIONS="suppressions=$(CURDIR)/.ci/lsan-suppressions.txt:exitcode=0" \
	    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$$logs/ubsan" \
	    CPPRB_RAY_FUZZ_SECONDS=$(ASAN_FUZZ_SECONDS) \
	    ../bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(ASAN_DESELECT) $(ASAN_TESTS) \
	        || status=$$?; \
	    ../bin/python .ci/asan_report.py "$$logs" || status=1; \
	    exit $$status

# ---------------------------------------------------------------------------------------------
# CPython 3.7: Cython 3.0.x, numpy 1.21, ray 2.7.2. The package is installed with build isolation,
# so pyproject.toml's [build-system] requires are resolved for 3.7 on every run (setuptools 68,
# Cython <3.1). Its cpython-37m .so files sit in place beside the 3.11 ones.

.venv37/.deps: pyproject.toml setup.py
	@test -n "$(PYTHON37)" || { echo "error: no CPython 3.7 found (pyenv install 3.7)" >&2; exit 1; }
	@echo "== .venv37: $(PYTHON37) ($$($(PYTHON37) -V 2>&1))"
	rm -rf .venv37
	$(PYTHON37) -m venv .venv37
	.venv37/bin/python -m pip install $(PIP_FLAGS) -U pip "setuptools>=61" wheel
	.venv37/bin/python -m pip install $(PIP_FLAGS) $(PY37_DEPS)
	touch $@

.venv37/.built: .venv37/.deps $(EXT_SOURCES)
	.venv37/bin/python -m pip install $(PIP_FLAGS) --no-deps -e .
	touch $@

venv37: .venv37/.built
	@.venv37/bin/python -c '$(IMPORT_EXTENSIONS)' 2>/dev/null || { \
	    echo "== 3.7 extension modules missing: rebuilding in place"; \
	    .venv37/bin/python -m pip install $(PIP_FLAGS) --no-deps -e .; \
	    .venv37/bin/python -c '$(IMPORT_EXTENSIONS)'; }

# The 3.7 leg runs the whole suite but the tooling that is 3.11's only (the benchmark reports
# and comparison, the docs' examples: the docs are built and checked on 3.11) and the two
# training examples (Ape-X and R2D2: about 75 s of Ray runs whose buffer calls the 3.7 leg's
# Ray, process and sequence tests make too); the fuzz and soak runs (30 s and 20 s in
# `make test`) are shortened here: they check the same store, and CI's total time is bounded.
PY37_FUZZ_SECONDS ?= 10
PY37_SOAK_SECONDS ?= 10
PY37_IGNORE := tests/test_compare.py tests/test_benchmark_reports.py tests/test_docs_examples.py \
    tests/test_apex_example.py tests/test_r2d2_example.py

test37: venv37
	CPPRB_RAY_FUZZ_SECONDS=$(PY37_FUZZ_SECONDS) CPPRB_RAY_SOAK_SECONDS=$(PY37_SOAK_SECONDS) \
	    .venv37/bin/python -m pytest -q $(addprefix --ignore=,$(PY37_IGNORE)) $(PYTEST_ARGS)

# ---------------------------------------------------------------------------------------------
# CPython 3.13, the newest Python the README names, with the newest of everything that pip gives
# it (numpy, Cython, Ray: -U on every run of .deps), so that a deprecation there shows here
# first. Its cpython-313 .so files sit in place beside the others.

.venv313/.deps: pyproject.toml setup.py
	@test -n "$(PYTHON313)" || { echo "error: no CPython 3.13 found (pyenv install 3.13)" >&2; exit 1; }
	@echo "== .venv313: $(PYTHON313) ($$($(PYTHON313) -V 2>&1))"
	rm -rf .venv313
	$(PYTHON313) -m venv .venv313
	.venv313/bin/python -m pip install $(PIP_FLAGS) -U pip "setuptools>=61" wheel "Cython>=3.1"
	.venv313/bin/python -m pip install $(PIP_FLAGS) -U numpy
	.venv313/bin/python -m pip install $(PIP_FLAGS) --no-build-isolation -e '.[test,ray,examples]'
	.venv313/bin/python -c 'import numpy, ray, sys; print("== .venv313: Python", sys.version.split()[0], "numpy", numpy.__version__, "ray", ray.__version__)'
	touch $@

.venv313/.built: .venv313/.deps $(EXT_SOURCES)
	.venv313/bin/python -m pip install $(PIP_FLAGS) --no-build-isolation --no-deps -e .
	touch $@

venv313: .venv313/.built
	@.venv313/bin/python -c '$(IMPORT_EXTENSIONS)' 2>/dev/null || { \
	    echo "== 3.13 extension modules missing: rebuilding in place"; \
	    .venv313/bin/python -m pip install $(PIP_FLAGS) --no-build-isolation --no-deps -e .; \
	    .venv313/bin/python -c '$(IMPORT_EXTENSIONS)'; }

# As the 3.7 leg (the tooling checked on 3.11 left out, the fuzz run shortened), and, to keep
# CI's total within bounds, without the slowest process-heavy files: the two-node Ray cluster,
# the ptrace single-stepping, the soak, the Ape-X example and the process endings. They drive
# the same kernels through processes that the 3.11 and 3.7 legs run whole; what is new on 3.13
# (the interpreter, numpy's newest deprecations, Ray's newest release) meets every other file.
PY313_IGNORE := $(PY37_IGNORE) tests/test_remote.py tests/test_crash_points.py \
    tests/test_soak.py tests/test_endings.py tests/test_processes.py

test313: venv313
	CPPRB_RAY_FUZZ_SECONDS=$(PY37_FUZZ_SECONDS) CPPRB_RAY_SOAK_SECONDS=$(PY37_SOAK_SECONDS) \
	    .venv313/bin/python -m pytest -q $(addprefix --ignore=,$(PY313_IGNORE)) $(PYTEST_ARGS)

# ---------------------------------------------------------------------------------------------
# sdist, then the wheel built FROM that sdist (python -m build's default), into dist/; then a
# fresh venv without Cython installs the wheel and smoke-tests it from outside the checkout.

wheel-check:
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 found" >&2; exit 1; }
	rm -rf .venv-wheel dist
	$(PYTHON) -m venv .venv-wheel
	.venv-wheel/bin/python -m pip install $(PIP_FLAGS) -U pip build
	.venv-wheel/bin/python -m build --outdir dist .
	.venv-wheel/bin/python -m pip install $(PIP_FLAGS) dist/*.whl
	cd "$$(mktemp -d)" && $(CURDIR)/.venv-wheel/bin/python $(CURDIR)/.ci/wheel_check.py smoke
	.venv-wheel/bin/python .ci/wheel_check.py contents dist


# ---------------------------------------------------------------------------------------------
# Peer libraries for the benchmarks, each in its own venv because their pins differ; each also
# gets cpprb and this package (editable, extensions built in place as for .venv), so that one
# process can interleave calls to all three. What they take from PyPI (installed sizes):
#   .venv-tianshou  tianshou 2.0.1 on torch 2.13.0: 1.5 GB with the CPU-only torch wheel from
#                   $(TORCH_WHEELS) when that folder holds it, else PyPI's torch with its CUDA
#                   packages (about 5 GB more; it runs on the CPU all the same)
#   .venv-torchrl   TorchRL 0.14.1 and tensordict 0.14.3 on torch 2.14.1: 5.5 GB (TorchRL's C++
#                   segment tree is built for 2.14 and does not load on 2.13; PyPI has no
#                   CPU-only 2.14.1). TORCH_INDEX=<PyTorch's CPU wheel index> takes the CPU-only
#                   wheel from there instead, where that index can be reached
#   .venv-reverb    dm-reverb 0.14.0 with tensorflow-cpu 2.15.0 and numpy < 2: 1.3 GB (Reverb's
#                   last release, built for TensorFlow 2.15)
# Then:
#     .venv-tianshou/bin/python benchmarks/bench_buffer.py
#     .venv-reverb/bin/python benchmarks/bench_writers.py

TORCH_WHEELS ?= /opt/wheels
TORCH_INDEX ?=
TIANSHOU_PINS := "torch==2.13.0" "tianshou==2.0.1"
TORCHRL_PINS := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
    "torch==2.14.1" "torchrl==0.14.1" "tensordict==0.14.3"
REVERB_PINS := "dm-reverb==0.14.0" "tensorflow-cpu==2.15.0" "numpy<2"
# Our package's build and run requirements, plus the library every table compares against.
PEER_COMMON := "setuptools>=61" wheel "Cython>=3.1" numpy cpprb

# $(call peer_venv,DIR,PINS,IMPORT): create DIR with PINS, cpprb and this package (editable),
# then check that IMPORT (the peer's module) imports.
define peer_venv
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 found" >&2; exit 1; }
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install $(PIP_FLAGS) -U pip
	$(1)/bin/python -m pip install $(PIP_FLAGS) \
	    $$(test -d $(TORCH_WHEELS) && echo --find-links $(TORCH_WHEELS)) $(PEER_COMMON) $(2)
	$(1)/bin/python -m pip install $(PIP_FLAGS) --no-build-isolation --no-deps -e .
	$(1)/bin/python -c 'import cpprb, cpprb_ray._store, $(3); print("$(1): ok")'
	touch $(1)/.deps
endef

.venv-tianshou/.deps: pyproject.toml setup.py $(EXT_SOURCES)
	$(call peer_venv,.venv-tianshou,$(TIANSHOU_PINS),tianshou)

.venv-torchrl/.deps: pyproject.toml setup.py $(EXT_SOURCES)
	$(call peer_venv,.venv-torchrl,$(TORCHRL_PINS),torchrl._torchrl)

.venv-reverb/.deps: pyproject.toml setup.py $(EXT_SOURCES)
	$(call peer_venv,.venv-reverb,$(REVERB_PINS),reverb)

bench-peers: .venv-tianshou/.deps .venv-torchrl/.deps .venv-reverb/.deps

# Every microbenchmark side by side, each peer in its venv; report in compare-results/.
COMPARE_FLAGS ?=
compare: venv bench-peers
	.venv/bin/python benchmarks/compare.py $(COMPARE_FLAGS) \
	    --peer-python tianshou=.venv-tianshou/bin/python \
	    --peer-python torchrl=.venv-torchrl/bin/python \
	    --peer-python reverb=.venv-reverb/bin/python

# ---------------------------------------------------------------------------------------------

clean:
	rm -rf build dist docs/_build *.egg-info .venv-debug .venv-asan .venv-wheel .pytest_cache .hypothesis \
	    .mypy_cache .ruff_cache .venv/.built .venv37/.built .venv313/.built
	rm -f $(foreach e,$(EXTENSIONS),cpprb_ray/$(e).c cpprb_ray/$(e).html cpprb_ray/$(e).*.so)
	find cpprb_ray tests benchmarks -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true

distclean: clean
	rm -rf .venv .venv37 .venv313 .venv-tianshou .venv-torchrl .venv-reverb
