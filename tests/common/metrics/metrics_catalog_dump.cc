// Prints the metrics catalogue (common/metrics/catalog.h) as JSON on stdout, so
// tests/deploy/check_deploy.py checks docs/METRICS.md, the dashboard and the alert rules
// against what the binaries register rather than against a copy.
#include <iostream>

#include "common/metrics/catalog.h"

int main() {
  std::cout << ulysses::metrics::CatalogJson() << "\n";
  return 0;
}
