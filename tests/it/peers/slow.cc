// A compilation that takes seconds (the compiler evaluates SPIN rounds of a
// xorshift generator), so that tests/it/peers/life.rs sees it running on the
// servant daemon while the delegate daemon asks for the running tasks.
#include <cstdint>

constexpr std::uint64_t spin(std::uint64_t rounds) {
  std::uint64_t x = 88172645463325252ULL;
  for (std::uint64_t i = 0; i < rounds; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  return x;
}

constexpr std::uint64_t kValue = spin(SPIN);

int main() { return static_cast<int>(kValue & 1); }
