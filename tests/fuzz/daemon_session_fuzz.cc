// Worker session messages into ftd's core (daemon/daemon.h), on fake time:
// a Register, a scheduling tick (the job may start on the worker), then
// WorkerMessages — heartbeats, checkpoint commits, exits, metrics, logs,
// notes — each followed by a tick, then a disconnect and a lease expiry. A
// WorkerMessage holding a register registers another worker (a new session;
// the same id too) and the messages after it come from that one: forged
// reports about the first worker's attempt. The input is length-prefixed
// protobuf: [u16 little-endian length][bytes], the first the Register, the
// rest WorkerMessages. Placeholders: a job_id "J" stands for the submitted
// job's id, a credential "C" for the attempt credential ftd handed out (any
// other credential is a wrong one), a dir starting "O/" for a path in the
// job's output.dir ("O/../x" leads out of it). Whatever arrives, the daemon
// answers with commands or refusals and its store stays consistent (a fresh
// daemon per input).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <deque>
#include <tuple>
#include <utility>

#include "tests/fuzz/daemon_fixture.h"
#include "tests/fuzz/fuzz.h"

namespace {

namespace pb = ftune::v1;
using google::protobuf::FieldDescriptor;

// What the placeholders stand for.
struct Bindings {
  std::string job_id;      // "J"
  std::string credential;  // "C": the newest StartAttempt's
  std::string output_dir;  // "O/..."
};

class Sink : public ft::WorkerSink {
 public:
  explicit Sink(Bindings* bindings) : bindings_(bindings) {}
  void Send(const pb::DaemonCommand& cmd) override {
    last = cmd;
    if (cmd.has_start()) bindings_->credential = cmd.start().credential();
  }
  pb::DaemonCommand last;

 private:
  Bindings* bindings_;
};

// Replaces the placeholders (at any depth) of `m`'s string fields named job_id, credential and dir.
void Bind(google::protobuf::Message* m, const Bindings& b) {
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !f->is_repeated()) {
      const std::string v = r->GetString(*m, f);
      if (f->name() == "job_id" && v == "J") r->SetString(m, f, b.job_id);
      if (f->name() == "credential" && v == "C") r->SetString(m, f, b.credential);
      if (f->name() == "dir" && v.rfind("O/", 0) == 0) r->SetString(m, f, b.output_dir + v.substr(1));
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k) Bind(r->MutableRepeatedMessage(m, f, k), b);
      } else if (r->HasField(*m, f)) {
        Bind(r->MutableMessage(m, f), b);
      }
    }
  }
}

// The next [u16 length][bytes] record of `in`, or false at the end.
bool Next(std::string_view* in, std::string_view* record) {
  if (in->size() < 2) return false;
  const size_t n =
      static_cast<uint8_t>((*in)[0]) | (static_cast<size_t>(static_cast<uint8_t>((*in)[1])) << 8);
  in->remove_prefix(2);
  *record = in->substr(0, n);
  in->remove_prefix(record->size());
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = ft::fuzz::AsText(data, size);
  std::string_view record;
  if (!Next(&in, &record)) return 0;
  pb::Register reg;
  if (!reg.ParseFromArray(record.data(), static_cast<int>(record.size()))) return 0;
  auto f = ft::fuzz::MakeDaemon("session");
  Bindings bindings{f->job_id, "", ""};
  if (auto job = f->daemon->GetJob(f->job_id); job.ok()) bindings.output_dir = job->output_dir();
  Bind(&reg, bindings);
  std::deque<std::pair<std::string, Sink>> sessions;  // every worker registered, by arrival
  sessions.emplace_back(std::piecewise_construct, std::forward_as_tuple(reg.worker_id()),
                        std::forward_as_tuple(&bindings));
  if (!f->daemon->OnRegister(reg, &sessions.back().second).ok()) return 0;
  f->daemon->Tick();
  auto* from = &sessions.back();  // who sends the next message
  for (int n = 0; n < 64 && Next(&in, &record); ++n) {
    pb::WorkerMessage msg;
    if (!msg.ParseFromArray(record.data(), static_cast<int>(record.size()))) continue;
    Bind(&msg, bindings);
    if (msg.has_register_()) {  // another worker (or the same id again) registers and speaks next
      sessions.emplace_back(std::piecewise_construct, std::forward_as_tuple(msg.register_().worker_id()),
                            std::forward_as_tuple(&bindings));
      if (f->daemon->OnRegister(msg.register_(), &sessions.back().second).ok()) from = &sessions.back();
    } else {
      f->daemon->OnWorkerMessage(from->first, &from->second, msg);
    }
    f->clock.Advance(250);
    f->daemon->Tick();
  }
  for (auto& [id, sink] : sessions) f->daemon->OnDisconnect(id, &sink);
  f->clock.Advance(f->daemon->options().lease_ms + 1);
  f->daemon->Tick();
  (void)f->daemon->GetJob(f->job_id);
  return 0;
}
