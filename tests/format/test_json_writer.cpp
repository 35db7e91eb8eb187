// The streaming JSON writer: valid JSON whatever the bytes, numbers that read back equal.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "format/file_name.h"
#include "format/json_writer.h"
#include "format/request.h"

using namespace ncclwatch::trace;
using nlohmann::json;

TEST_CASE("strings are escaped and bytes that are not UTF-8 become U+FFFD") {
  std::string out;
  JsonWriter w(&out);
  w.BeginArray();
  w.String("quote \" backslash \\ newline \n tab \t bell \x07");
  w.String("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");  // valid 2-, 3- and 4-byte sequences
  w.String("eth\xff\xfe");                                  // invalid bytes
  w.String(std::string("nul\0inside", 10));
  w.String("\xc0\xaf \xed\xa0\x80 \xe2\x82");  // overlong, surrogate, cut sequence
  w.EndArray();
  json j = json::parse(out);  // throws on invalid JSON or invalid UTF-8
  CHECK(j[0] == "quote \" backslash \\ newline \n tab \t bell \x07");
  CHECK(j[1] == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(j[2] == "eth\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(j[3] == std::string("nul\0inside", 10));
  CHECK(j[4].get<std::string>().find("\xef\xbf\xbd") != std::string::npos);
}

TEST_CASE("random bytes always give valid JSON") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    std::string out;
    JsonWriter w(&out);
    w.BeginObject();
    w.Field(s, s);
    w.EndObject();
    INFO("case " << i);
    CHECK_NOTHROW(json::parse(out));
  }
}

TEST_CASE("numbers read back equal, non-finite doubles as null") {
  std::string out;
  JsonWriter w(&out);
  w.BeginArray();
  w.Int(std::numeric_limits<int64_t>::min());
  w.Uint(std::numeric_limits<uint64_t>::max());
  w.Double(0.1);
  w.Double(12.5);
  w.Double(1e-300);
  w.Double(600);
  w.Double(std::nan(""));
  w.Double(std::numeric_limits<double>::infinity());
  w.Hex(0x7f3b5c001000);
  w.Bool(false);
  w.Null();
  w.EndArray();
  json j = json::parse(out);
  CHECK(j[0].get<int64_t>() == std::numeric_limits<int64_t>::min());
  CHECK(j[1].get<uint64_t>() == std::numeric_limits<uint64_t>::max());
  CHECK(j[2].get<double>() == 0.1);
  CHECK(j[3].get<double>() == 12.5);
  CHECK(j[4].get<double>() == 1e-300);
  CHECK(j[5].is_number_float());  // a double is written as one even when whole ("600.0")
  CHECK(j[5].get<double>() == 600);
  CHECK(j[6].is_null());
  CHECK(j[7].is_null());
  CHECK(j[8] == "0x7f3b5c001000");
  CHECK(j[9] == false);
  CHECK(j[10].is_null());
}

TEST_CASE("commas and keys in nested containers") {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("a").BeginArray();
  w.BeginObject();
  w.EndObject();
  w.BeginArray();
  w.EndArray();
  w.Int(1);
  w.EndArray();
  w.Key("b").BeginObject();
  w.Field("c", "d");
  w.Field("e", 2.5);
  w.EndObject();
  w.Field("f", true);
  w.EndObject();
  CHECK(out == R"({"a":[{},[],1],"b":{"c":"d","e":2.5},"f":true})");
}

TEST_CASE("dump file names: one rule for writer and readers") {
  CHECK(DumpFileName(3, "node-1.cluster", 77, 0, "stall") == "rank00003-node_1.cluster-77-0-stall.json");
  CHECK(DumpFileStem(-1, "h", 1, 2, "peer_request") == "rankx-h-1-2-peer_request");
  CHECK(DumpFileName(123456, "a/b", 5, 1, "x/y") == "rank123456-a_b-5-1-x_y.json");
  CHECK(IsDumpFileName(DumpFileName(3, "h", 1, 0, "stall")));
  CHECK_FALSE(IsDumpFileName(kDumpRequestFile));
  CHECK_FALSE(IsDumpFileName("scenario-truth.json"));
  CHECK_FALSE(IsDumpFileName("rank00001-h-1-0-stall.json.tmp"));
  CHECK(RankFromFileName(DumpFileName(42, "host", 1, 0, "stall")) == 42);
  CHECK(RankFromFileName(DumpFileName(-1, "host", 1, 0, "stall")) == -1);
  CHECK(RankFromFileName("rank-host.json") == -1);
  CHECK(RankFromFileName("other.json") == -1);
}

TEST_CASE("the job-wide dump request round-trips, and foreign text is not a request") {
  DumpRequest r{"node1-77-3", 5, "node1", "stall", "torchelastic:abc:1", 1700000000123456789};
  DumpRequest back;
  REQUIRE(ParseRequest(WriteRequest(r), &back));
  CHECK(back.request == r.request);
  CHECK(back.origin_rank == 5);
  CHECK(back.origin_host == "node1");
  CHECK(back.reason == "stall");
  CHECK(back.job_instance == r.job_instance);
  CHECK(back.time_unix_ns == r.time_unix_ns);
  CHECK_FALSE(ParseRequest("{\"request\": \"\"}", &back));
  CHECK_FALSE(ParseRequest("{\"reque", &back));
  CHECK_FALSE(ParseRequest("[1]", &back));
  // An older writer's request (no instance, no time) still reads.
  REQUIRE(ParseRequest("{\"request\":\"h-1-0\",\"origin_rank\":2,\"origin_host\":\"h\",\"reason\":\"abort\"}", &back));
  CHECK(back.job_instance.empty());
  CHECK(back.time_unix_ns == 0);
}
