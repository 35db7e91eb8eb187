// Terminal styling: ANSI colour only when asked for (a terminal, no --no-color, no NO_COLOR).
#pragma once

#include <string>

namespace ncclwatch {
namespace analysis {

class Style {
 public:
  Style() = default;
  explicit Style(bool color) : color_(color) {}
  std::string Bold(const std::string& s) const { return Wrap("1", s); }
  std::string Dim(const std::string& s) const { return Wrap("2", s); }
  std::string Red(const std::string& s) const { return Wrap("1;31", s); }
  std::string Yellow(const std::string& s) const { return Wrap("33", s); }
  std::string Green(const std::string& s) const { return Wrap("32", s); }
  std::string Cyan(const std::string& s) const { return Wrap("36", s); }
  bool color() const { return color_; }

  // Colour for stdout: a terminal, and neither --no-color nor NO_COLOR (https://no-color.org).
  static bool ColorWanted(bool no_color_flag);

 private:
  std::string Wrap(const char* code, const std::string& s) const {
    return color_ ? "\033[" + std::string(code) + "m" + s + "\033[0m" : s;
  }
  bool color_ = false;
};

}  // namespace analysis
}  // namespace ncclwatch
