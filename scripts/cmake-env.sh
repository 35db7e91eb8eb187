# Sourced by the scripts that configure a build tree. Ninja when installed (install-deps.sh
# installs it): it compiles a program's files while the libraries it links are still being
# built, where make goes target by target and leaves cores idle. A tree keeps the generator it
# was first configured with; CMAKE_GENERATOR set by the caller wins.
if [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja >/dev/null 2>&1; then
  export CMAKE_GENERATOR=Ninja
fi
