// Prices (issue #44, "Money"): a device-hour's price, in whichever currency the operator uses for
// every price and budget of one cluster (ftune only adds and compares them; the docs and ftctl
// write "$"). Set per worker (ft-worker --price) or per pool (ftd --pool-price); a team's budget is
// in the same unit.
#pragma once

#include <cmath>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ft {

// The largest price per device-hour accepted: far above any device's, so a typo (a price in cents
// given as dollars is still below it) is the operator's to see in the costs, not refused.
inline constexpr double kMaxPricePerDeviceHour = 1e6;

// OK for a finite price in [0, kMaxPricePerDeviceHour]; InvalidArgument naming `field` otherwise.
inline Status CheckPrice(double price, std::string_view field) {
  if (std::isfinite(price) && price >= 0 && price <= kMaxPricePerDeviceHour) return Status::OK();
  return Status::InvalidArgument(std::string(field) +
                                 ": a price per device-hour must be a number from 0 to 1000000, e.g. 2.49");
}

}  // namespace ft
