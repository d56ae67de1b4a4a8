"""Server benchmarks (Spec-Bench, greedy losslessness) and the kernel sweep."""
