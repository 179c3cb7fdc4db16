"""Development tooling, not shipped in the wheel: the embedded models (`make demo`, the tests), the prompt sets, the
benchmarks' shared helpers and the reference decoder the tests check the engine against. Nothing the plugin runs
imports it."""
