// Must NOT compile: a compile-time gamma outside [0, 1] is rejected by a static_assert.
#include <dropit/policy.hpp>

int main() { return static_cast<int>(dropit::Random<-0.5>{}.kept(10)); }
