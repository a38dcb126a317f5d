// ftd's submit path against hostile or careless paths (issue #28): config.json
// that is a FIFO or /dev/zero is refused at once without stalling other RPCs;
// output.dir empty, a file or inside ftd's data dir, and a missing data file
// are refused at submit naming the key; the allowed roots travel to the
// attempt so the trainer can confine its opens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>

#include "daemon/daemon.h"
#include "engine/io/hf_model.h"
#include "tests/daemon/tiny_job.h"
#include "tests/support/temp_dir.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using ::testing::HasSubstr;

class FakeSink : public WorkerSink {
 public:
  void Send(const pb::DaemonCommand& cmd) override { commands.push_back(cmd); }
  std::vector<pb::DaemonCommand> commands;
};

class PathsTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::FreshDir(testing::UnitTest::GetInstance()->current_test_info()->name());
    testing_support::WriteTinyJobDir(dir_);
    if (HasFatalFailure()) return;
    auto store = Store::Open(dir_ + "/ftd.sqlite");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    DaemonOptions o;
    o.data_dir = dir_ + "/data";
    o.allowed_roots = {dir_};
    daemon_ = std::make_unique<Daemon>(std::move(*store), &clock_, o);
  }
  StatusOr<pb::SubmitReply> Submit(const std::string& model = "model", const std::string& out = "out",
                                   const std::string& train = "data.jsonl",
                                   const std::string& data_extra = "") {
    pb::SubmitRequest req;
    req.set_spec_yaml("name: t\nmodel: {path: " + model +
                      ", dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
                      "data: {train: " +
                      train + ", format: tokens, seq_len: 64" + data_extra +
                      "}\n"
                      "train: {max_steps: 10, global_batch_size: 4}\noutput: {dir: " +
                      out + "}\n");
    req.set_spec_dir(dir_ + "/job");
    return daemon_->Submit(req);
  }
  // A submit on another thread that must answer within 20 s; a FIFO it blocks on is then opened for
  // writing (so the read ends) and the test fails.
  std::future<StatusOr<pb::SubmitReply>> SubmitAsync(const std::string& model) {
    return std::async(std::launch::async, [this, model] { return Submit(model); });
  }
  StatusOr<pb::SubmitReply> Await(std::future<StatusOr<pb::SubmitReply>>& f, const std::string& fifo) {
    if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "the submit blocked reading " << fifo;
      std::ofstream unblock(fifo);
    }
    return f.get();
  }
  // The start command ftd sends to a worker that registers with room for the job.
  pb::DaemonCommand StartOnAWorker() {
    FakeSink w1;
    pb::Register reg;
    reg.set_worker_id("w1");
    pb::Device* d = reg.add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(int64_t{8} << 30);
    d->set_free_bytes(int64_t{8} << 30);
    EXPECT_TRUE(daemon_->OnRegister(reg, &w1).ok());
    daemon_->Tick();
    for (const auto& c : w1.commands) {
      if (c.has_start()) return c;
    }
    ADD_FAILURE() << "no start command";
    return {};
  }
  std::string ModelWithConfig(const std::string& name) {
    const std::string m = dir_ + "/job/" + name;
    fs::copy(dir_ + "/job/model", m, fs::copy_options::recursive);
    fs::remove(m + "/config.json");
    return m;
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(PathsTest, SubmitWithFifoConfigJsonIsRefusedAtOnceAndOtherRpcsKeepWorking) {
  const std::string a = ModelWithConfig("fifo-a"), b = ModelWithConfig("fifo-b");
  ASSERT_EQ(::mkfifo((a + "/config.json").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((b + "/config.json").c_str(), 0600), 0);
  auto first = SubmitAsync("fifo-a");
  auto second = SubmitAsync("fifo-b");
  auto r1 = Await(first, a + "/config.json");
  auto r2 = Await(second, b + "/config.json");
  ASSERT_TRUE(r1.status().IsInvalidArgument()) << r1.status().ToString();
  EXPECT_THAT(r1.status().message(), HasSubstr(a + "/config.json: is a FIFO, not a regular file"));
  EXPECT_TRUE(r2.status().IsInvalidArgument()) << r2.status().ToString();
  auto ok = Submit();
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(daemon_->GetJob(ok->job().id()).ok());
}

TEST_F(PathsTest, SubmitWithConfigJsonSymlinkedToDevZeroIsRefusedAtOnce) {
  const std::string m = ModelWithConfig("zero");
  fs::create_symlink("/dev/zero", m + "/config.json");
  auto f = SubmitAsync("zero");
  auto r = Await(f, m + "/config.json");
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(m + "/config.json: is a character device, not a regular file"));
}

TEST_F(PathsTest, SubmitWithEmptyOutputDirIsRefusedNamingTheKey) {
  auto r = Submit("model", "\"\"");
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("job.yaml: output.dir: is empty"));
}

TEST_F(PathsTest, SubmitWithOutputDirThatIsAFileIsRefused) {
  auto r = Submit("model", "data.jsonl");
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(),
              HasSubstr("output.dir: '" + dir_ + "/job/data.jsonl' exists and is not a directory"));
}

TEST_F(PathsTest, SubmitWithOutputDirInsideFtdsDataDirIsRefused) {
  for (const std::string& out : {dir_ + "/data", dir_ + "/data/logs/x", dir_}) {
    auto r = Submit("model", out);
    ASSERT_TRUE(r.status().IsInvalidArgument()) << out << ": " << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr("overlaps ftd's data dir " + dir_ + "/data"));
  }
}

TEST_F(PathsTest, SubmitWithMissingDataFileIsRefusedInsteadOfRetriedForever) {
  auto r = Submit("model", "out", "missing.jsonl");
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(),
              HasSubstr("data.train: '" + dir_ + "/job/missing.jsonl' does not exist; fix the path"));
}

// A list of sources: each one's file is checked at submit, and each reaches the worker absolute.
TEST_F(PathsTest, EverySourceOfAMixtureIsCheckedAtSubmitAndReachesTheWorkerAbsolute) {
  auto missing = Submit("model", "out", "[{path: data.jsonl, weight: 2}, {path: gone.jsonl, weight: 1}]");
  ASSERT_TRUE(missing.status().IsInvalidArgument()) << missing.status().ToString();
  EXPECT_THAT(missing.status().message(),
              HasSubstr("data.train[1].path: '" + dir_ + "/job/gone.jsonl' does not exist; fix the path"));
  auto bad = Submit("model", "out", "[{path: data.jsonl, weight: 2, fields: {txt: body}}]");
  ASSERT_TRUE(bad.status().IsInvalidArgument()) << bad.status().ToString();
  EXPECT_THAT(bad.status().message(), HasSubstr("data.train[0].fields.txt: is not a key of format tokens"));
  auto job = Submit("model", "out", "[{path: data.jsonl, weight: 2}, {path: data.jsonl, weight: 1}]");
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const pb::DaemonCommand start = StartOnAWorker();
  EXPECT_THAT(start.start().spec_yaml(), HasSubstr("{path: " + dir_ + "/job/data.jsonl, weight: 1}"));
}

TEST_F(PathsTest, StartCommandCarriesTheAllowedRootsToTheTrainer) {
  auto job = Submit();
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const pb::DaemonCommand start = StartOnAWorker();
  ASSERT_EQ(start.start().allowed_roots_size(), 1);
  EXPECT_EQ(start.start().allowed_roots(0), dir_);
}

TEST_F(PathsTest, ARelativeChatTemplateReachesTheWorkerAsAnAbsolutePath) {
  // The worker runs ft-train on a job file of its own elsewhere: a path left relative to job.yaml's
  // folder would name another file, or none ("cannot open file").
  std::ofstream(dir_ + "/job/template.jinja") << "{{ messages }}";
  auto job = Submit("model", "out", "data.jsonl", ", chat_template: template.jinja");
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const pb::DaemonCommand start = StartOnAWorker();
  EXPECT_THAT(start.start().spec_yaml(), HasSubstr("chat_template: " + dir_ + "/job/template.jinja"));
}

}  // namespace
}  // namespace ft
