// job.yaml → JobSpec: any bytes parse to a spec or to an error naming the
// file, line and key (engine/train/job_spec.h).
#include "engine/train/job_spec.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ft::ParseJobSpec(std::string(ft::fuzz::AsText(data, size)), "fuzz/job.yaml");
  return 0;
}
