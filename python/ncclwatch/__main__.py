"""`python -m ncclwatch ...` and the `ncclwatch` script pip puts on the environment's PATH: both
become the wheel's own `ncclwatch` command, which preloads the wheel's own libncclwatch.so."""
import os
import sys

from . import command_path


def main() -> None:
    """Replaces this Python with the command: its output, signals and exit status are the
    command's own, as if it had been started directly."""
    path = command_path()
    os.execv(path, ["ncclwatch"] + sys.argv[1:])


if __name__ == "__main__":
    main()
