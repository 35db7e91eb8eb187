"""The wheel's tag says what its binaries need, not the Python that built it: py3-none-<platform>,
the platform (manylinux_2_34_x86_64) given by scripts/build-wheel.sh, which reads it off the
binaries."""
import os

from setuptools import Distribution, setup
from wheel.bdist_wheel import bdist_wheel


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # it holds ELF files: installed into platlib, an impure wheel


class BinaryWheel(bdist_wheel):
    def get_tag(self):
        return "py3", "none", os.environ["NCCLWATCH_WHEEL_PLATFORM"]


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": BinaryWheel})
