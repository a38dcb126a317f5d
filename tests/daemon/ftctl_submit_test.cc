// ftctl submit parses the job locally: a job no trainer can run, or a job
// file or --set built to exhaust memory, is refused with the file's line or
// the flag before anything is sent (no ftd needed: the address below has no
// server, so a job that passed would fail to connect). Against a real ftd: a
// refused client token is named as such, and every submit ftd acknowledged
// survives its -wal being deleted and a kill -9 (issue #41).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "engine/job/hf_config.h"
#include "engine/model/model_config.h"
#include "tests/support/process.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::FreshDir;
using testing_support::Proc;
using testing_support::ScopedProc;
using testing_support::Spawn;

// A job ftctl and ftd accept (with a model's config.json and a data file beside it: WriteJobFiles).
constexpr char kJob[] =
    "name: j\nmodel: {path: model}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\n"
    "train: {max_steps: 10, global_batch_size: 4}\noutput: {dir: out}\n";

// <dir>/job.yaml holding kJob, a tiny model's config.json and a data file.
std::string WriteJobFiles(const std::string& dir) {
  fs::create_directories(dir + "/model");
  std::ofstream(dir + "/model/config.json") << HfConfigJson(*PresetModelConfig("tiny-llama"));
  std::ofstream(dir + "/data.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
  std::ofstream(dir + "/job.yaml") << kJob;
  return dir + "/job.yaml";
}

// ftctl with `args` (tests/support/process.h's SpawnFtctl).
Proc Ftctl(const std::string& dir, const std::string& address, const std::vector<std::string>& args,
           const std::string& name) {
  return testing_support::SpawnFtctl(FTCTL_BIN, dir, address, args, name);
}

// Runs `ftctl submit <dir>/job.yaml` holding `yaml` against an address nothing listens on.
Proc Submit(const std::string& dir, const std::string& yaml) {
  std::ofstream(dir + "/job.yaml") << yaml;
  return Spawn({FTCTL_BIN, "--addr", "127.0.0.1:1", "submit", dir + "/job.yaml"},
               {.log = dir + "/ftctl.log", .truncate_log = true});
}

// A full fine-tune of NF4 weights used to reach ftd (and, before ftd refused
// it, a trainer); ftctl refuses it itself, naming the file, line and column.
TEST(FtctlSubmitTest, FullFineTuneOfNf4WeightsIsRefusedLocallyWithFileLine) {
  const std::string dir = FreshDir("ftctl-submit-nf4-full");
  Proc refused = Submit(dir,
                        "model:\n  path: model\n  quantization: nf4\nadapter:\n  type: full\n"
                        "data:\n  train: d.jsonl\ntrain:\n  max_steps: 1\noutput:\n  dir: o\n");
  EXPECT_NE(refused.Wait(), 0);
  EXPECT_THAT(refused.Log(), HasSubstr(dir + "/job.yaml:3:17: model.quantization: nf4 freezes the base "
                                             "weights, so it needs adapter.type: lora (QLoRA)"));
  // The same job with LoRA passes the local checks and fails only to reach the (absent) ftd.
  Proc sent = Submit(dir,
                     "model:\n  path: model\n  quantization: nf4\nadapter:\n  type: lora\n"
                     "data:\n  train: d.jsonl\ntrain:\n  max_steps: 1\noutput:\n  dir: o\n");
  EXPECT_NE(sent.Wait(), 0);
  EXPECT_THAT(sent.Log(), Not(HasSubstr("job.yaml:"))) << sent.Log();
}

// Acting on evaluations needs them: train.early_stopping (and checkpoint.keep_best) without an
// evaluation set, or output.adapter_from: best without keep_best, is refused by ftctl itself with
// the file, line and column and the fix (issue #45).
TEST(FtctlSubmitTest, EarlyStoppingWithoutAnEvaluationSetIsRefusedLocallyWithFileLine) {
  const std::string dir = FreshDir("ftctl-submit-early-stopping");
  Proc refused = Submit(dir,
                        "model:\n  path: model\ndata:\n  train: d.jsonl\ntrain:\n  max_steps: 9\n"
                        "  early_stopping: {patience: 2}\noutput:\n  dir: o\n");
  EXPECT_NE(refused.Wait(), 0);
  EXPECT_THAT(refused.Log(), HasSubstr(dir + "/job.yaml:7:19: train.early_stopping: needs an evaluation set: "
                                             "set data.eval (a held-out file) or data.val_fraction"));
  Proc best =
      Submit(dir,
             "model:\n  path: model\ndata:\n  train: d.jsonl\n  eval: e.jsonl\ntrain:\n  max_steps: 9\n"
             "output:\n  dir: o\n  adapter_from: best\n");
  EXPECT_NE(best.Wait(), 0);
  EXPECT_THAT(best.Log(), HasSubstr(dir + "/job.yaml:10:17: output.adapter_from: best is the checkpoint "
                                          "checkpoint.keep_best keeps; set checkpoint.keep_best: true"));
}

// A job.yaml that is not a job's description but a memory bomb: a deep --set
// key (ftctl built a 400 MB YAML from one before its size check), a value
// nested thousands deep, a file over the size limit. Each is refused before
// anything is built, naming the flag or the file, the limit and the fix.
TEST(FtctlSubmitTest, ADeepSetOverrideIsRefusedBeforeBuilding) {
  const std::string dir = FreshDir("ftctl-submit-deep-set");
  const std::string job = WriteJobFiles(dir);
  std::string deep_key;
  for (int i = 0; i < 50'000; ++i) deep_key += "a.";
  Proc key = Ftctl(dir, "127.0.0.1:1", {"submit", job, "--set", deep_key + "b=1"}, "key");
  EXPECT_EQ(key.Wait(), 2) << key.Log();
  EXPECT_THAT(key.Log(), HasSubstr("--set a.a.a.a."));
  EXPECT_THAT(key.Log(), HasSubstr("the key has 50001 parts"));
  EXPECT_THAT(key.Log(), HasSubstr("at most 8 parts and 256 bytes: name a key of the job"));
  Proc value =
      Ftctl(dir, "127.0.0.1:1", {"submit", job, "--set", "name=" + std::string(20'000, '[')}, "value");
  EXPECT_EQ(value.Wait(), 2) << value.Log();
  EXPECT_THAT(value.Log(), HasSubstr("--set name=[[[["));
  EXPECT_THAT(value.Log(), HasSubstr("nested more than 32 deep; at most 32 levels are accepted: flatten it"));
  std::ofstream(dir + "/huge.yaml") << kJob << "# " << std::string(300 << 10, 'x') << "\n";
  Proc huge = Ftctl(dir, "127.0.0.1:1", {"submit", dir + "/huge.yaml"}, "huge");
  EXPECT_EQ(huge.Wait(), 2) << huge.Log();
  EXPECT_THAT(huge.Log(), HasSubstr(dir + "/huge.yaml: " + std::to_string(fs::file_size(dir + "/huge.yaml")) +
                                    " bytes; a job.yaml may have at most 256 KiB"));
}

// ---------------------------------------------------------------- against a real ftd

// Waits until `p`'s log holds `needle` (true), or it exits, or 30 s pass.
bool WaitForLog(Proc& p, const std::string& needle) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (p.Log().find(needle) != std::string::npos) return true;
    if (!p.Alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return p.Log().find(needle) != std::string::npos;
}

// ftd on a loopback port of its own with `extra` flags, its output in `log`.
Proc StartFtd(const std::string& data_dir, const std::string& log, std::vector<std::string> extra) {
  std::vector<std::string> argv = {FTD_BIN, "--listen", "127.0.0.1:0", "--data-dir", data_dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Spawn(argv, {.log = log, .truncate_log = true});
}

// What a started ftd printed after `prefix` up to the next blank ("" when not there).
std::string Printed(const Proc& ftd, const std::string& prefix) {
  std::smatch m;
  const std::string log = ftd.Log();
  return std::regex_search(log, m, std::regex(prefix + "(\\S+)")) ? m[1].str() : "";
}

// GET http://127.0.0.1:<port><path>: the status line's code and the body (-1 when no answer).
std::pair<int, std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (reply.rfind("HTTP/1.1 ", 0) != 0) return {-1, reply};
  const size_t body = reply.find("\r\n\r\n");
  return {std::atoi(reply.c_str() + 9), body == std::string::npos ? "" : reply.substr(body + 4)};
}

// Issue #5 of the hostile probe: a client without the token (or with a wrong one) was told
// "InvalidArgument: not authorised". ftctl names gRPC's UNAUTHENTICATED and how to pass a token.
TEST(FtctlSubmitTest, FtctlNamesUnauthenticated) {
  const std::string dir = FreshDir("ftctl-unauthenticated");
  ScopedProc ftd(StartFtd(dir + "/data", dir + "/ftd.log",
                          {"--http", "", "--client-token", "right", "--worker-token", "w"}));
  ASSERT_TRUE(WaitForLog(ftd.get(), "ftd: listening on")) << ftd->Log();
  const std::string address = Printed(ftd.get(), "listening on ");
  Proc none = Ftctl(dir, address, {"ls"}, "none");
  EXPECT_EQ(none.Wait(), 2) << none.Log();
  EXPECT_THAT(none.Log(),
              HasSubstr("ftctl: ftd at " + address +
                        " wants the client token (gRPC UNAUTHENTICATED: missing or wrong bearer "
                        "token): pass the token ftd was started with (its --client-token) as "
                        "--token TOKEN, in FTUNE_TOKEN or as 'token:' in ~/.config/ftune/client.yaml"));
  EXPECT_THAT(none.Log(), Not(HasSubstr("InvalidArgument")));
  Proc wrong = Ftctl(dir, address, {"--token", "wrong", "ls"}, "wrong");
  EXPECT_EQ(wrong.Wait(), 2) << wrong.Log();
  EXPECT_THAT(wrong.Log(), HasSubstr(" refused the client token (gRPC UNAUTHENTICATED"));
  Proc right = Ftctl(dir, address, {"--token", "right", "ls"}, "right");
  EXPECT_EQ(right.Wait(), 0) << right.Log();
}

// Issue #41: the database's WAL deleted under ftd (a cleanup script): /ready stayed "ready",
// more submits were acknowledged, and after a kill -9 none of the acknowledged jobs existed.
// Now ftd notices (at /ready, its tick or the next commit), saves what it committed into the
// database file, refuses writes until it has reopened the database, says why; every job it
// acknowledged survives the kill -9, and it accepts work again.
TEST(FtctlSubmitTest, DeletedWalStopsAcknowledgingAndLosesNoAcknowledgedSubmit) {
  const std::string dir = FreshDir("ftctl-deleted-wal"), data = dir + "/data";
  const std::string job = WriteJobFiles(dir + "/job");
  ScopedProc ftd(StartFtd(data, dir + "/ftd.log", {"--http", "127.0.0.1:0"}));
  ASSERT_TRUE(WaitForLog(ftd.get(), "ftd: dashboard at")) << ftd->Log();
  const std::string address = Printed(ftd.get(), "listening on ");
  const int http = std::atoi(Printed(ftd.get(), "dashboard at http://127.0.0.1:").c_str());
  std::vector<std::string> acked;
  auto submit = [&](int i) {
    Proc p = Ftctl(dir, address, {"submit", job, "--set", "output.dir=out-" + std::to_string(i)},
                   "submit-" + std::to_string(i));
    const int rc = p.Wait();
    if (rc == 0) acked.push_back(p.Log().substr(0, p.Log().find('\n')));
    return std::make_pair(rc, p.Log());
  };
  for (int i = 0; i < 3; ++i) ASSERT_EQ(submit(i).first, 0) << "submit " << i;
  ASSERT_EQ(HttpGet(http, "/ready").first, 200);
  ASSERT_TRUE(fs::remove(data + "/ftd.sqlite-wal"));
  // Refused (ftd noticed first) or acknowledged and durable (saved into the database file).
  const auto [rc, log] = submit(3);
  if (rc != 0) {
    EXPECT_THAT(log, HasSubstr("ftd.sqlite-wal was deleted or replaced")) << log;
  }
  const auto [status, body] = HttpGet(http, "/ready");
  if (status != 200) {
    EXPECT_EQ(status, 503) << body;
    EXPECT_THAT(body, HasSubstr("ftd.sqlite-wal was deleted or replaced")) << body;
  }
  ASSERT_TRUE(WaitForLog(ftd.get(), "writable again")) << ftd->Log();
  EXPECT_THAT(ftd->Log(), HasSubstr("[error]"));
  EXPECT_THAT(ftd->Log(),
              HasSubstr("ftd.sqlite-wal was deleted or replaced while ftd had the database open"));
  EXPECT_EQ(HttpGet(http, "/ready").first, 200) << "ready again once reopened";
  ASSERT_EQ(submit(4).first, 0) << "accepts work again";
  EXPECT_TRUE(fs::exists(data + "/ftd.sqlite-wal")) << "a new -wal";
  ftd->Signal(SIGKILL);
  ftd->Wait();
  ScopedProc restarted(StartFtd(data, dir + "/ftd2.log", {"--http", ""}));
  ASSERT_TRUE(WaitForLog(restarted.get(), "ftd: listening on")) << restarted->Log();
  const std::string again = Printed(restarted.get(), "listening on ");
  ASSERT_GE(acked.size(), 4u);
  for (const std::string& id : acked) {
    Proc status_of = Ftctl(dir, again, {"status", id}, "status-" + id);
    EXPECT_EQ(status_of.Wait(), 0) << id << " was acknowledged before the kill -9: " << status_of.Log();
  }
}

}  // namespace
}  // namespace ft
