// The lower-case names of the wire enums, as users read them (ftctl, the
// JSON API, the dashboard, Prometheus labels), and their inverse.
#pragma once

#include <string>

#include "proto/ftune.pb.h"

namespace ft {

// "queued" | "running" | "preempted" | "succeeded" | "failed" | "cancelled" ("unknown" otherwise).
std::string JobStateName(ftune::v1::JobState state);
// The inverse, e.g. for a `state` query parameter; false for an unknown name.
bool ParseJobStateName(const std::string& name, ftune::v1::JobState* state);
// "running" | "finished" | "preempted" | "failed" | "cancelled" | "superseded" |
// "environment" ("unknown" otherwise).
std::string AttemptOutcomeName(ftune::v1::AttemptOutcome outcome);

}  // namespace ft
