// Catch2's runner (main and the framework's implementation), compiled once per build tree into memsim_catch_main
// and linked by every test binary: compiling it costs about as much as a large test file, and it used to be
// compiled in five of them. The benchmark binary keeps its own (CATCH_CONFIG_ENABLE_BENCHMARKING changes Catch2's
// interfaces, so it must not be mixed with this one).
// The property tests' runner is this one too: RC_PARAMS sets rapidcheck's options, e.g.
// RC_PARAMS="max_success=2000 seed=42" to search longer or replay a failure.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
