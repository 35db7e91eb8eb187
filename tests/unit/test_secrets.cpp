#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "common/process_info.h"
#include "common/redaction.h"

using namespace ncclwatch;

TEST_CASE("secret-looking names are recognised in any case and spelling") {
  for (const char* n : {"--hf_token", "HF_TOKEN", "--api-key", "WANDB_API_KEY", "--password", "db.passwd",
                        "AWS_SECRET_ACCESS_KEY", "--credentials", "--auth", "GITHUB_PAT_TOKEN", "--Session-Cookie"})
    CHECK(NameLooksSecret(n));
  for (const char* n : {"--lr", "--batch_size", "NCCL_DEBUG", "RANK", "--model", "--output_dir", "--tokenizer_path",
                        "max_new_tokens"})
    CHECK_FALSE(NameLooksSecret(n));
}

TEST_CASE("credential-shaped values are recognised whatever their name") {
  CHECK(ValueLooksSecret("hf_abcdefghijklmnopqrstuvwxyz0123"));
  CHECK(ValueLooksSecret("ghp_0123456789abcdefghij0123"));
  CHECK(ValueLooksSecret("sk-proj-0123456789abcdefABCD"));
  CHECK(ValueLooksSecret("AKIAIOSFODNN7EXAMPLE1"));
  CHECK_FALSE(ValueLooksSecret("hf_short"));
  CHECK_FALSE(ValueLooksSecret("train.py"));
  CHECK_FALSE(ValueLooksSecret("sk-learn is a library name"));
}

TEST_CASE("command line: values of secret options are redacted in every form") {
  std::vector<std::string> in = {"python", "train.py", "--hf_token=abc123", "--api-key", "xyz789", "--lr",
                                 "0.1", "trainer.wandb.token=qqq", "-password=p", "--output_dir",
                                 "/ckpt", "--secret", "--next-flag", "hf_abcdefghijklmnopqrstuvwxyz0123",
                                 "--data=s3://user:pa55w0rd@bucket/path", "--plain=value"};
  auto out = RedactCommandLine(in);
  REQUIRE(out.size() == in.size());
  CHECK(out[0] == "python");
  CHECK(out[1] == "train.py");
  CHECK(out[2] == "--hf_token=<redacted>");
  CHECK(out[3] == "--api-key");
  CHECK(out[4] == "<redacted>");
  CHECK(out[5] == "--lr");
  CHECK(out[6] == "0.1");
  CHECK(out[7] == "trainer.wandb.token=<redacted>");
  CHECK(out[8] == "-password=<redacted>");
  CHECK(out[10] == "/ckpt");
  CHECK(out[11] == "--secret");
  CHECK(out[12] == "--next-flag");  // a flag after a valueless secret option is kept
  CHECK(out[13] == "<redacted>");
  CHECK(out[14] == "--data=s3://user:<redacted>@bucket/path");
  CHECK(out[15] == "--plain=value");
  std::string all;
  for (auto& a : out) all += a + " ";
  for (const char* secret : {"abc123", "xyz789", "qqq", "pa55w0rd", "hf_abcdef"})
    CHECK(all.find(secret) == std::string::npos);
}

TEST_CASE("environment: only documented variables, secret values redacted") {
  setenv("NCCLWATCH_TEST_SECRET_TOKEN", "tok-value-1", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("PMI_FD", "7", 1);          // PMI_* beyond PMI_RANK/PMI_SIZE is not documented
  setenv("HF_TOKEN", "hf-value", 1);  // not a documented variable at all
  setenv("PMI_RANK", "3", 1);
  auto env = RelevantEnvironment();
  std::map<std::string, std::string> m(env.begin(), env.end());
  CHECK(m["NCCL_DEBUG"] == "INFO");
  CHECK(m["PMI_RANK"] == "3");
  CHECK(m["NCCLWATCH_TEST_SECRET_TOKEN"] == "<redacted>");
  CHECK(m.count("PMI_FD") == 0);
  CHECK(m.count("HF_TOKEN") == 0);
  for (const char* v : {"NCCLWATCH_TEST_SECRET_TOKEN", "NCCL_DEBUG", "PMI_FD", "HF_TOKEN", "PMI_RANK"}) unsetenv(v);
}

TEST_CASE("secrets inside arguments: URLs, user:password@host, query strings, JSON, --x:v") {
  const std::string tok = "ghp_0123456789abcdefghij0123";
  std::vector<std::pair<std::string, std::string>> cases = {
      {"https://" + tok + "@github.com/o/r.git", "https://<redacted>@github.com/o/r.git"},
      {"s3://user:pa/ss#w0rd@bucket/path", "s3://user:<redacted>@bucket/path"},
      {"redis://Zk3q9XbT4mR8vN2pL7wY@cache:6379/0", "redis://<redacted>@cache:6379/0"},
      {"--token:s3cr3tvalue", "--token:<redacted>"},
      {"https://h/api?user=me&access_token=V123&x=1", "https://h/api?user=me&access_token=<redacted>&x=1"},
      {"{\"hf_token\":\"V123\",\"lr\":0.1}", "{\"hf_token\":\"<redacted>\",\"lr\":0.1}"},
      {"--cfg={'api_key': 'V123', 'n': 2}", "--cfg={'api_key': '<redacted>', 'n': 2}"},
      {"u:pw@host:22", "u:<redacted>@host:22"},
      {"--remote=git:Pa55@host:/srv/repo", "--remote=git:<redacted>@host:/srv/repo"},
      {"Authorization: Bearer " + tok, "Authorization: Bearer <redacted>"},
  };
  std::vector<std::string> in = {"python"};
  for (auto& c : cases) in.push_back(c.first);
  auto out = RedactCommandLine(in);
  REQUIRE(out.size() == in.size());
  for (size_t i = 0; i < cases.size(); ++i) CHECK(out[i + 1] == cases[i].second);
}

TEST_CASE("ordinary arguments are not redacted") {
  std::vector<std::string> in = {"python",
                                 "/data/run-2024/ckpt_0001/model.safetensors",
                                 "localhost:29500",
                                 "--master=10.0.0.1:29500",
                                 "user@example.com",
                                 "git@github.com:org/repo.git",
                                 "ssh://git@github.com/org/repo.git",
                                 "https://github.com/org/repo/tree/main@v1.2",
                                 "http://host:8080/path@x",
                                 "postgres://alice@db.internal:5432/app",
                                 "nvcr.io/nvidia/pytorch:24.01-py3@sha256:0123456789abcdef",
                                 "https://example.com/search?q=tokens&page=2",
                                 "{\"lr\": 0.1, \"tokenizer_path\": \"/m\"}",
                                 "--tokenizer=/m/tok.json",
                                 "--sk-learn",
                                 "a=b"};
  CHECK(RedactCommandLine(in) == in);
}

// How fast (linear: a 1.6 MB argument in about half a second) is a benchmark's question; here,
// that a long argument full of separators is scanned to its end.
TEST_CASE("a long argument with many separators is redacted to its end") {
  std::string big;
  for (int i = 0; i < 200000; ++i) big += "a=1,\"b\":";
  auto out = RedactCommandLine({"python", big, "https://h/x?" + big + "&token=V"});
  CHECK(out[1] == big);
  CHECK(out[2].substr(out[2].size() - 17) == "&token=<redacted>");
}
