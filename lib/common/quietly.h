// Our work never throws into the application: an allocation that fails (std::bad_alloc under a
// memory limit) or any other exception of ours ends that piece of work only. The operation or
// record goes without ncclwatch, and one line says so (the first time).
#pragma once

namespace ncclwatch {

// "ncclwatch: out of memory (or an internal error) in <what>: ... unmonitored", once per process.
void SayUnmonitored(const char* what) noexcept;

template <typename F>
bool Quietly(const char* what, F&& f) noexcept {
  try {
    f();
    return true;
  } catch (...) {
    SayUnmonitored(what);
    return false;
  }
}

}  // namespace ncclwatch
