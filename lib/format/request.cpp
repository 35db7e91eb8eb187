#include "format/request.h"

#include <nlohmann/json.hpp>

#include "format/json_writer.h"
#include "ncclwatch/trace_format.h"

namespace ncclwatch {
namespace trace {

std::string WriteRequest(const DumpRequest& r) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Field(key::kRequest, r.request);
  w.Field(key::kOriginRank, r.origin_rank);
  w.Field(key::kOriginHost, r.origin_host);
  w.Field(key::kReason, r.reason);
  w.Field(key::kJobInstance, r.job_instance);
  w.Field(key::kTimeUnixNs, r.time_unix_ns);
  w.EndObject();
  return out + "\n";
}

bool ParseRequest(const std::string& text, DumpRequest* out) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto str = [&](const char* k) {
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto num = [&](const char* k, int64_t def) {
    auto it = j.find(k);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : def;
  };
  DumpRequest r;
  r.request = str(key::kRequest);
  int64_t origin = num(key::kOriginRank, -1);
  r.origin_rank = origin >= -1 && origin < (int64_t{1} << 31) ? static_cast<int>(origin) : -1;
  r.origin_host = str(key::kOriginHost);
  r.reason = str(key::kReason);
  r.job_instance = str(key::kJobInstance);
  r.time_unix_ns = num(key::kTimeUnixNs, 0);
  if (r.request.empty()) return false;
  *out = std::move(r);
  return true;
}

bool AskedByCommand(int origin_rank, const std::string& reason) {
  return origin_rank < 0 && reason == DumpReasonName(DumpReason::OnDemand);
}

}  // namespace trace
}  // namespace ncclwatch
