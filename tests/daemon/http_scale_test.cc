// The dashboard at scale: 1,000 jobs (100 running, each with 200 metric
// points) and 100 workers with 2 devices each, served by a real server.
// Measures GET /api/jobs (the whole list with sparklines) and GET
// /api/workers, prints the figures, and holds them to the page-load target
// (the jobs page must load in < 1 s).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "daemon/daemon.h"
#include "daemon/http_api.h"
#include "daemon/http_server.h"
#include "tests/daemon/http_test_util.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

constexpr int kJobs = 1000, kRunning = 100, kPointsPerJob = 200, kWorkers = 100;

struct Timing {
  double median_ms = 0, max_ms = 0;
  size_t bytes = 0;
};

Timing Measure(int port, const std::string& target, int runs) {
  std::vector<double> ms;
  Timing t;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    http_test::Reply r = http_test::Fetch(port, "GET", target);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    EXPECT_EQ(r.status, 200) << target << ": " << r.body.substr(0, 300);
    t.bytes = r.body.size();
  }
  std::sort(ms.begin(), ms.end());
  t.median_ms = ms[ms.size() / 2];
  t.max_ms = ms.back();
  return t;
}

TEST(HttpScaleTest, JobsAndWorkersPagesStayFastAtAThousandJobs) {
  // tmpfs when there is one: seeding fsyncs thousands of times; reads come from the page cache either way.
  const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::path(testing::TempDir());
  const std::string dir = (base / ("ftune-http-scale-" + std::to_string(getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto opened = Store::Open(dir + "/ftd.sqlite");
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  const auto seed_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kJobs; ++i) {
    JobRow j;
    j.name = "job-" + std::to_string(i);
    j.spec_yaml = "name: " + j.name + "\n";
    j.total_steps = kPointsPerJob * 2;
    auto created = store.CreateJob(j, nullptr);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    if (i % (kJobs / kRunning) != 0) continue;
    ASSERT_TRUE(store.StartAttempt(created->id, "w" + std::to_string(i % kWorkers), 0, 2, 2, 1, 1).ok());
    std::vector<MetricRow> rows;
    for (int s = 1; s <= kPointsPerJob; ++s) {
      rows.push_back(
          {created->id, 1, s, 3.0 / s, 1e-4, 1.0, 1000.0, int64_t{1} << 30, 1'700'000'000'000 + s});
    }
    ASSERT_TRUE(store.AddMetrics(rows).ok());
    created->state = JobStateCode::kRunning;
    created->steps_done = kPointsPerJob;
    ASSERT_TRUE(store.UpdateJob(*created).ok());
  }
  for (int w = 0; w < kWorkers; ++w) {
    WorkerRow row{.id = "w" + std::to_string(w), .hostname = "node-" + std::to_string(w), .version = "test"};
    for (int d = 0; d < 2; ++d) {
      row.devices.push_back({d, "cuda", "H100", int64_t{80} << 30, int64_t{40} << 30, int64_t{40} << 30});
    }
    ASSERT_TRUE(store.UpsertWorker(row).ok());
  }
  const double seed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - seed_start).count();

  SystemClock clock;
  DaemonOptions options;
  options.data_dir = dir + "/data";
  Daemon daemon(std::move(*opened), &clock, options);
  HttpApi api(&daemon, {});
  auto server = HttpServer::Start(&daemon, &api, {.address = "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();

  http_test::Reply check = http_test::Fetch(port, "GET", "/api/jobs");
  ASSERT_EQ(check.status, 200);
  auto jobs = nlohmann::json::parse(check.body);
  ASSERT_EQ(jobs["jobs"].size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(jobs["counts"]["running"], kRunning);
  size_t with_spark = 0;
  for (const auto& j : jobs["jobs"]) {
    if (!j["loss_spark"].empty()) {
      ++with_spark;
      EXPECT_EQ(j["loss_spark"].size(), static_cast<size_t>(HttpApi::kSparkPoints / 2));  // half-way through
    }
  }
  EXPECT_EQ(with_spark, static_cast<size_t>(kRunning));
  // A page is the newest jobs, read in SQL (not the whole table filtered in memory).
  auto newest = nlohmann::json::parse(http_test::Fetch(port, "GET", "/api/jobs?limit=50").body);
  ASSERT_EQ(newest["jobs"].size(), 50u);
  EXPECT_EQ(newest["jobs"][0]["name"], "job-" + std::to_string(kJobs - 1));
  EXPECT_EQ(newest["jobs"][49]["name"], "job-" + std::to_string(kJobs - 50));
  EXPECT_EQ(newest["counts"]["running"], kRunning);
  auto found = nlohmann::json::parse(http_test::Fetch(port, "GET", "/api/jobs?q=JOB-99&limit=50").body);
  ASSERT_EQ(found["jobs"].size(), 11u);  // job-99 and job-990 .. job-999
  EXPECT_EQ(found["jobs"][0]["name"], "job-999");

  const Timing list = Measure(port, "/api/jobs", 7);
  const Timing running = Measure(port, "/api/jobs?state=running&limit=50", 7);
  const Timing page = Measure(port, "/api/jobs?limit=50", 7);
  const Timing search = Measure(port, "/api/jobs?q=JOB-99&limit=50", 7);
  const Timing workers = Measure(port, "/api/workers", 7);
  const Timing detail = Measure(port, "/api/jobs/j-000001", 7);
  std::printf("seeded %d jobs (%d running x %d metric points) and %d workers in %.1f s\n", kJobs, kRunning,
              kPointsPerJob, kWorkers, seed_s);
  std::printf("GET /api/jobs                     median %7.1f ms  max %7.1f ms  %zu bytes\n", list.median_ms,
              list.max_ms, list.bytes);
  std::printf("GET /api/jobs?state=running&limit=50  median %7.1f ms  max %7.1f ms  %zu bytes\n",
              running.median_ms, running.max_ms, running.bytes);
  std::printf("GET /api/jobs?limit=50             median %7.1f ms  max %7.1f ms  %zu bytes\n", page.median_ms,
              page.max_ms, page.bytes);
  std::printf("GET /api/jobs?q=JOB-99&limit=50    median %7.1f ms  max %7.1f ms  %zu bytes\n",
              search.median_ms, search.max_ms, search.bytes);
  std::printf("GET /api/workers                  median %7.1f ms  max %7.1f ms  %zu bytes\n",
              workers.median_ms, workers.max_ms, workers.bytes);
  std::printf("GET /api/jobs/j-000001            median %7.1f ms  max %7.1f ms  %zu bytes\n",
              detail.median_ms, detail.max_ms, detail.bytes);
  // Both lists load in under a second, in the normal tree (the sanitizer trees build the daemon at -O0).
#if !defined(FT_SANITIZED)
  EXPECT_LT(list.median_ms + workers.median_ms, 1000.0);
#endif
  (*server)->Stop();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ft
