"""The qkv package's extension, built by CMake: pyproject.toml holds the package's metadata."""
import os
import pathlib
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures qkv for this interpreter and builds the qkv_python target (the library with it)."""

    def build_extension(self, ext):
        target = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        f"-DPython_EXECUTABLE={sys.executable}", "-DQKV_BUILD_TESTS=OFF", "-DQKV_BUILD_PROGRAMS=OFF"],
                       check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "qkv_python", "-j", jobs], check=True)
        built = next((build / "python" / "qkv").glob("_qkv*.so"), None)
        if built is None:
            sys.exit("qkv: CMake did not build the Python extension: it needs pybind11 and Python's headers "
                     "(scripts/install-deps --test installs them)")
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built), str(target))


# Out of the source tree's build/ (CMake's): setuptools' own files go to build-pip/.
(ROOT / "build-pip").mkdir(exist_ok=True)
setup(version=(ROOT / "VERSION").read_text().strip(), ext_modules=[CMakeExtension("qkv._qkv")],
      cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}})
