// ftctl: the command line users drive ftune with.
//
//   ftctl submit job.yaml [--set k=v] [--follow]   validate locally (file:line errors), queue, optionally
//   follow ftctl ls | status ID | logs ID [-f] | cancel ID | workers | events [ID] ftctl up embedded mode:
//   ftd + one local worker, state under the data dir
//   ftctl admin user add NAME --team T [--role member|viewer|admin] | remove NAME | token NAME | ls
//   ftctl admin team set NAME [--quota N] [--weight W] [--max-queued N] [--budget AMOUNT|none] | ls
//   ftctl admin webhook add URL --events K,K [--team T | --user U] [--secret S] | ls | remove ID
//   (an admin's token: users in teams, docs/OPERATIONS.md)
//
// Address and token: --addr/--token, else FTUNE_ADDR/FTUNE_TOKEN, else
// ~/.config/ftune/client.yaml, else 127.0.0.1:7070. `--json` prints the raw
// API objects. Exit codes: 0 ok; 1 the daemon failed or is unreachable; 2 bad
// input; 3 a followed job ended FAILED or CANCELLED.
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "cli/client.h"
#include "cli/embedded.h"
#include "common/untrusted_text.h"
#include "engine/job/job_spec.h"
#include "engine/job/planner.h"
#include "proto/names.h"

namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

constexpr int kOk = 0, kFailed = 1, kBadInput = 2, kJobNotSucceeded = 3;

int Fail(const ft::Status& s) {
  // A refused token names gRPC's code itself (UNAUTHENTICATED): no "InvalidArgument: " before it.
  std::fprintf(stderr, "ftctl: %s\n", ft::RefusedToken(s) ? s.message().c_str() : s.ToString().c_str());
  return s.IsInvalidArgument() ? kBadInput : kFailed;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

// Names, reasons, worker ids and messages come from job files and workers:
// printed with terminal control characters escaped (common/untrusted_text.h).
std::string Safe(const std::string& text) { return ft::EscapeControlChars(text); }

bool Ended(pb::JobState s) { return s == pb::SUCCEEDED || s == pb::FAILED || s == pb::CANCELLED; }

std::string RandomId() {
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

std::string FormatEta(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "ETA -";
  const long long s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "ETA %lldh%02lldm", s / 3600, (s % 3600) / 60);
  } else {
    std::snprintf(buf, sizeof(buf), "ETA %lldm%02llds", s / 60, s % 60);
  }
  return buf;
}

// Steps per second from the metric points seen, smoothed.
struct Rate {
  int64_t last_step = -1;
  std::chrono::steady_clock::time_point last_time;
  double steps_per_s = 0;
  void Observe(int64_t step) {
    const auto now = std::chrono::steady_clock::now();
    if (last_step >= 0 && step > last_step) {
      const double dt = std::chrono::duration<double>(now - last_time).count();
      const double r = dt > 0 ? static_cast<double>(step - last_step) / dt : 0;
      steps_per_s = steps_per_s == 0 ? r : 0.8 * steps_per_s + 0.2 * r;
    }
    last_step = step;
    last_time = now;
  }
};

void PrintProgress(const pb::Job& j, int64_t step, double loss, double tokens_per_s, double steps_per_s,
                   bool tty) {
  const int width = 30;
  const int64_t total = j.total_steps();
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(step) / static_cast<double>(total)) : 0;
  const int filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar += std::string(width - filled, '.');
  const double eta = steps_per_s > 0 ? static_cast<double>(total - step) / steps_per_s : -1;
  std::printf("%s%s [%s] step %lld/%lld  loss %.4f  %.0f tok/s  %s  %s", tty ? "\r\033[K" : "",
              Safe(j.id()).c_str(), bar.c_str(), static_cast<long long>(step), static_cast<long long>(total),
              loss, tokens_per_s, FormatEta(eta).c_str(), ft::JobStateName(j.state()).c_str());
  if (!tty) std::printf("\n");
  std::fflush(stdout);
}

int Follow(ft::JobsClient& client, const std::string& id) {
  const bool tty = isatty(1);
  pb::JobState final_state = pb::JOB_STATE_UNSPECIFIED;
  pb::Job job;
  auto first = client.Get(id);
  if (first.ok()) job = *first;
  Rate rate;
  int64_t step = job.steps_done();
  double loss = job.last_loss(), tps = job.tokens_per_s();
  auto last_print = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  // Off a terminal (logs, pipes): one progress line per tenth of the run.
  int64_t last_tenth = -1;
  auto print_if_due = [&] {
    const int64_t tenth = job.total_steps() > 0 ? step * 10 / job.total_steps() : 0;
    const auto now = std::chrono::steady_clock::now();
    if (tty ? now - last_print > std::chrono::milliseconds(200) : tenth != last_tenth) {
      PrintProgress(job, step, loss, tps, rate.steps_per_s, tty);
      last_print = now;
      last_tenth = tenth;
    }
  };
  ft::Status s = client.Watch(id, 0, [&](const pb::JobUpdate& u) {
    if (u.has_event()) {
      std::printf("%s[%s] %s\n", tty ? "\r\033[K" : "", Safe(u.event().kind()).c_str(),
                  Safe(u.event().message()).c_str());
    } else if (u.has_metric()) {
      if (u.metric().eval_only()) return true;  // an evaluation of a step already shown
      step = u.metric().step();
      loss = u.metric().loss();
      tps = u.metric().tokens_per_s();
      rate.Observe(step);
      print_if_due();  // at most a few redraws a second
      return true;
    } else if (u.has_job()) {
      job = u.job();
      if (Ended(job.state())) {
        PrintProgress(job, std::max(step, job.steps_done()), loss, tps, 0, tty);
        final_state = job.state();
        return false;
      }
    }
    if (tty) PrintProgress(job, step, loss, tps, rate.steps_per_s, tty);  // redraw below the event line
    return true;
  });
  if (tty) std::printf("\n");
  if (!s.ok()) return Fail(s);
  auto done = client.Get(id);
  if (done.ok()) {
    std::printf("%s %s; outputs in %s\n", Safe(id).c_str(), ft::JobStateName(done->state()).c_str(),
                Safe(done->output_dir()).c_str());
    final_state = done->state();
  }
  return final_state == pb::SUCCEEDED ? kOk : kJobNotSucceeded;
}

int Submit(ft::JobsClient& client, const std::string& file, const std::vector<std::string>& overrides,
           bool follow, std::string request_id, bool json) {
  const std::string abs = fs::absolute(file).lexically_normal().string();
  // file:line (or --set) errors before anything is sent (a file over the size limit unread, overrides
  // bounded before they are applied); ftd stores the merged job.
  auto job = ft::LoadJobWithOverrides(abs, overrides);
  if (!job.ok()) return Fail(job.status());
  pb::SubmitRequest req;
  req.set_spec_yaml(job->yaml);
  req.set_spec_dir(fs::path(abs).parent_path().string());
  req.set_client_request_id(request_id.empty() ? RandomId() : request_id);
  auto reply = client.Submit(req);
  if (!reply.ok()) return Fail(reply.status());
  if (json) {
    std::printf("%s\n", Json(*reply).c_str());
  } else {
    std::printf("%s%s\n", Safe(reply->job().id()).c_str(), reply->duplicate() ? " (already submitted)" : "");
  }
  return follow ? Follow(client, reply->job().id()) : kOk;
}

// The ranks of a multi-rank job's newest attempt, each with its device's
// memory as its worker last reported it.
void PrintRanks(ft::JobsClient& client, const pb::Job& j) {
  if (j.attempts().empty() || j.attempts().rbegin()->ranks().empty()) return;
  const pb::Attempt& a = *j.attempts().rbegin();
  auto workers = client.Workers();
  std::printf("ranks of attempt #%lld\n", static_cast<long long>(a.number()));
  for (const pb::AttemptRank& r : a.ranks()) {
    std::string memory = "memory not reported";
    if (workers.ok()) {
      for (const pb::WorkerInfo& w : workers->workers()) {
        if (w.id() != r.worker_id()) continue;
        for (const pb::Device& d : w.devices()) {
          if (d.index() != r.device_index()) continue;
          memory = Safe(d.kind()) + ":" + std::to_string(d.index()) + " " + ft::FormatBytes(d.used_bytes()) +
                   " used of " + ft::FormatBytes(d.total_bytes());
        }
      }
    }
    std::printf("  rank %d on %-12s %s\n", r.rank(), Safe(r.worker_id()).c_str(), memory.c_str());
  }
}

// The newest step's objective metrics (DPO: TRL's rewards and log-probabilities), one line per
// name prefix ("rewards   margins 0.8, accuracies 0.75, chosen 0.3, rejected -0.5"): margins and
// accuracies first, then by name. Nothing for a job without them (SFT).
void PrintObjective(const pb::Job& j) {
  static const std::vector<std::string> kFirst = {"margins", "accuracies", "chosen", "rejected"};
  const auto rank = [&](const std::string& name) {
    return std::find(kFirst.begin(), kFirst.end(), name) - kFirst.begin();
  };
  std::map<std::string, std::vector<std::pair<std::string, double>>> groups;  // prefix → (name, value)
  for (const auto& [name, value] : j.objective_metrics()) {
    const size_t slash = name.find('/');
    groups[name.substr(0, slash)].emplace_back(slash == std::string::npos ? "" : name.substr(slash + 1),
                                               value);
  }
  for (auto& [prefix, entries] : groups) {
    std::sort(entries.begin(), entries.end(), [&](const auto& a, const auto& b) {
      return std::make_pair(rank(a.first), a.first) < std::make_pair(rank(b.first), b.first);
    });
    std::string line;
    for (const auto& [name, value] : entries) {
      char number[32];
      std::snprintf(number, sizeof(number), "%.4f", value);
      line += (line.empty() ? "" : ", ") + Safe(name) + (name.empty() ? "" : " ") + number;
    }
    std::printf("%-9s %s\n", Safe(prefix).c_str(), line.c_str());
  }
}

// An amount of money as ftctl prints it: two decimals.
std::string FormatAmount(double amount) {
  char text[48];
  std::snprintf(text, sizeof text, "%.2f", amount);
  return text;
}

// ", $1.23 at $2.00/device-h" for a priced attempt ("" otherwise).
std::string AttemptCost(const pb::Attempt& a) {
  if (a.price() <= 0) return "";
  char text[64];
  std::snprintf(text, sizeof text, ", $%.2f at $%.2f/device-h", a.cost().total(), a.price());
  return text;
}

// Where the job's device time went (daemon/goodput.h), and its recoveries.
void PrintGoodput(const pb::Goodput& g) {
  const pb::GoodputSplit& d = g.device();
  std::printf(
      "goodput   %.1f%% of %.1f device-s: productive %.1f, lost %.1f, checkpoint %.1f, restart %.1f; "
      "queued %.1f s\n",
      100 * g.goodput(), d.productive_s() + d.lost_s() + d.checkpoint_s() + d.restart_s(), d.productive_s(),
      d.lost_s(), d.checkpoint_s(), d.restart_s(), g.queue_s());
  const pb::CostSplit& c = g.cost();
  if (c.total() > 0) {
    std::printf(
        "cost      $%.2f: productive $%.2f, lost $%.2f, overhead $%.2f (checkpoint $%.2f, restart $%.2f)\n",
        c.total(), c.productive(), c.lost(), c.checkpoint() + c.restart(), c.checkpoint(), c.restart());
  }
  if (g.notices() > 0) {
    std::printf("notices   %lld, caught %lld (their checkpoint made it: no step lost)\n",
                static_cast<long long>(g.notices()), static_cast<long long>(g.notices_caught()));
  }
  if (g.recovery_s().empty()) return;
  std::vector<double> r(g.recovery_s().begin(), g.recovery_s().end());
  std::sort(r.begin(), r.end());
  std::printf("recovery  %zu preemptions: p50 %.1f s, max %.1f s (loss known → next first step)\n", r.size(),
              r[(r.size() - 1) / 2], r.back());
}

int Status(ft::JobsClient& client, const std::string& id, bool json) {
  auto j = client.Get(id);
  if (!j.ok()) return Fail(j.status());
  if (json) {
    std::printf("%s\n", Json(*j).c_str());
    return kOk;
  }
  std::printf("%s %s  %s\nstate     %s%s\nprogress  step %lld/%lld (committed %lld), loss %.4f\n",
              Safe(j->id()).c_str(), Safe(j->name()).c_str(), Safe(j->output_dir()).c_str(),
              ft::JobStateName(j->state()).c_str(),
              j->reason().empty() ? "" : ("  (" + Safe(j->reason()) + ")").c_str(),
              static_cast<long long>(j->steps_done()), static_cast<long long>(j->total_steps()),
              static_cast<long long>(j->committed_step()), j->last_loss());
  std::printf("submitted by %s, team %s\n", j->submitted_by().empty() ? "-" : Safe(j->submitted_by()).c_str(),
              j->team().empty() ? "-" : Safe(j->team()).c_str());
  PrintObjective(*j);
  std::printf("attempts  %d, preemptions %lld (%lld by the scheduler), failures %lld\n", j->attempts_size(),
              static_cast<long long>(j->preemptions()),
              static_cast<long long>(j->goodput().scheduler_preemptions()),
              static_cast<long long>(j->failures()));
  PrintGoodput(j->goodput());
  for (const pb::Attempt& a : j->attempts()) {
    const pb::GoodputSplit& g = a.goodput();
    std::printf(
        "  #%lld epoch %lld on %-12s %-10s steps %lld..%lld lost %lld (%.1f s), overhead %.1f s "
        "(restart %.1f, checkpoint %.1f)%s  %s\n",
        static_cast<long long>(a.number()), static_cast<long long>(a.epoch()), Safe(a.worker_id()).c_str(),
        ft::AttemptOutcomeName(a.outcome()).c_str(), static_cast<long long>(a.start_step()),
        static_cast<long long>(a.end_step()), static_cast<long long>(a.steps_lost()), g.lost_s(),
        g.restart_s() + g.checkpoint_s(), g.restart_s(), g.checkpoint_s(), AttemptCost(a).c_str(),
        Safe(a.reason()).c_str());
  }
  PrintRanks(client, *j);
  return kOk;
}

// `s` made safe to print, or "-" when empty.
std::string Dash(const std::string& s) { return s.empty() ? "-" : Safe(s); }

int List(ft::JobsClient& client, bool json) {
  pb::ListJobsRequest req;
  req.set_with_goodput(true);
  auto r = client.List(req);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  std::printf("%-10s %-10s %-12s %-12s %8s %6s %10s %7s %9s  %s\n", "ID", "STATE", "USER", "TEAM", "PRIORITY",
              "STEP", "LOSS", "GOODPUT", "COST", "NAME / REASON");
  for (const pb::Job& j : r->jobs()) {
    const pb::GoodputSplit& d = j.goodput().device();
    char goodput[16] = "      -";  // no device time yet
    if (d.productive_s() + d.lost_s() + d.checkpoint_s() + d.restart_s() > 0) {
      std::snprintf(goodput, sizeof(goodput), "%6.1f%%", 100 * j.goodput().goodput());
    }
    char cost[24] = "-";  // not priced
    if (j.goodput().cost().total() > 0)
      std::snprintf(cost, sizeof(cost), "$%.2f", j.goodput().cost().total());
    std::printf("%-10s %-10s %-12s %-12s %8lld %6lld %10.4f %7s %9s  %s%s\n", Safe(j.id()).c_str(),
                ft::JobStateName(j.state()).c_str(), Dash(j.submitted_by()).c_str(), Dash(j.team()).c_str(),
                static_cast<long long>(j.priority()), static_cast<long long>(j.steps_done()), j.last_loss(),
                goodput, cost, Safe(j.name()).c_str(),
                j.reason().empty() ? "" : (" — " + Safe(j.reason())).c_str());
  }
  return kOk;
}

int Workers(ft::JobsClient& client, bool json) {
  auto r = client.Workers();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  for (const pb::WorkerInfo& w : r->workers()) {
    const pb::GoodputSplit& g = w.goodput();
    const double device = g.productive_s() + g.checkpoint_s() + g.restart_s() + g.lost_s();
    const std::string goodput =
        device > 0 ? std::to_string(static_cast<int>(100 * g.productive_s() / device + 0.5)) + "%" : "-";
    char price[32] = "-";
    if (w.price() > 0) std::snprintf(price, sizeof(price), "$%.2f/device-h", w.price());
    std::printf("%-16s %-5s pool %-12s job %-10s slot %s  goodput %s  price %s\n", Safe(w.id()).c_str(),
                w.alive() ? "alive" : "LOST", Safe(w.pool()).c_str(),
                w.running_job_id().empty() ? "-" : Safe(w.running_job_id()).c_str(),
                w.slot_end_ms() ? (std::to_string(w.slot_end_ms()) + " ms").c_str() : "-", goodput.c_str(),
                price);
    for (const pb::Device& d : w.devices()) {
      const double used =
          d.total_bytes() > 0 ? 1.0 - static_cast<double>(d.free_bytes()) / d.total_bytes() : 0;
      const int filled = static_cast<int>(used * 20);
      std::printf("   %s:%d %-30s [%s%s] %s free of %s\n", Safe(d.kind()).c_str(), d.index(),
                  Safe(d.name()).c_str(), std::string(filled, '#').c_str(),
                  std::string(20 - filled, '.').c_str(), ft::FormatBytes(d.free_bytes()).c_str(),
                  ft::FormatBytes(d.total_bytes()).c_str());
    }
    if (w.host_total_bytes() > 0) {  // what the memory techniques (cpu_offload, paged_adamw) draw on
      std::printf("   host memory %s free of %s\n", ft::FormatBytes(w.host_free_bytes()).c_str(),
                  ft::FormatBytes(w.host_total_bytes()).c_str());
    }
  }
  return kOk;
}

int Events(ft::JobsClient& client, const std::string& id, bool json) {
  auto r = client.Events(id, 0);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  for (const pb::Event& e : r->events()) {
    std::printf("%6lld %-10s %-14s %s\n", static_cast<long long>(e.seq()), Safe(e.job_id()).c_str(),
                Safe(e.kind()).c_str(), Safe(e.message()).c_str());
  }
  return kOk;
}

// ftctl admin user add|remove|token|ls (admin only); ftctl admin team set (admin only) | ls.
struct AdminArgs {
  CLI::App* add = nullptr;
  CLI::App* remove = nullptr;
  CLI::App* token = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* team_set = nullptr;
  CLI::App* team_ls = nullptr;
  std::string name, team, role = "member";
  std::optional<int64_t> quota;
  std::optional<double> weight;
  std::optional<int64_t> max_queued;
  std::string budget;  // an amount, or "none"
};

void AddAdminCommands(CLI::App& app, AdminArgs* a) {
  auto* admin = app.add_subcommand("admin", "ftd's users and teams (changes need an admin's token)");
  admin->require_subcommand(1);
  auto* user = admin->add_subcommand("user", "users in teams, their roles and tokens");
  user->require_subcommand(1);
  a->add = user->add_subcommand("add", "add a user; prints its token once");
  a->add->add_option("name", a->name)->required();
  a->add->add_option("--team", a->team, "the user's team")->required();
  a->add->add_option("--role", a->role, "admin | member | viewer (default member)");
  a->remove = user->add_subcommand("remove", "remove a user; its token stops working at once");
  a->remove->add_option("name", a->name)->required();
  a->token =
      user->add_subcommand("token", "give a user a new token (printed once); the old one stops working");
  a->token->add_option("name", a->name)->required();
  a->ls = user->add_subcommand("ls", "list users (never their tokens)");
  auto* team = admin->add_subcommand("team", "teams' quotas and fair-share weights, and their usage");
  team->require_subcommand(1);
  a->team_set = team->add_subcommand("set", "set a team's quota and weight (unset ones are kept)");
  a->team_set->add_option("name", a->name)->required();
  a->team_set->add_option("--quota", a->quota, "devices its jobs run on at once without borrowing; -1: none");
  a->team_set->add_option("--weight", a->weight, "its fair-share weight (> 0; default 1)");
  a->team_set->add_option("--max-queued", a->max_queued,
                          "jobs its users may have queued at once (a submit past it is refused); -1: no cap");
  a->team_set->add_option("--budget", a->budget,
                          "what its jobs may cost in all, in the prices' currency (none: no budget); once "
                          "its spend reaches it, its users' submits are refused");
  a->team_ls =
      team->add_subcommand("ls", "every team: quota, weight, devices running and borrowed, queue, usage");
}

int Teams(ft::JobsClient& client, const AdminArgs& a, bool json) {
  if (*a.team_set) {
    pb::SetTeamRequest req;
    req.set_name(a.name);
    if (a.quota) req.set_quota_devices(*a.quota);
    if (a.weight) req.set_weight(*a.weight);
    if (a.max_queued) req.set_max_queued(*a.max_queued);
    if (!a.budget.empty()) {
      char* end = nullptr;
      const double budget = a.budget == "none" ? -1.0 : std::strtod(a.budget.c_str(), &end);
      if (a.budget != "none" && (end == a.budget.c_str() || *end != '\0' || budget < 0)) {
        return Fail(ft::Status::InvalidArgument("--budget '" + a.budget +
                                                "': expected an amount (e.g. 5000) or none"));
      }
      req.set_budget(budget);
    }
    auto r = client.SetTeam(req);
    if (!r.ok()) return Fail(r.status());
    if (json) {
      std::printf("%s\n", Json(*r).c_str());
      return kOk;
    }
    std::printf("team %s: quota %s, weight %g, budget %s\n", Safe(r->name()).c_str(),
                r->quota_devices() < 0 ? "none" : std::to_string(r->quota_devices()).c_str(), r->weight(),
                r->has_budget() ? ("$" + FormatAmount(r->budget())).c_str() : "none");
    return kOk;
  }
  auto r = client.ListTeams();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  std::printf("%-20s %6s %7s %8s %9s %7s %14s %6s %12s %12s\n", "TEAM", "QUOTA", "WEIGHT", "RUNNING",
              "BORROWED", "QUEUED", "DEVICE-HOURS", "SHARE", "SPEND", "BUDGET");
  for (const pb::Team& t : r->teams()) {
    const std::string budget = t.has_budget() ? "$" + FormatAmount(t.budget()) : "-";
    std::printf("%-20s %6s %7g %8lld %9lld %7lld %14.2f %5.0f%% %12s %12s\n",
                t.name().empty() ? "(none)" : Safe(t.name()).c_str(),
                t.quota_devices() < 0 ? "-" : std::to_string(t.quota_devices()).c_str(), t.weight(),
                static_cast<long long>(t.running_devices()), static_cast<long long>(t.borrowed_devices()),
                static_cast<long long>(t.queued_jobs()), t.usage_device_seconds() / 3600,
                100 * t.fair_share(), ("$" + FormatAmount(t.spend())).c_str(), budget.c_str());
  }
  return kOk;
}

int PrintToken(const ft::StatusOr<pb::UserTokenReply>& r, bool json) {
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  std::printf("user %s (%s of team %s); its token (shown once, keep it secret):\n%s\n",
              Safe(r->user().name()).c_str(), Safe(r->user().role()).c_str(), Safe(r->user().team()).c_str(),
              r->token().c_str());
  return kOk;
}

int Admin(ft::JobsClient& client, const AdminArgs& a, bool json) {
  if (*a.add) return PrintToken(client.AddUser(a.name, a.team, a.role), json);
  if (*a.token) return PrintToken(client.RotateUserToken(a.name), json);
  if (*a.remove) {
    auto r = client.RemoveUser(a.name);
    if (!r.ok()) return Fail(r.status());
    std::printf("removed user %s\n", Safe(r->name()).c_str());
    return kOk;
  }
  auto r = client.ListUsers();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  std::printf("%-20s %-20s %s\n", "USER", "TEAM", "ROLE");
  for (const pb::User& u : r->users()) {
    std::printf("%-20s %-20s %s\n", Safe(u.name()).c_str(), Safe(u.team()).c_str(), Safe(u.role()).c_str());
  }
  return kOk;
}

// ftctl admin webhook add URL --events K,K [--team T | --user U] [--secret S] | ls | remove ID (admin only).
struct WebhookArgs {
  CLI::App* add = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* remove = nullptr;
  std::string url, team, user, secret, id;
  std::vector<std::string> events;
  bool parsed() const { return add->parsed() || ls->parsed() || remove->parsed(); }
};

void AddWebhookCommands(CLI::App& admin, WebhookArgs* w) {
  auto* hook = admin.add_subcommand("webhook", "where ftd posts job events a person needs (signed JSON)");
  hook->require_subcommand(1);
  w->add = hook->add_subcommand("add", "add a webhook; prints its id and, when ftd made it, its secret once");
  w->add->add_option("url", w->url, "http:// or https:// URL the events are posted to")->required();
  w->add->add_option("--events", w->events, "comma-separated: succeeded,failed,preempted,cancelled,stalled")
      ->required()
      ->delimiter(',');
  w->add->add_option("--team", w->team, "only this team's jobs (default: every job)");
  w->add->add_option("--user", w->user, "only the jobs this user submits");
  w->add->add_option("--secret", w->secret,
                     "the signing key (16-256 characters; default: ftd makes one and prints it once)");
  w->ls = hook->add_subcommand("ls", "list webhooks and their pending deliveries (never their secrets)");
  w->remove = hook->add_subcommand("remove", "remove a webhook; its pending deliveries are dropped");
  w->remove->add_option("id", w->id)->required();
}

int PrintWebhookAdded(const ft::StatusOr<pb::AddWebhookReply>& r, bool secret_given, bool json) {
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  std::printf("webhook %s added\n", Safe(r->webhook().id()).c_str());
  if (!secret_given) {
    std::printf("its signing secret (shown once; receivers check X-Ftune-Signature with it):\n%s\n",
                r->secret().c_str());
  }
  return kOk;
}

int Webhooks(ft::JobsClient& client, const WebhookArgs& w, bool json) {
  if (w.add->parsed()) {
    pb::AddWebhookRequest req;
    req.set_url(w.url);
    for (const std::string& kind : w.events) req.add_events(kind);
    req.set_team(w.team);
    req.set_user(w.user);
    req.set_secret(w.secret);
    return PrintWebhookAdded(client.AddWebhook(req), !w.secret.empty(), json);
  }
  if (w.remove->parsed()) {
    auto r = client.RemoveWebhook(w.id);
    if (!r.ok()) return Fail(r.status());
    std::printf("removed webhook %s\n", Safe(r->id()).c_str());
    return kOk;
  }
  auto r = client.ListWebhooks();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  std::printf("%-12s %-36s %-16s %7s  %s\n", "ID", "EVENTS", "SCOPE", "PENDING", "URL");
  for (const pb::Webhook& h : r->webhooks()) {
    std::string events;
    for (const std::string& e : h.events()) events += (events.empty() ? "" : ",") + e;
    const std::string scope = !h.team().empty()   ? "team " + h.team()
                              : !h.user().empty() ? "user " + h.user()
                                                  : "every job";
    std::printf("%-12s %-36s %-16s %7lld  %s\n", Safe(h.id()).c_str(), Safe(events).c_str(),
                Safe(scope).c_str(), static_cast<long long>(h.pending_deliveries()), Safe(h.url()).c_str());
  }
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ftctl: submit and watch ftune jobs"};
  app.require_subcommand(1);
  ft::ClientOptions options;
  bool json = false;
  app.add_option("--addr", options.address, "ftd address host:port (env FTUNE_ADDR)");
  app.add_option("--token", options.token, "bearer token (env FTUNE_TOKEN)");
  app.add_option("--tls-ca", options.tls_ca,
                 "use TLS, trusting this PEM CA bundle ('system': the system's roots; env FTUNE_TLS_CA)");
  app.add_flag("--json", json, "print API objects as JSON");

  auto* submit = app.add_subcommand("submit", "validate and queue a job");
  std::string job_file, request_id;
  bool follow = false;
  submit->add_option("job", job_file, "job.yaml")->required();
  submit->add_flag("--follow,-f", follow, "show live progress until the job ends");
  std::vector<std::string> overrides;
  submit->add_option(
      "--set", overrides,
      "override a job.yaml key, e.g. --set train.lr=1e-4 --set data.seq_len=1024 (repeatable)");
  submit->add_option("--request-id", request_id, "idempotency key (default: random)");
  auto* ls = app.add_subcommand("ls", "list jobs");
  auto* status = app.add_subcommand("status", "a job's state and attempt history");
  std::string id;
  status->add_option("id", id)->required();
  auto* logs = app.add_subcommand("logs", "a job's trainer output");
  bool logs_follow = false;
  logs->add_option("id", id)->required();
  logs->add_flag("-f,--follow", logs_follow, "keep following");
  auto* cancel = app.add_subcommand("cancel", "cancel a job (checkpointing first)");
  cancel->add_option("id", id)->required();
  auto* workers = app.add_subcommand("workers", "workers, devices and memory");
  auto* events = app.add_subcommand("events", "the event log");
  events->add_option("id", id, "only this job");
  auto* watch = app.add_subcommand("watch", "follow a job until it ends");
  watch->add_option("id", id)->required();
  auto* up = app.add_subcommand("up", "embedded mode: ftd and a local worker");
  std::string data_dir =
      std::string(std::getenv("HOME") ? std::getenv("HOME") : "/tmp") + "/.local/share/ftune";
  std::string listen = "127.0.0.1:7070", http = "127.0.0.1:7071", cpu_memory;
  up->add_option("--data-dir", data_dir, "where ftd keeps its database and logs");
  up->add_option("--listen", listen, "gRPC address for ftd (port 0 = any free port)");
  up->add_option("--http", http, "dashboard address (port 0 = any free port; \"\" = off)");
  up->add_option("--cpu-memory", cpu_memory, "memory the local worker offers");
  AdminArgs admin;
  AddAdminCommands(app, &admin);
  WebhookArgs webhook;
  AddWebhookCommands(*app.get_subcommand("admin"), &webhook);
  CLI11_PARSE(app, argc, argv);

  if (*up) return ft::RunEmbedded({data_dir, listen, http, cpu_memory});
  auto resolved = ft::ResolveClientOptions(options);
  if (!resolved.ok()) return Fail(resolved.status());
  ft::JobsClient client(*resolved);
  if (*submit) return Submit(client, job_file, overrides, follow, request_id, json);
  if (*ls) return List(client, json);
  if (*status) return Status(client, id, json);
  if (*watch) return Follow(client, id);
  if (*logs) {
    ft::Status s = client.Logs(id, logs_follow,
                               [](const std::string& t) { std::fwrite(t.data(), 1, t.size(), stdout); });
    return s.ok() ? kOk : Fail(s);
  }
  if (*cancel) {
    auto j = client.Cancel(id);
    if (!j.ok()) return Fail(j.status());
    std::printf("%s %s\n", Safe(j->id()).c_str(), ft::JobStateName(j->state()).c_str());
    return kOk;
  }
  if (*workers) return Workers(client, json);
  if (*events) return Events(client, id, json);
  if (admin.team_set->parsed() || admin.team_ls->parsed()) return Teams(client, admin, json);
  if (webhook.parsed()) return Webhooks(client, webhook, json);
  if (admin.add->parsed() || admin.remove->parsed() || admin.token->parsed() || admin.ls->parsed()) {
    return Admin(client, admin, json);
  }
  return kBadInput;
}
