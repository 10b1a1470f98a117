"""Build the Cython extensions of cpprb_ray.

Directives that never change live in the .pyx headers; the ones that trade
safety for speed are set here, with an environment switch for a checked
debug build that CI runs once:

    CPPRB_RAY_DEBUG=1 pip install -e .   # boundscheck, wraparound, initializedcheck on, -O0 -g
    CPPRB_RAY_ANNOTATE=1 ...              # also write the Cython HTML annotation
"""

import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("CPPRB_RAY_DEBUG", "") not in ("", "0")
ANNOTATE = os.environ.get("CPPRB_RAY_ANNOTATE", "") not in ("", "0")

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
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
libraries = ["pthread"] if sys.platform.startswith("linux") else []

extensions = [
    Extension(
        f"cpprb_ray.{name}",
        [f"cpprb_ray/{name}.pyx"],
        extra_compile_args=compile_args,
        libraries=libraries,
        define_macros=macros,
    )
    for name in ("_segtree", "_sync", "_store")
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        annotate=ANNOTATE,
        # A debug build must never reuse optimized C files from a previous build.
        force=DEBUG,
    ),
)
