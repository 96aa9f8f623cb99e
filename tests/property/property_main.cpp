// The property tests' runner: Catch2 with rapidcheck (Debian's librapidcheck-dev, for tests only). RC_PARAMS sets
// rapidcheck's options, e.g. RC_PARAMS="max_success=2000 seed=42" to search longer or replay a failure.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
