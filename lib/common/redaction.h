// Secrets kept out of dumps: what a dump records of the command line and the environment
// (process_info.h) passes through here first.
#pragma once

#include <string>
#include <vector>

namespace ncclwatch {

// What stands in for a value that must not reach a dump.
constexpr const char* kRedacted = "<redacted>";
// True for an argument or variable name that says its value is a secret (token, key, secret,
// password, credential, auth...), in any case and with any separators.
bool NameLooksSecret(const std::string& name);
// True for a value shaped like a well-known credential (hf_..., ghp_..., sk-..., AKIA...).
bool ValueLooksSecret(const std::string& value);
// Text with the secrets inside it replaced by kRedacted: credential-shaped tokens anywhere, the
// password of a URL or of user:password@host, a token as a URL's user, values of secret names in
// a query string (?access_token=v) or in JSON and Python dicts ({"hf_token": "v"}).
std::string RedactText(const std::string& s);
// argv with the values of secret-looking options (--x=v, --x:v, --x v, x=v) and the secrets
// RedactText finds in every other argument replaced by kRedacted.
std::vector<std::string> RedactCommandLine(const std::vector<std::string>& args);
// A variable's or option's value: kRedacted for a secret-looking name, else RedactText(value).
std::string RedactValue(const std::string& name, const std::string& value);

}  // namespace ncclwatch
