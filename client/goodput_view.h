// How ulyssesctl shows a job's goodput (v1::Goodput; docs/COORDINATOR.md "Goodput"): the
// `goodput` object of the JSON views, the describe line and the `top` cell.
#ifndef ULYSSES_CLIENT_GOODPUT_VIEW_H_
#define ULYSSES_CLIENT_GOODPUT_VIEW_H_

#include <string>

#include "nlohmann/json.hpp"
#include "ulysses/v1/types.pb.h"

namespace ulysses::client {

// {"ratio", "allocated_gpu_seconds", "productive_gpu_seconds", "uncommitted_gpu_seconds",
//  "lost_gpu_seconds": {"failure", "preemption", "restart", "checkpoint_stall", "cancelled"}}.
nlohmann::json GoodputJson(const ulysses::v1::Goodput& g);
// "82.4% of 1500.0 GPU-s productive; lost: failure 100.0, preemption 0.0, restart 20.0,
// checkpoint_stall 5.0, cancelled 0.0; uncommitted 140.5" ("-" before any allocation).
std::string GoodputText(const ulysses::v1::Goodput& g);
// "82.4%" ("-" before any allocation).
std::string GoodputCell(const ulysses::v1::Goodput& g);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_GOODPUT_VIEW_H_
