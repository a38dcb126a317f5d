// Worker session messages into ftd's core (daemon/daemon.h), on fake time:
// a Register, a scheduling tick (the job may start on the worker), then
// WorkerMessages — heartbeats, checkpoint commits, exits, metrics, logs,
// notes — each followed by a tick, then a disconnect and a lease expiry. The
// input is length-prefixed protobuf: [u16 little-endian length][bytes], the
// first the Register, the rest WorkerMessages; a job_id "J" stands for the
// submitted job's id. Whatever arrives, the daemon answers with commands or
// refusals and its store stays consistent (a fresh daemon per input).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "tests/fuzz/daemon_fixture.h"
#include "tests/fuzz/fuzz.h"

namespace {

namespace pb = ftune::v1;
using google::protobuf::FieldDescriptor;

class Sink : public ft::WorkerSink {
 public:
  void Send(const pb::DaemonCommand& cmd) override { last = cmd; }
  pb::DaemonCommand last;
};

// Sets every string field named job_id that holds "J" (at any depth) to `id`.
void BindJobIds(google::protobuf::Message* m, const std::string& id) {
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && f->name() == "job_id") {
      if (f->is_repeated()) continue;
      if (r->GetString(*m, f) == "J") r->SetString(m, f, id);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k) BindJobIds(r->MutableRepeatedMessage(m, f, k), id);
      } else if (r->HasField(*m, f)) {
        BindJobIds(r->MutableMessage(m, f), id);
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
  BindJobIds(&reg, f->job_id);
  Sink sink;
  if (!f->daemon->OnRegister(reg, &sink).ok()) return 0;
  f->daemon->Tick();
  for (int n = 0; n < 64 && Next(&in, &record); ++n) {
    pb::WorkerMessage msg;
    if (!msg.ParseFromArray(record.data(), static_cast<int>(record.size()))) continue;
    BindJobIds(&msg, f->job_id);
    f->daemon->OnWorkerMessage(reg.worker_id(), &sink, msg);
    f->clock.Advance(250);
    f->daemon->Tick();
  }
  f->daemon->OnDisconnect(reg.worker_id(), &sink);
  f->clock.Advance(f->daemon->options().lease_ms + 1);
  f->daemon->Tick();
  (void)f->daemon->GetJob(f->job_id);
  return 0;
}
