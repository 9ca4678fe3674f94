"""Builds dropit's Python package: the `dropit._C` extension (pybind11 through PyTorch's own
extension headers, C++20) over the header-only C++ library in ../include.

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation ./python

`--no-build-isolation` builds against the PyTorch and setuptools already installed (Debian's
python3-torch and python3-setuptools): no package index is needed.
"""
import os
import pathlib

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = pathlib.Path(__file__).resolve().parent
include = here.parent / "include"
if not (include / "dropit" / "dropit.hpp").is_file():
    raise SystemExit(f"dropit: the C++ headers are not at {include}; build from a dropit checkout")

include_dirs = [str(include)]
# The CUDA toolkit's headers give the half types (float16, bfloat16 packs); optional.
cuda_include = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
if (cuda_include / "cuda_bf16.h").is_file():
    include_dirs.append(str(cuda_include))

setup(
    name="dropit",
    version="0.1.0",
    description="DropIT's sparse saved tensors for PyTorch, through saved_tensors_hooks",
    packages=["dropit"],
    python_requires=">=3.9",
    ext_modules=[
        CppExtension(
            "dropit._C",
            ["src/bindings.cpp"],
            include_dirs=include_dirs,
            extra_compile_args={"cxx": ["-std=c++20", "-O3", "-fopenmp", "-Wno-deprecated-declarations"]},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    zip_safe=False,
)
