"""Build the Cython extensions of cpprb_ray.

Directives that never change live in the .pyx headers; the ones that trade
safety for speed are set here, with an environment switch for a checked
debug build that CI runs once:

    CPPRB_RAY_DEBUG=1 pip install -e .   # boundscheck, wraparound, initializedcheck on, -O0 -g
    CPPRB_RAY_ANNOTATE=1 ...              # also write the Cython HTML annotation (beside the C)
    CPPRB_RAY_OPT=1 ...                   # another -O level (the sanitizer build uses -O1)

Generated files stay out of the source tree and apart from each other: the C that Cython writes
goes to build/cython-<Cython version>/ (build/debug/... for a debug build), so one checkout can be
built by several Pythons and Cythons (Cython 3.0 for CPython 3.7, >= 3.1 elsewhere) without one
compiling C that another generated, and a debug build (its own build/debug base, so its objects
and libraries too) can never end up in a release wheel. Extension modules carry the ABI tag
(_segtree.cpython-311-x86_64-linux-gnu.so), so in-place builds for several Pythons coexist.
"""

import os
import sys

import Cython
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("CPPRB_RAY_DEBUG", "") not in ("", "0")
ANNOTATE = os.environ.get("CPPRB_RAY_ANNOTATE", "") not in ("", "0")
BUILD_BASE = os.path.join("build", "debug") if DEBUG else "build"
GENERATED_C = os.path.join(BUILD_BASE, f"cython-{Cython.__version__}")

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "embedsignature": True,
}

# No -march=native: wheels must run on any x86_64 / aarch64 machine.
compile_args = ["-O0", "-g", "-UNDEBUG"] if DEBUG else ["-O3"]
# CPPRB_RAY_OPT=1 (e.g.): another optimization level for a checking build, such as the sanitizer
# build (make test-asan), which -O3 makes several times slower to compile for no use.
OPT = os.environ.get("CPPRB_RAY_OPT", "")
if OPT:
    if OPT not in ("0", "1", "2", "3", "s", "g"):
        raise SystemExit(f"CPPRB_RAY_OPT must be one of 0 1 2 3 s g; got {OPT!r}")
    compile_args = [flag for flag in compile_args if not flag.startswith("-O")] + [f"-O{OPT}"]
macros: list = []
# libm named at link time, so that pow and powf are bound to glibc's current versions
# (pow@GLIBC_2.29, powf@GLIBC_2.27): left unversioned, the loader binds them to the oldest ones,
# the SVID-compatible wrappers (5 % of a cached update(256) in perf; 0.1 us less without).
libraries = ["pthread", "m"] if sys.platform.startswith("linux") else []

extensions = [
    Extension(
        f"cpprb_ray.{name}",
        [f"cpprb_ray/{name}.pyx"],
        extra_compile_args=compile_args,
        libraries=libraries,
        define_macros=macros,
    )
    for name in ("_segtree", "_sync", "_rules", "_segment", "_core", "_columns", "_lanes",
                 "_outputs", "_store", "_lanestore", "_image", "_mapping", "_sequences",
                 "_seqstore", "_digest")
]

setup(
    license="MIT",  # dynamic in pyproject.toml: one spelling that setuptools 68 (3.7) to 84+ accept
    # Both steps use every CPU: the modules are cythonized and compiled side by side (CI
    # builds them five times, on two cores).
    options={"build": {"build_base": BUILD_BASE},
             "build_ext": {"parallel": os.cpu_count() or 1}},
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        annotate=ANNOTATE,
        build_dir=GENERATED_C,
        nthreads=os.cpu_count() or 1,
        # A debug build must never reuse optimized C files from a previous build.
        force=DEBUG,
    ),
)
