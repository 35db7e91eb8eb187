// Boxed<T>: an optional record kept on the heap. A summary holds several optional records that
// most dumps leave empty (the failed call, the answered request, the exception, ...); held inline
// as std::optional they made every summary 1.3 KB, read 131,072 times by one analysis.
#pragma once

#include <memory>
#include <optional>
#include <utility>

namespace ncclwatch {
namespace trace {

template <typename T>
class Boxed {
 public:
  Boxed() = default;
  Boxed(std::nullopt_t) {}
  Boxed(const T& v) : p_(std::make_unique<T>(v)) {}
  Boxed(T&& v) : p_(std::make_unique<T>(std::move(v))) {}
  Boxed(const std::optional<T>& o) : p_(o ? std::make_unique<T>(*o) : nullptr) {}
  Boxed(std::optional<T>&& o) : p_(o ? std::make_unique<T>(std::move(*o)) : nullptr) {}
  Boxed(const Boxed& o) : p_(o.p_ ? std::make_unique<T>(*o.p_) : nullptr) {}
  Boxed(Boxed&&) noexcept = default;
  Boxed& operator=(const Boxed& o) {
    if (this != &o) p_ = o.p_ ? std::make_unique<T>(*o.p_) : nullptr;
    return *this;
  }
  Boxed& operator=(Boxed&&) noexcept = default;
  Boxed& operator=(std::nullopt_t) {
    p_.reset();
    return *this;
  }
  Boxed& operator=(const T& v) { return *this = Boxed(v); }
  Boxed& operator=(T&& v) { return *this = Boxed(std::move(v)); }
  Boxed& operator=(const std::optional<T>& o) { return *this = Boxed(o); }
  Boxed& operator=(std::optional<T>&& o) { return *this = Boxed(std::move(o)); }

  template <typename... Args>
  T& emplace(Args&&... args) {
    p_ = std::make_unique<T>(std::forward<Args>(args)...);
    return *p_;
  }
  void reset() { p_.reset(); }

  operator std::optional<T>() const { return p_ ? std::optional<T>(*p_) : std::nullopt; }

  bool has_value() const { return p_ != nullptr; }
  explicit operator bool() const { return p_ != nullptr; }
  T& operator*() { return *p_; }
  const T& operator*() const { return *p_; }
  T* operator->() { return p_.get(); }
  const T* operator->() const { return p_.get(); }
  const T& value() const { return *p_; }
  T& value() { return *p_; }
  template <typename U>
  T value_or(U&& fallback) const {
    return p_ ? *p_ : static_cast<T>(std::forward<U>(fallback));
  }

  friend bool operator==(const Boxed& a, const Boxed& b) {
    return a.p_ && b.p_ ? *a.p_ == *b.p_ : a.p_ == b.p_;
  }
  friend bool operator!=(const Boxed& a, const Boxed& b) { return !(a == b); }

 private:
  std::unique_ptr<T> p_;
};

}  // namespace trace
}  // namespace ncclwatch
