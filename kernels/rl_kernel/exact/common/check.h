// RL_CHECK(cond, parts...): TORCH_CHECK with a message built here, without std::ostream.
//
// TORCH_CHECK formats its parts through c10::str, an ostringstream. Its integer insertion
// (basic_ostream::_M_insert<long>) gets instantiated inside this extension from the headers of
// the compiler that built it; where that libstdc++ differs from the one the process loaded (seen on
// the H200 machine: docs/benchmarks.md), the facet calls land in the wrong virtual and the error
// path crashes instead of raising. A message that is already a std::string goes through c10::str
// untouched, so the parts are appended here with std::to_string and friends.
#pragma once

#include <ATen/ATen.h>

#include <cstdio>
#include <string>
#include <type_traits>

namespace rl {

inline void append(std::string& s, const char* x) { s += x; }
inline void append(std::string& s, const std::string& x) { s += x; }
inline void append(std::string& s, char x) { s += x; }
inline void append(std::string& s, bool x) { s += x ? "1" : "0"; }  // as std::ostream prints a bool

template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void append(std::string& s, T x) {
  s += std::to_string(x);
}

inline void append(std::string& s, double x) {  // std::ostream's default: %g, 6 significant digits
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  s += buf;
}

inline void append(std::string& s, c10::IntArrayRef x) {  // c10's "[2, 3]"
  s += '[';
  for (size_t i = 0; i < x.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(x[i]);
  }
  s += ']';
}

inline void append(std::string& s, at::ScalarType x) { s += c10::toString(x); }
inline void append(std::string& s, const at::Device& x) { s += x.str(); }

template <class... Parts>
inline std::string message(const Parts&... parts) {
  std::string s;
  (append(s, parts), ...);
  return s;
}

}  // namespace rl

#define RL_CHECK(cond, ...) TORCH_CHECK(cond, ::rl::message(__VA_ARGS__))
