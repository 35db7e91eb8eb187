#include "common/redaction.h"

#include <cctype>
#include <cstring>

namespace ncclwatch {

bool NameLooksSecret(const std::string& name) {
  static const char* kSecretWords[] = {"token", "secret", "passw", "passphrase", "credential", "auth",
                                       "apikey", "api_key", "api-key", "key",   "cookie", "private",
                                       "signature", "session"};
  std::string lower;
  for (char c : name) lower += static_cast<char>(tolower(static_cast<unsigned char>(c)));
  // A tokenizer and a number of tokens (--tokenizer_path, max_new_tokens) are no secrets.
  for (const char* benign : {"tokeniz", "tokens"})
    for (size_t at; (at = lower.find(benign)) != std::string::npos;) lower.erase(at, strlen(benign));
  for (const char* w : kSecretWords)
    if (lower.find(w) != std::string::npos) return true;
  return false;
}

namespace {

const char* const kCredentialPrefixes[] = {"hf_", "ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_", "glpat-",
                                           "sk-", "xoxb-", "xoxp-", "AKIA", "ASIA", "AIza"};

bool TokenChar(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  return isalnum(u) || c == '_' || c == '-';
}

// Length of the credential-shaped token that starts at s[i] (a known prefix, then 16 or more token
// characters), 0 if none.
size_t CredentialAt(const std::string& s, size_t i) {
  for (const char* p : kCredentialPrefixes) {
    size_t n = strlen(p);
    if (s.compare(i, n, p) != 0) continue;
    size_t j = i + n;
    while (j < s.size() && TokenChar(s[j])) ++j;
    if (j - i >= n + 16) return j - i;
  }
  return 0;
}

// A bare token where a user name would be (redis://TOKEN@host): long, letters and digits mixed, no
// separators a person's name has. Short or all-letter names (alice, git, x-access-token) stay.
bool LooksLikeBareToken(const std::string& s) {
  if (s.size() < 16) return false;
  bool alpha = false, digit = false;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (!(isalnum(u) || c == '_' || c == '-' || c == '.' || c == '~' || c == '+' || c == '/' || c == '='))
      return false;
    alpha = alpha || isalpha(u);
    digit = digit || isdigit(u);
  }
  return alpha && digit;
}

bool AllDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The user information of an authority that starts at s[start] (after "scheme://", or a whole
// "user:password@host" argument): rewrites "user:password@" (the password may hold '/', '#', ':')
// and a bare token as the user ("TOKEN@"); returns the index just past what it consumed.
size_t RedactUserInfo(const std::string& s, size_t start, std::string& out) {
  size_t at = s.find('@', start);
  if (at == std::string::npos) return start;
  std::string userinfo = s.substr(start, at - start);
  if (userinfo.find_first_of(" \t\"'{}<>") != std::string::npos) return start;
  size_t colon = userinfo.find(':');
  if (colon == std::string::npos) {
    // No password: a user name, unless it is a token; a '/' first means '@' is in the path.
    if (userinfo.find_first_of("/?#") != std::string::npos) return start;
    if (!LooksLikeBareToken(userinfo)) return start;
    out += kRedacted;
    return at;
  }
  std::string user = userinfo.substr(0, colon), password = userinfo.substr(colon + 1);
  if (user.find_first_of("/?#") != std::string::npos) return start;
  // host:8080/path@x is a port and a path, not a password.
  size_t sep = password.find_first_of("/?#");
  if (AllDigits(password.substr(0, sep))) return start;
  if (s.compare(at + 1, 7, "sha256:") == 0) return start;  // image:tag@sha256:digest
  out += user + ":" + kRedacted;
  return at;
}

// "name": "value" (JSON, a Python dict) and name=value in a query string, for a secret name: the
// index of the value's first character past s[i], npos if s[i] does not end such a name.
size_t SecretValueAfterName(const std::string& s, size_t i) {
  char c = s[i];
  if (c == '=') {
    // A name is short: looking back a bounded way keeps a long argument with many '=' linear.
    size_t b = i;
    while (b > 0 && i - b < 64 && !strchr("?&;", s[b - 1])) --b;
    if (b == 0 || !strchr("?&;", s[b - 1]) || b == i) return std::string::npos;
    --b;
    std::string name = s.substr(b + 1, i - b - 1);
    if (name.find_first_of("/ ") != std::string::npos || !NameLooksSecret(name)) return std::string::npos;
    return i + 1;
  }
  if ((c == '"' || c == '\'') && i > 0) {
    size_t open = s.rfind(c, i - 1);
    if (open == std::string::npos || !NameLooksSecret(s.substr(open + 1, i - open - 1))) return std::string::npos;
    size_t j = i + 1;
    while (j < s.size() && s[j] == ' ') ++j;
    if (j >= s.size() || s[j] != ':') return std::string::npos;
    ++j;
    while (j < s.size() && s[j] == ' ') ++j;
    return j;
  }
  return std::string::npos;
}

}  // namespace

bool ValueLooksSecret(const std::string& value) {
  size_t n = CredentialAt(value, 0);
  return n > 0 && n == value.size();
}

std::string RedactText(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  // An argument that is itself "user:password@host" (scp, ssh, database strings).
  if (s.find("://") == std::string::npos && s.find(':') < s.find('@')) i = RedactUserInfo(s, 0, out);
  while (i < s.size()) {
    if (size_t n = (i == 0 || !TokenChar(s[i - 1])) ? CredentialAt(s, i) : 0) {
      out += kRedacted;
      i += n;
      continue;
    }
    if (s.compare(i, 3, "://") == 0) {
      out += "://";
      i = RedactUserInfo(s, i + 3, out);
      continue;
    }
    size_t v = SecretValueAfterName(s, i);
    if (v == std::string::npos) {
      out += s[i++];
      continue;
    }
    bool quoted = v < s.size() && (s[v] == '"' || s[v] == '\'');
    size_t end = quoted ? s.find(s[v], v + 1) : s.find_first_of(s[i] == '=' ? "&#;" : ",}", v);
    out.append(s, i, v - i + (quoted ? 1 : 0));
    out += kRedacted;
    i = end == std::string::npos ? s.size() : end;
  }
  return out;
}

std::string RedactValue(const std::string& name, const std::string& value) {
  if (NameLooksSecret(name)) return kRedacted;
  return RedactText(value);
}

std::vector<std::string> RedactCommandLine(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool next_is_secret = false;  // "--hf_token abc": the value follows its option
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (next_is_secret && a.compare(0, 2, "--") != 0) {
      out.push_back(kRedacted);
      next_is_secret = false;
      continue;
    }
    next_is_secret = false;
    // --x=v, -x=v, x=v (overrides like a.b.token=v); an option also as --x:v.
    size_t eq = a.find_first_of(a[0] == '-' ? "=:" : "=");
    if (i > 0 && eq != std::string::npos && eq > 0 && a.find_first_of("/@{\"'", 0) > eq) {
      std::string name = a.substr(0, eq);
      out.push_back(name + a[eq] + RedactValue(name, a.substr(eq + 1)));
      continue;
    }
    if (i > 0 && a.size() > 1 && a[0] == '-' && NameLooksSecret(a)) next_is_secret = true;
    out.push_back(i > 0 ? RedactText(a) : a);
  }
  return out;
}

}  // namespace ncclwatch
