"""The frame walker's row for this interpreter's CPython version (kLayouts in
lib/stacks/python_frames.cpp) is what scripts/gen-python-layout.sh computes from the version's
own headers, to the character. Run by ctest with each python3 the stacks tests use; skipped
where that python3's headers are not installed.
"""
import os
import re
import subprocess
import sys
import sysconfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import SKIP  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TABLE = os.path.join(ROOT, "lib", "stacks", "python_frames.cpp")
GENERATOR = os.path.join(ROOT, "scripts", "gen-python-layout.sh")

version = "%d.%d" % sys.version_info[:2]
if sys.version_info < (3, 9):
    print(f"Python {version}: the frame walker reads 3.9 and later only, test skipped")
    sys.exit(SKIP)
include = sysconfig.get_paths()["include"]
if not os.path.isfile(os.path.join(include, "Python.h")):
    print(f"no headers of Python {version} in {include} (Debian: python{version}-dev): "
          "its frame layout is not checked, test skipped")
    sys.exit(SKIP)


def checked_in_row(minor):
    """The table's row for 3.<minor>: its lines from '{.minor = <minor>,' to the one ending '},'."""
    with open(TABLE) as source:
        lines = source.read().splitlines()
    for start, line in enumerate(lines):
        if line.lstrip().startswith("{.minor = %d," % minor):
            for end in range(start, len(lines)):
                if lines[end].endswith("},"):
                    return lines[start:end + 1]
    return None


def fields(lines):
    return dict(re.findall(r"\.(\w+) = ([-\w]+)", "\n".join(lines)))


generated = subprocess.run([GENERATOR, sys.executable], check=True, stdout=subprocess.PIPE,
                           universal_newlines=True).stdout.splitlines()
row = checked_in_row(sys.version_info[1])
if row is None:
    print(f"FAIL: kLayouts has no row for Python {version}; scripts/gen-python-layout.sh "
          f"{sys.executable} prints it:\n" + "\n".join(generated))
    sys.exit(1)
if row != generated:
    print(f"FAIL: kLayouts' row for Python {version} ({sys.version.split()[0]}) is not what its "
          f"headers in {include} give.\nchecked in:\n" + "\n".join(row) + "\ngenerated:\n" + "\n".join(generated))
    have, want = fields(row), fields(generated)
    for name in sorted(set(have) | set(want)):
        if have.get(name) != want.get(name):
            print(f"  {name}: checked in {have.get(name)}, generated {want.get(name)}")
    sys.exit(1)
print(f"PASS: kLayouts' row for Python {version} ({sys.version.split()[0]}, headers in {include}) "
      "is the generated one:\n" + "\n".join(row))
