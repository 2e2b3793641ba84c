"""pg_tide's benchmark suite, split by concern: common (cluster helpers), b1..b4 (one
module per benchmark), suite (the runner), report (RESULTS.md and plots). bench/bench.py is
the entry point."""
