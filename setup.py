"""Build the C shim as part of ``pip install .``.

The shim is a plain LD_PRELOAD library, shipped inside the package as the extension
module ``stenograph._shim`` so that one ``pip install .`` builds it with the system C
compiler. It has no Python API and is never imported: programs load it through
LD_PRELOAD, which is why it must not link libpython and exports only the wrapped libc
symbols (-fvisibility=hidden plus explicit default visibility in the source).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stenograph._shim",
            sources=["shim_c/steno_shim.c"],
            # a unity build: steno_shim.c #includes these parts
            depends=[f"shim_c/{name}" for name in (
                "steno_shim.h", "shim.h", "core.c", "clock.c", "entropy.c", "io.c",
                "identity.c", "wait.c", "dirents.c", "threads.c", "seccomp.c", "init.c",
                "proc.c", "ring.c", "syscall.c", "pyctl.c", "wrapped.def", "signals.c",
                "netif.c", "live.c", "build.c", "overrides.c", "pathmap.c",
            )],
            include_dirs=["shim_c"],
            extra_compile_args=[
                "-O2",
                "-fvisibility=hidden",
                "-ftls-model=initial-exec",
                "-fno-strict-aliasing",
                "-Wall",
                "-U_FORTIFY_SOURCE",
            ],
            libraries=["dl", "pthread"],
        )
    ],
)
