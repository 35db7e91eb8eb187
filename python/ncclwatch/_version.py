# The sources say "unknown"; scripts/build-wheel.sh writes the version of project() in CMakeLists.txt.
__version__ = "0+unknown"
