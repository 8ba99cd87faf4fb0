// Compiled remotely by tests/it/peers/compile.rs through the original yadcc
// daemons, and locally by g++: the two objects must be byte-identical.
// VARIANT makes each concurrent compilation a different task.
#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#ifndef VARIANT
#define VARIANT 0
#endif

namespace {

template <typename T>
T collatz_steps(T n) {
  T steps = 0;
  while (n != 1) {
    n = (n % 2 == 0) ? n / 2 : 3 * n + 1;
    ++steps;
  }
  return steps;
}

std::map<std::string, int> tally(const std::vector<std::string>& words) {
  std::map<std::string, int> counts;
  for (const auto& word : words) ++counts[word];
  return counts;
}

}  // namespace

int main() {
  std::vector<unsigned long> steps(64 + VARIANT);
  std::iota(steps.begin(), steps.end(), 1UL);
  std::transform(steps.begin(), steps.end(), steps.begin(), collatz_steps<unsigned long>);
  const auto longest = *std::max_element(steps.begin(), steps.end());
  const auto counts = tally({"remote", "local", "remote", "identical", "remote"});
  std::printf("longest %lu, remote %d, variant %d\n", longest, counts.at("remote"), VARIANT);
  return counts.at("remote") == 3 ? 0 : 1;
}
