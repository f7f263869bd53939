"""Build libchorus.so with the source tree's CMake and put it into the package.

CHORUS_LIB=/path/libchorus.so uses an already built library instead; CHORUS_CMAKE_ARGS adds
CMake options (the default builds without CUDA and without tests, which takes about a minute).
"""
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class BuildWithChorus(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "chorus_torch", "lib")
        os.makedirs(dest, exist_ok=True)
        lib = os.environ.get("CHORUS_LIB")
        if not lib:
            if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
                raise RuntimeError("chorus_torch: build from the Chorus source tree "
                                   "(pip install ./python) or set CHORUS_LIB")
            bdir = os.path.abspath(os.path.join(HERE, "build", "chorus-cmake"))
            args = ["-DCHORUS_TESTS=OFF", "-DCHORUS_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release"]
            args += shlex.split(os.environ.get("CHORUS_CMAKE_ARGS", ""))
            subprocess.check_call(["cmake", "-S", ROOT, "-B", bdir] + args)
            subprocess.check_call(["cmake", "--build", bdir, "--target", "chorus", "-j",
                                   str(os.cpu_count() or 2)])
            lib = os.path.join(bdir, "lib", "libchorus.so")
        real = os.path.realpath(lib)
        shutil.copyfile(real, os.path.join(dest, "libchorus.so"))


setup(cmdclass={"build_py": BuildWithChorus}, package_data={"chorus_torch": ["lib/*.so"]})
