#include "common/config.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include <algorithm>
#include <sstream>

#include "format/display.h"

namespace ncclwatch {
namespace {

constexpr double kMaxMultiplier = 1e4;

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

bool ParseBool(const std::string& t, bool* out, std::string* err) {
  static const char* kTrue[] = {"1", "true", "yes", "on"};
  static const char* kFalse[] = {"0", "false", "no", "off"};
  for (const char* v : kTrue)
    if (strcasecmp(t.c_str(), v) == 0) return *out = true, true;
  for (const char* v : kFalse)
    if (strcasecmp(t.c_str(), v) == 0) return *out = false, true;
  *err = "expected 1/0, true/false, yes/no or on/off";
  return false;
}

bool ParseCount(const std::string& t, uint64_t* out, std::string* err) {
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) {
    *err = "expected a whole number";
    return false;
  }
  errno = 0;
  unsigned long long v = strtoull(t.c_str(), nullptr, 10);
  if (errno != 0 || v > (1ull << 40)) {
    *err = "number out of range";
    return false;
  }
  *out = v;
  return true;
}

// A decimal number from 0 to `max`; else `what` as the error. Decimal as counts are: strtod
// alone would also take 0x10, inf and nan.
bool ParseBoundedNumber(const std::string& t, double max, const char* what, double* out, std::string* err) {
  char* end = nullptr;
  errno = 0;
  double v = strtod(t.c_str(), &end);
  if (t.empty() || t.find_first_not_of("0123456789.eE+-") != std::string::npos || errno != 0 || end == t.c_str() ||
      *end != '\0' || !(v >= 0) || v > max) {
    *err = what;
    return false;
  }
  *out = v;
  return true;
}

bool ParseSeconds(const std::string& t, double* out, std::string* err) {
  return ParseBoundedNumber(t, kMaxSettingSeconds, "expected a number of seconds from 0 to 10000000", out, err);
}

bool ParseMultiplier(const std::string& t, double* out, std::string* err) {
  return ParseBoundedNumber(t, kMaxMultiplier, "expected a multiplier from 0 (off) to 10000", out, err);
}

bool ParseString(const std::string& t, std::string* out, std::string* err) {
  if (t.empty()) {
    *err = "empty";
    return false;
  }
  *out = t;
  return true;
}

bool ParseLevel(const std::string& t, LogLevel* out, std::string* err) {
  static const std::pair<const char*, LogLevel> kLevels[] = {
      {"quiet", LogLevel::kQuiet}, {"warn", LogLevel::kWarn}, {"info", LogLevel::kInfo},
      {"debug", LogLevel::kDebug}, {"0", LogLevel::kQuiet},   {"1", LogLevel::kWarn},
      {"2", LogLevel::kInfo},      {"3", LogLevel::kDebug}};
  for (auto& l : kLevels)
    if (strcasecmp(t.c_str(), l.first) == 0) return *out = l.second, true;
  *err = "expected quiet, warn, info or debug";
  return false;
}

bool ParseSignalSetting(const std::string& t, int* out, std::string* err) {
  if (!ParseSignal(t, out, err)) return false;
  *err = SignalNotTakenOver(*out);
  return err->empty();
}

}  // namespace

int DefaultSignal(const char* text) {
  int s = 0;
  std::string ignored;
  ParseSignal(text, &s, &ignored);
  return s;
}

LogLevel DefaultLevel(const char* text) {
  LogLevel l = LogLevel::kWarn;
  std::string ignored;
  ParseLevel(text, &l, &ignored);
  return l;
}

bool ParseSignal(const std::string& text, int* signo, std::string* error) {
  std::string t = Trim(text);
  if (strcasecmp(t.c_str(), "none") == 0 || t == "0") return *signo = 0, true;
  if (!t.empty() && t.find_first_not_of("0123456789") == std::string::npos) {
    int v = atoi(t.c_str());
    if (v > 0 && v < NSIG) return *signo = v, true;
    *error = "signal number out of range";
    return false;
  }
  std::string name = t;
  if (strncasecmp(name.c_str(), "SIG", 3) == 0) name = name.substr(3);
  // Real-time signals: RTMIN+n / RTMAX-n.
  if (strncasecmp(name.c_str(), "RTMIN", 5) == 0 || strncasecmp(name.c_str(), "RTMAX", 5) == 0) {
    bool min = strncasecmp(name.c_str(), "RTMIN", 5) == 0;
    int off = 0;
    std::string rest = name.substr(5);
    if (!rest.empty()) {
      if ((min && rest[0] != '+') || (!min && rest[0] != '-') ||
          rest.find_first_not_of("0123456789", 1) != std::string::npos || rest.size() < 2) {
        *error = "expected RTMIN+n or RTMAX-n";
        return false;
      }
      off = atoi(rest.c_str() + 1);
    }
    int v = min ? SIGRTMIN + off : SIGRTMAX - off;
    if (v < SIGRTMIN || v > SIGRTMAX) {
      *error = "real-time signal out of range";
      return false;
    }
    return *signo = v, true;
  }
  for (int s = 1; s < SIGRTMIN; ++s) {
    const char* abbrev = sigabbrev_np(s);
    if (abbrev && strcasecmp(name.c_str(), abbrev) == 0) return *signo = s, true;
  }
  *error = "unknown signal (use a name like SIGUSR2, RTMIN+5, a number, or none)";
  return false;
}

std::string SignalNotTakenOver(int signo) {
  // The kernel's first real-time signals below SIGRTMIN: the C library's threads use them
  // (cancellation, set*id); a handler cannot be installed there.
  if (signo >= 32 && signo < SIGRTMIN)
    return std::to_string(signo) + " is reserved by the C library's threads and cannot be taken over (use SIGUSR1, "
           "SIGUSR2 or RTMIN+n)";
  // Their meaning belongs to the launcher, the terminal, the kernel or the C library: taking
  // one over would stop a job from ending (SIGTERM) or hide a crash (SIGSEGV).
  static const int kKeepTheirMeaning[] = {SIGTERM, SIGINT,  SIGHUP,  SIGQUIT, SIGKILL, SIGSTOP,
                                          SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT, SIGSEGV, SIGBUS,
                                          SIGILL,  SIGFPE,  SIGABRT, SIGTRAP, SIGSYS,  SIGCHLD,
                                          SIGPIPE, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ};
  for (int s : kKeepTheirMeaning)
    if (s == signo)
      return SignalName(signo) +
             " ends, stops or reports on the process and is never taken over (use SIGUSR1, SIGUSR2 or RTMIN+n)";
  return "";
}

std::string SignalName(int signo) {
  if (signo == 0) return "none";
  if (signo >= SIGRTMIN && signo <= SIGRTMAX) return "SIGRTMIN+" + std::to_string(signo - SIGRTMIN);
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : std::to_string(signo);
}

bool ParseDeadlineSpec(const std::string& text, DeadlineSpec* out, std::string* error) {
  DeadlineSpec spec;
  std::string t = Trim(text);
  double plain = 0;
  std::string ignored;
  if (t.find('=') == std::string::npos) {
    if (!ParseSeconds(t, &plain, error) || plain <= 0) {
      *error = "expected seconds above 0 and at most 10000000, or a list like AllGather=120,Send=600,default=300";
      return false;
    }
    spec.default_s = plain;
    *out = spec;
    return true;
  }
  std::stringstream ss(t);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = Trim(item);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      *error = "'" + item + "' is not Op=SECONDS";
      return false;
    }
    std::string name = Trim(item.substr(0, eq));
    double v = 0;
    std::string verr;
    if (!ParseSeconds(Trim(item.substr(eq + 1)), &v, &verr) || v <= 0) {
      *error = "'" + item + "': expected seconds above 0 and at most 10000000";
      return false;
    }
    if (strcasecmp(name.c_str(), "default") == 0) {
      spec.default_s = v;
      continue;
    }
    bool found = false;
    for (int k = 0; k < static_cast<int>(trace::OpKind::Count); ++k) {
      if (strcasecmp(name.c_str(), trace::kOpKindNames[k]) == 0) {
        spec.per_op_s[k] = v;
        found = true;
      }
    }
    if (!found) {
      std::string known;
      for (const char* n : trace::kOpKindNames) known += std::string(known.empty() ? "" : ", ") + n;
      *error = "unknown operation '" + name + "' (known: " + known + ", default)";
      return false;
    }
  }
  *out = spec;
  return true;
}

namespace {

// NCCLWATCH_ variables that belong to ncclwatch's other parts (the command, its simulator, its
// tests and packaging), not to the library's settings: never called unknown.
bool OwnedElsewhere(const std::string& name) {
  for (const char* prefix : {"NCCLWATCH_SIM_", "NCCLWATCH_TEST_", "NCCLWATCH_WHEEL_"})
    if (name.compare(0, strlen(prefix), prefix) == 0) return true;
  return name == "NCCLWATCH_LIB";
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// One line per NCCLWATCH_ variable that is no setting: a misspelt one is otherwise ignored
// without a word and its default silently used.
void ReportUnknownVariables(const char* const* envp, std::vector<std::string>* errors) {
  std::vector<std::string> known = {"NCCLWATCH_TIMEOUT"};
  for (const auto& kv : DescribeConfig(Config{})) known.push_back(kv.first);
  for (const char* const* e = envp; e && *e; ++e) {
    const char* eq = strchr(*e, '=');
    std::string name(*e, eq ? static_cast<size_t>(eq - *e) : strlen(*e));
    if (name.compare(0, 10, "NCCLWATCH_") != 0 || OwnedElsewhere(name) ||
        std::find(known.begin(), known.end(), name) != known.end())
      continue;
    const std::string* best = nullptr;
    size_t best_distance = 4;  // further than 3 edits is no misspelling
    for (const auto& k : known) {
      size_t d = EditDistance(name, k);
      if (d < best_distance) best = &k, best_distance = d;
    }
    errors->push_back("unknown variable " + trace::PrintableCut(name) +
                      (best ? ", did you mean " + *best + "?" : " (the settings: README, Configuration)"));
  }
}

}  // namespace

ConfigResult ParseConfig(EnvLookup getenv_fn, const char* const* envp) {
  ConfigResult r;
  Config& c = r.config;
  // The value escaped and cut: a newline or escape in it, or its length, must not break the line.
  auto report = [&](const char* var, const std::string& value, const std::string& problem,
                    const std::string& dflt) {
    r.errors.push_back(std::string(var) + "='" + trace::PrintableCut(value) + "': " + problem +
                       "; using the default (" + trace::PrintableCut(dflt) + ")");
  };
  auto describe_default = [&](const char* var) {
    for (auto& kv : DescribeConfig(Config{}))
      if (kv.first == var) return kv.second.empty() ? std::string("unset") : kv.second;
    return std::string("?");
  };
#define NCCLWATCH_PARSE_SETTING(field, env, kind, def, help)                          \
  if (const char* raw = getenv_fn("NCCLWATCH_" #env)) {                                \
    std::string value = Trim(raw), err;                                               \
    decltype(c.field) parsed{};                                                       \
    if (Parse##kind##Setting(value, &parsed, &err))                                   \
      c.field = parsed;                                                               \
    else                                                                              \
      report("NCCLWATCH_" #env, raw, err, describe_default("NCCLWATCH_" #env));        \
  }
#define ParseBoolSetting ParseBool
#define ParseStringSetting ParseString
#define ParseCountSetting ParseCount
#define ParseSecondsSetting ParseSeconds
#define ParseMultiplierSetting ParseMultiplier
#define ParseLevelSetting ParseLevel
  NCCLWATCH_FOR_EACH_SETTING(NCCLWATCH_PARSE_SETTING)
#undef ParseBoolSetting
#undef ParseStringSetting
#undef ParseCountSetting
#undef ParseSecondsSetting
#undef ParseMultiplierSetting
#undef ParseLevelSetting
#undef NCCLWATCH_PARSE_SETTING

  if (const char* raw = getenv_fn("NCCLWATCH_TIMEOUT")) {
    std::string err;
    if (!ParseDeadlineSpec(raw, &c.timeout, &err)) report("NCCLWATCH_TIMEOUT", raw, err, "60");
  }
  // Range checks that the per-kind parsers cannot know.
  auto clamp = [&](const char* var, uint64_t* v, uint64_t lo, uint64_t hi, uint64_t dflt) {
    if (*v < lo || *v > hi) {
      report(var, std::to_string(*v),
             "must be between " + std::to_string(lo) + " and " + std::to_string(hi),
             std::to_string(dflt));
      *v = dflt;
    }
  };
  Config d;
  clamp("NCCLWATCH_RING", &c.ring, 16, 1u << 24, d.ring);
  clamp("NCCLWATCH_POLL_MS", &c.poll_ms, 1, 60000, d.poll_ms);
  clamp("NCCLWATCH_PEER_POLL_MS", &c.peer_poll_ms, 10, 600000, d.peer_poll_ms);
  clamp("NCCLWATCH_CALLSITE_DEPTH", &c.callsite_depth, 1, 64, d.callsite_depth);
  clamp("NCCLWATCH_MAX_DUMPS", &c.max_dumps, 1, 100000, d.max_dumps);
  clamp("NCCLWATCH_SIGNAL_WAIT_MS", &c.signal_wait_ms, 0, 600000, d.signal_wait_ms);
  clamp("NCCLWATCH_STORE_MAX_KB", &c.store_max_kb, 1, 8192, d.store_max_kb);  // a value is at most 8 MiB
  if (c.store != "auto" && c.store != "on" && c.store != "off") {
    report("NCCLWATCH_STORE", c.store, "must be auto, on or off", "auto");
    c.store = "auto";
  }
  // Rounded to a power of two so the ring index is a mask.
  uint64_t p = 1;
  while (p < c.ring) p <<= 1;
  c.ring = p;
  // Stack sampling needs its signal; the on-demand dump gives way, to its default if that is
  // free, else to none. One line, naming the setting that changes.
  if (c.dump_signal != 0 && c.dump_signal == c.stack_signal) {
    int fallback = d.dump_signal != c.stack_signal ? d.dump_signal : 0;
    report("NCCLWATCH_DUMP_SIGNAL", SignalName(c.dump_signal),
           "is the signal ncclwatch samples stacks with (NCCLWATCH_STACK_SIGNAL)", SignalName(fallback));
    c.dump_signal = fallback;
  }
  if (c.stacks && c.stack_signal == 0)
    r.errors.push_back("NCCLWATCH_STACK_SIGNAL='none': no signal to sample threads with, so dumps have no "
                       "thread's native stack (NCCLWATCH_STACKS=0 says so without this line)");
  ReportUnknownVariables(envp, &r.errors);
  return r;
}

std::vector<std::pair<std::string, std::string>> DescribeConfig(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  auto fmt = [](const auto& v) {
    using T = std::decay_t<decltype(v)>;
    std::ostringstream os;
    if constexpr (std::is_same_v<T, bool>)
      os << (v ? "1" : "0");
    else if constexpr (std::is_same_v<T, LogLevel>) {
      static const char* kNames[] = {"quiet", "warn", "info", "debug"};
      os << kNames[static_cast<int>(v)];
    } else
      os << v;
    return os.str();
  };
#define NCCLWATCH_DESCRIBE_SETTING(field, env, kind, def, help) \
  out.emplace_back("NCCLWATCH_" #env, NCCLWATCH_DESCRIBE_##kind(c.field));
#define NCCLWATCH_DESCRIBE_Bool(v) fmt(v)
#define NCCLWATCH_DESCRIBE_String(v) fmt(v)
#define NCCLWATCH_DESCRIBE_Count(v) fmt(v)
#define NCCLWATCH_DESCRIBE_Seconds(v) fmt(v)
#define NCCLWATCH_DESCRIBE_Multiplier(v) fmt(v)
#define NCCLWATCH_DESCRIBE_Level(v) fmt(v)
#define NCCLWATCH_DESCRIBE_Signal(v) SignalName(v)
  NCCLWATCH_FOR_EACH_SETTING(NCCLWATCH_DESCRIBE_SETTING)
#undef NCCLWATCH_DESCRIBE_SETTING
  std::ostringstream t;
  t << "default=" << c.timeout.default_s;
  for (int k = 0; k < static_cast<int>(trace::OpKind::Count); ++k)
    if (c.timeout.per_op_s[k] > 0) t << "," << trace::kOpKindNames[k] << "=" << c.timeout.per_op_s[k];
  out.emplace_back("NCCLWATCH_TIMEOUT", t.str());
  return out;
}

}  // namespace ncclwatch
